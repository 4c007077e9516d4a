//! Every statement about `myjob_servers`, and the Galera member list: what the reaper needs
//! to tell whether the server a claim was made through is still there.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::db::ServerId;

/// Stamps `server` as alive now. Served by the primary key.
pub async fn stamp(conn: &mut Conn, server: &ServerId) -> anyhow::Result<()> {
    conn.exec_drop(
        "INSERT INTO myjob_servers (server, heartbeat_at) VALUES (?, NOW(6)) \
         ON DUPLICATE KEY UPDATE heartbeat_at = NOW(6)",
        (server.to_string(),),
    )
    .await
    .context("stamping the server's heartbeat")
}

/// Stamps `server`'s heartbeat unless another connection did within `fresh`: the
/// consumer's share of the heartbeats, a write only when no reaper on the same server keeps
/// it fresh (an UPDATE that changes nothing writes nothing, on Galera no write set). A lookup
/// of the primary key.
pub async fn stamp_unless_fresh(
    conn: &mut Conn,
    server: &str,
    fresh: Duration,
) -> anyhow::Result<()> {
    conn.exec_drop(
        "INSERT INTO myjob_servers (server, heartbeat_at) VALUES (?, NOW(6)) \
         ON DUPLICATE KEY UPDATE heartbeat_at = \
             IF(heartbeat_at < NOW(6) - INTERVAL ? MICROSECOND, NOW(6), heartbeat_at)",
        (server, fresh.as_micros() as u64),
    )
    .await
    .context("stamping the server's heartbeat")
}

/// Every server with a heartbeat, and how long ago it was stamped, by this server's clock. A
/// few rows: a scan of the primary key.
pub async fn heartbeats(conn: &mut Conn) -> anyhow::Result<Vec<(ServerId, Duration)>> {
    let rows: Vec<(String, i64)> = conn
        .query("SELECT server, TIMESTAMPDIFF(MICROSECOND, heartbeat_at, NOW(6)) FROM myjob_servers")
        .await
        .context("reading the servers' heartbeats")?;
    Ok(rows
        .into_iter()
        .filter_map(|(server, age)| {
            let age = Duration::from_micros(age.max(0) as u64);
            Some((ServerId::parse(&server)?, age))
        })
        .collect())
}

/// Forgets servers not heard of for `older_than`: once stale they count as gone whether their
/// row is there or not. A few rows: a scan of the primary key.
pub async fn prune(conn: &mut Conn, older_than: Duration) -> anyhow::Result<()> {
    conn.exec_drop(
        "DELETE FROM myjob_servers WHERE heartbeat_at < NOW(6) - INTERVAL ? MICROSECOND",
        (older_than.as_micros() as u64,),
    )
    .await
    .context("forgetting old servers")
}

/// The member ids of the Galera cluster this node belongs to (its primary component), or
/// `None` when they cannot be read (the account lacks SELECT on the table).
pub async fn galera_members(conn: &mut Conn) -> Option<HashSet<String>> {
    conn.query::<String, _>("SELECT node_uuid FROM mysql.wsrep_cluster_members")
        .await
        .ok()
        .map(|ids| ids.into_iter().collect())
}
