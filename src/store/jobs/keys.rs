//! The statements about concurrency keys (migrations 11 and 12). A job with a
//! `concurrency_key` holds one of its key's `key_limit` slots while it is pending, claimed or a
//! suspect, and waits `blocked` otherwise; the unique index `(queue, concurrency_key,
//! slot_live)` lets no slot have two holders. Admission is one transition, `blocked →
//! pending` into a free slot, made in two places: the hand-off, when a job that held a slot
//! ends, and the gate (see `crate::gate`), for the jobs that arrive blocked and for any
//! hand-off that was missed. Both are races the index referees: the loser changes nothing.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use crate::db::{self, Failure};

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

/// Admits the next blocked job of `(queue, key)` into `slot`; returns whether one moved. A
/// slot taken meanwhile (1062, or Galera's 1213 for the same race on two nodes, or a
/// deadlock with another admission) is a race lost to another admission, not an error:
/// nothing changed, and false says so.
pub async fn hand_off(conn: &mut Conn, queue: &str, key: &[u8], slot: u16) -> anyhow::Result<bool> {
    const ER_DUP_ENTRY: u16 = 1062;
    let result = conn
        .exec_drop(HAND_OFF, (slot, queue, key))
        .await
        .with_context(|| format!("admitting a blocked job of queue {queue}"));
    match result {
        Ok(()) => Ok(conn.affected_rows() == 1),
        Err(e) if db::server_code(&e) == Some(ER_DUP_ENTRY) => Ok(false),
        Err(e) if db::classify(&e) == Failure::Conflict => {
            // A deadlock rolled back the statement's transaction: autocommit, nothing else.
            Ok(false)
        }
        Err(e) => Err(e),
    }
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
/// `(queue, concurrency_key, slot_live)`: the held slots of each key, past the NULL entries of
/// its finished and waiting jobs, at most `key_limit` entries per key.
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
            "SELECT concurrency_key, slot_live FROM myjob_jobs FORCE INDEX (myjob_jobs_slot) \
             WHERE queue = ? AND concurrency_key IN ({list}) AND slot_live IS NOT NULL"
        ),
        Params::Positional(params),
    )
    .await
    .with_context(|| format!("reading the held slots of queue {queue}"))
}
