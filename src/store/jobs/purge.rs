//! The deletion of finished jobs, one batch per call: what `myjob purge` and the reaper's
//! retention pass repeat (see `reaper::retention` for the pacing).
//!
//! There is no index on `finished_at`, which would cost every outcome write an entry. The due
//! index `(status, run_at, id, queue)` serves instead: a finished job ran after it was due, so
//! its `run_at` is never later than its `finished_at` (a cancel sets `run_at` to at most its
//! own time), and every job old enough to go lies in the range `run_at < cutoff`. The few rows in
//! that range that finished after the cutoff (they waited long to run) are read and kept.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use super::in_list;

/// The most rows one batch reads, and so the most one statement deletes.
pub const PURGE_BATCH: usize = 1000;

/// Where a purge has got to in the due index: the last `(run_at, id)` it read. The next batch
/// starts after it, so rows read and kept are not read again.
#[derive(Debug, Clone)]
pub struct Cursor(Value, u64);

/// What one batch did.
#[derive(Debug)]
pub struct Batch {
    /// Rows deleted.
    pub deleted: u64,
    /// Where the next batch starts; None when this one reached the end of the range.
    pub next: Option<Cursor>,
}

/// A job cancelled while it ran is kept until its worker says the handler has stopped (the
/// row is how the worker learns of the cancel), or for a day when no worker ever says so (it
/// died, and its handlers with it).
const UNSEEN: &str = "AND (status <> 'cancelled' OR owner_conn IS NULL \
     OR finished_at < NOW(6) - INTERVAL 1 DAY)";

/// Deletes the jobs in the final state `status` (done, failed or cancelled) that finished
/// more than `age` ago, of `queue` only if given, among the next [`PURGE_BATCH`] rows of
/// the range from `after` on. Two statements, neither of which waits for a worker: a read
/// of the due index `(status, run_at, id, queue)` (a range no worker writes in), then a
/// DELETE of the chosen rows by primary key, fenced by the same conditions in case a job was
/// retried in between.
pub async fn purge_batch(
    conn: &mut Conn,
    status: &str,
    age: Duration,
    queue: Option<&str>,
    after: Option<&Cursor>,
) -> anyhow::Result<Batch> {
    let micros = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
    let mut params: Vec<Value> = vec![micros.into()];
    let of_queue = match queue {
        Some(q) => {
            params.push(q.into());
            "AND queue = ?"
        }
        None => "",
    };
    params.extend([status.into(), micros.into()]);
    // Two ranges of the index `(status, run_at, id, …)`: the rest of the cursor's run_at,
    // then the later ones. Rows that share one run_at (a producer's multi-row INSERT) are
    // never read twice.
    let from = match after {
        Some(Cursor(run_at, id)) => {
            params.extend([run_at.clone(), run_at.clone(), (*id).into()]);
            "AND (run_at > ? OR (run_at = ? AND id > ?))"
        }
        None => "",
    };
    params.push((PURGE_BATCH as u64).into());
    let rows: Vec<(u64, Value, u8)> = conn
        .exec(
            format!(
                "SELECT id, run_at, \
                     (finished_at < NOW(6) - INTERVAL ? MICROSECOND {UNSEEN} {of_queue}) IS TRUE \
                 FROM myjob_jobs FORCE INDEX (myjob_jobs_due) \
                 WHERE status = ? AND run_at < NOW(6) - INTERVAL ? MICROSECOND {from} \
                 ORDER BY run_at, id LIMIT ?"
            ),
            Params::Positional(params),
        )
        .await
        .with_context(|| format!("reading {status} jobs to purge"))?;
    let next = match rows.last() {
        Some((id, run_at, _)) if rows.len() == PURGE_BATCH => Some(Cursor(run_at.clone(), *id)),
        _ => None,
    };
    let ids: Vec<u64> = rows
        .iter()
        .filter(|r| r.2 == 1)
        .map(|(id, ..)| *id)
        .collect();
    if ids.is_empty() {
        return Ok(Batch { deleted: 0, next });
    }
    let (list, mut params) = in_list(&ids);
    params.extend([status.into(), micros.into()]);
    conn.exec_drop(
        format!(
            "DELETE FROM myjob_jobs WHERE id IN ({list}) \
             AND status = ? AND finished_at < NOW(6) - INTERVAL ? MICROSECOND {UNSEEN}"
        ),
        Params::Positional(params),
    )
    .await
    .with_context(|| format!("deleting {status} jobs"))?;
    Ok(Batch {
        deleted: conn.affected_rows(),
        next,
    })
}
