//! Every statement about `myjob_locks`: the leases `myjob lock` holds on a Galera cluster,
//! where GET_LOCK's named locks would hold on one node only (see migration 5), and elsewhere
//! the markers of named locks held (see migration 9). Each finds its row by the primary key,
//! `name`.
//!
//! Expiry is judged by the clock of the node that asks, against the time the holder's node
//! wrote: the nodes' clocks must agree to within the lease's margin (NTP keeps them within
//! milliseconds; the margin is seconds).

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// Who holds a lease: a random number chosen at each acquisition, which fences every later
/// write, and for people reading the table, the host and pid and the connection.
pub struct Holder<'a> {
    pub token: u64,
    pub held_by: &'a str,
}

/// Takes `name` for `holder` if it is free: no row, or a row not renewed for `lease` by this
/// node's clock. Returns whether `holder` now holds it. Two takers on two nodes may both
/// see it free; the cluster certifies one commit and fails the other with a deadlock error.
pub async fn take(
    conn: &mut Conn,
    name: &str,
    holder: &Holder<'_>,
    lease: Duration,
) -> anyhow::Result<bool> {
    let micros = lease.as_micros() as u64;
    conn.exec_drop(
        "UPDATE myjob_locks SET holder = ?, held_by = ?, owner_conn = CONNECTION_ID(), \
             renewed_at = NOW(6) \
         WHERE name = ? AND renewed_at < NOW(6) - INTERVAL ? MICROSECOND",
        (holder.token, holder.held_by, name, micros),
    )
    .await
    .with_context(|| format!("taking over the expired lease of lock {name}"))?;
    if conn.affected_rows() == 1 {
        return Ok(true);
    }
    conn.exec_drop(
        "INSERT IGNORE INTO myjob_locks (name, holder, held_by, owner_conn, renewed_at) \
         VALUES (?, ?, ?, CONNECTION_ID(), NOW(6))",
        (name, holder.token, holder.held_by),
    )
    .await
    .with_context(|| format!("taking the lease of lock {name}"))?;
    Ok(conn.affected_rows() == 1)
}

/// Renews `name`'s lease for `token`. Returns false when the lease is no longer its own:
/// taken over after it expired, or deleted. The new time is always later than the last, so
/// that a renewal is never an UPDATE that changes nothing.
pub async fn renew(conn: &mut Conn, name: &str, token: u64) -> anyhow::Result<bool> {
    conn.exec_drop(
        "UPDATE myjob_locks \
         SET renewed_at = GREATEST(NOW(6), renewed_at + INTERVAL 1 MICROSECOND) \
         WHERE name = ? AND holder = ?",
        (name, token),
    )
    .await
    .with_context(|| format!("renewing the lease of lock {name}"))?;
    Ok(conn.affected_rows() == 1)
}

/// Gives `name` up, if `token` still holds it.
pub async fn release(conn: &mut Conn, name: &str, token: u64) -> anyhow::Result<()> {
    conn.exec_drop(
        "DELETE FROM myjob_locks WHERE name = ? AND holder = ?",
        (name, token),
    )
    .await
    .with_context(|| format!("releasing the lease of lock {name}"))
}

/// While `holder` holds the named lock `name`: writes its marker, which says how long after
/// losing the lock it may take to stop its command, and returns that of a marker left behind,
/// if any: the last holder lost the lock without releasing it, maybe a moment ago, and its
/// command may still run for that long. Only the holder of the named lock writes the row.
pub async fn mark(
    conn: &mut Conn,
    name: &str,
    holder: &Holder<'_>,
    stop_within: Duration,
) -> anyhow::Result<Option<Duration>> {
    let left: Option<u64> = conn
        .exec_first(
            "SELECT stop_within_ms FROM myjob_locks WHERE name = ?",
            (name,),
        )
        .await
        .with_context(|| format!("reading the marker of lock {name}"))?;
    conn.exec_drop(
        "REPLACE INTO myjob_locks \
             (name, holder, held_by, owner_conn, renewed_at, stop_within_ms) \
         VALUES (?, ?, ?, CONNECTION_ID(), NOW(6), ?)",
        (
            name,
            holder.token,
            holder.held_by,
            stop_within.as_millis() as u64,
        ),
    )
    .await
    .with_context(|| format!("writing the marker of lock {name}"))?;
    Ok(left.map(Duration::from_millis))
}
