//! The statements about concurrency keys (migrations 11, 12, 14 and 15). A job with a
//! `concurrency_key` holds one of its key's `key_limit` slots while it is pending, claimed or a
//! suspect, and waits `blocked` otherwise; the unique index `(slot_queue, slot_key,
//! slot_live)` (the queue, key and slot of a holder, all NULL in any other row) lets no slot
//! have two holders on a server. Admission is one transition, `blocked → pending` into a free
//! slot, made in two places: the hand-off, when a job that held a slot ends, and the gate (see
//! `crate::gate`), for the jobs that arrive blocked and for any hand-off that was missed. Both
//! are races the index referees: the loser changes nothing. Across the nodes of a Galera
//! cluster the slot's row in `myjob_slots` referees, which each admission there writes in its
//! transaction (see [`ANCHOR`] and [`Referee`]).

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use crate::db::{self, Failure, Refusal, ServerId};

use super::in_list;

/// The slot a claimed job holds, which its end hands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlot {
    pub queue: String,
    pub key: Vec<u8>,
    pub slot: u16,
}

/// The hand-off: the first due blocked job of `(queue, key)`, in priority then arrival
/// order, moves to `pending` in `slot`. Served by the blocked index `(queue, blocked_key,
/// priority DESC, id)`: one entry read, however long the key's line. `run_at` skips the rare
/// blocked row whose run_at an UPDATE moved later (the stager turns it `scheduled`). The
/// ORDER BY names the index's whole prefix, constant as queue and key are, so that MariaDB's
/// UPDATE follows the index rather than sort the line.
pub const HAND_OFF: &str = "UPDATE myjob_jobs FORCE INDEX (myjob_jobs_blocked) \
     SET status = 'pending', slot = ? \
     WHERE queue = ? AND blocked_key = ? AND run_at <= NOW(6) \
     ORDER BY queue, blocked_key, priority DESC, id LIMIT 1";

/// The slot's row in `myjob_slots`, written by an admission on a Galera node in its
/// transaction. A node certifies a write by the keys of the rows it changes, and an earlier
/// attempt at NULL slot indexes saw two admissions into one slot through two nodes both
/// commit: this row's primary key is the slot, so two such admissions always share a key,
/// and one of them fails, whatever the secondary indexes give. Its columns change at each
/// admission (`turn` flips whatever was written into it), so the row is written even when it
/// exists: an unchanged row would not be, and would give no key. Served by the primary key.
pub const ANCHOR: &str = "INSERT INTO myjob_slots (queue, concurrency_key, slot) VALUES (?, ?, ?) \
     ON DUPLICATE KEY UPDATE admitted_at = NOW(6), turn = NOT turn";

/// What keeps two admissions into one slot apart, on the server a connection reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Referee {
    /// One server: the slot index's duplicate check, within the admission's own statement.
    #[default]
    Index,
    /// A Galera node: certification, which needs the slot's anchor in the admission's
    /// transaction (see [`ANCHOR`]).
    Certification,
}

impl Referee {
    /// The referee of the server `server` is.
    pub fn of(server: &ServerId) -> Referee {
        match server.galera {
            Some(_) => Referee::Certification,
            None => Referee::Index,
        }
    }
}

/// Admits the next blocked job of `(queue, key)` into `slot`; returns whether one moved. A
/// slot taken meanwhile (1062; Galera's 1213 for the same race on two nodes; a deadlock or a
/// lock wait with another admission) is a race lost to another admission, not an error:
/// nothing changed, and false says so. On one server, one autocommit statement; on a Galera
/// node, the same and then the slot's anchor, in one transaction (see [`ANCHOR`]).
pub async fn hand_off(
    conn: &mut Conn,
    queue: &str,
    key: &[u8],
    slot: u16,
    referee: Referee,
) -> anyhow::Result<bool> {
    let admitted = match referee {
        Referee::Index => conn
            .exec_drop(HAND_OFF, (slot, queue, key))
            .await
            .map(|()| conn.affected_rows() == 1)
            .map_err(anyhow::Error::from),
        Referee::Certification => anchored(conn, queue, key, slot).await,
    };
    match admitted {
        Ok(moved) => Ok(moved),
        Err(e) if lost_race(&e) => Ok(false),
        Err(e) => Err(e.context(format!("admitting a blocked job of queue {queue}"))),
    }
}

/// Whether an admission's error is a race lost to another admission.
fn lost_race(e: &anyhow::Error) -> bool {
    matches!(
        db::classify(e),
        Failure::Refused(Refusal::Duplicate) | Failure::Conflict(_)
    )
}

/// An admission on a Galera node: the job, then the anchor once a job moved (a hand-off that
/// finds no job writes nothing, and every admission takes the two locks in one order), in
/// one transaction. Every way out that does not commit rolls back, so the connection never
/// goes back to its caller inside a transaction; when even the rollback fails, the error
/// says nothing of a lost race, and the caller drops the connection.
async fn anchored(conn: &mut Conn, queue: &str, key: &[u8], slot: u16) -> anyhow::Result<bool> {
    conn.query_drop("BEGIN").await?;
    let written = async {
        conn.exec_drop(HAND_OFF, (slot, queue, key)).await?;
        if conn.affected_rows() != 1 {
            return Ok(false);
        }
        conn.exec_drop(ANCHOR, (queue, key, slot)).await?;
        conn.query_drop("COMMIT").await?;
        Ok::<bool, mysql_async::Error>(true)
    }
    .await;
    if matches!(written, Ok(true)) {
        return Ok(true);
    }
    if let Err(rollback) = conn.query_drop("ROLLBACK").await {
        anyhow::bail!("rolling back an admission: {rollback}");
    }
    written.map_err(anyhow::Error::from)
}

/// Which of `queues` have blocked jobs: one statement, each arm the first entry of one
/// queue's non-NULL range of the blocked index.
pub async fn blocked_queues(conn: &mut Conn, queues: &[&str]) -> anyhow::Result<Vec<String>> {
    if queues.is_empty() {
        return Ok(Vec::new());
    }
    let arm = "(SELECT queue FROM myjob_jobs FORCE INDEX (myjob_jobs_blocked) \
               WHERE queue = ? AND blocked_key IS NOT NULL LIMIT 1)";
    let sql = vec![arm; queues.len()].join(" UNION ALL ");
    let params: Vec<Value> = queues.iter().map(|q| (*q).into()).collect();
    let rows: Vec<Vec<u8>> = conn
        .exec(sql, Params::Positional(params))
        .await
        .context("asking which queues have blocked jobs")?;
    // The column is binary: no name may make the conversion fail.
    Ok(rows
        .into_iter()
        .map(|q| String::from_utf8_lossy(&q).into_owned())
        .collect())
}

/// The keys of `queue`'s blocked jobs after `after` (from the first when None), in key
/// order, read from at most `entries` entries of the blocked index; and whether it read that
/// many (the last key may have more jobs, and more keys may follow). A key with a long line
/// fills a read by itself: the next one starts after it. ORDER BY the key alone: MariaDB
/// sorts the whole range instead of reading the index in order when the ORDER BY names the
/// constant queue before the virtual key.
pub async fn blocked_keys(
    conn: &mut Conn,
    queue: &str,
    after: Option<&[u8]>,
    entries: usize,
) -> anyhow::Result<(Vec<Vec<u8>>, bool)> {
    let rows: Vec<Vec<u8>> = match after {
        None => {
            conn.exec(
                "SELECT blocked_key FROM myjob_jobs FORCE INDEX (myjob_jobs_blocked) \
                 WHERE queue = ? AND blocked_key IS NOT NULL \
                 ORDER BY blocked_key LIMIT ?",
                (queue, entries as u64),
            )
            .await
        }
        Some(key) => {
            conn.exec(
                "SELECT blocked_key FROM myjob_jobs FORCE INDEX (myjob_jobs_blocked) \
                 WHERE queue = ? AND blocked_key > ? \
                 ORDER BY blocked_key LIMIT ?",
                (queue, key, entries as u64),
            )
            .await
        }
    }
    .with_context(|| format!("reading the blocked keys of queue {queue}"))?;
    let full = rows.len() >= entries;
    let mut keys = rows;
    keys.dedup();
    Ok((keys, full))
}

/// The slots held now among `keys` of `queue`, as `(key, slot)`. Served by the slot index
/// `(slot_queue, slot_key, slot_live)`, which holds only the jobs that hold a slot: at most
/// `key_limit` entries per key.
pub async fn held_slots(
    conn: &mut Conn,
    queue: &str,
    keys: &[Vec<u8>],
) -> anyhow::Result<Vec<(Vec<u8>, u16)>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (list, values) = in_list(keys);
    let mut params: Vec<Value> = vec![queue.into()];
    params.extend(values);
    conn.exec(
        format!(
            "SELECT slot_key, slot_live FROM myjob_jobs FORCE INDEX (myjob_jobs_slot) \
             WHERE slot_queue = ? AND slot_key IN ({list})"
        ),
        Params::Positional(params),
    )
    .await
    .with_context(|| format!("reading the held slots of queue {queue}"))
}

/// The most anchors one call of [`purge_anchors`] deletes.
const ANCHOR_BATCH: u64 = 1000;

/// How long an anchor is kept after its slot's last admission. It matters only while an
/// admission is in flight: a day keeps it well past any, and a reaper's pass of one batch
/// keeps up with any rate of new keys.
const ANCHOR_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Deletes up to [`ANCHOR_BATCH`] rows of `myjob_slots` not admitted into for
/// [`ANCHOR_AGE`], oldest first; returns how many. Deleting the anchor of a slot held all
/// that time is harmless: the row holds no state, and the next admission writes it again (on
/// Galera, one that races this delete loses, and the gate admits at its next pass). Served by
/// `myjob_slots_age` (MySQL takes no index hint on a one-table DELETE), in an order that is total.
pub async fn purge_anchors(conn: &mut Conn) -> anyhow::Result<u64> {
    conn.exec_drop(
        "DELETE FROM myjob_slots \
         WHERE admitted_at < NOW(6) - INTERVAL ? SECOND \
         ORDER BY admitted_at, queue, concurrency_key, slot LIMIT ?",
        (ANCHOR_AGE.as_secs(), ANCHOR_BATCH),
    )
    .await
    .context("deleting the anchors of slots not admitted into for a day")?;
    Ok(conn.affected_rows())
}
