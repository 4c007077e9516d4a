//! The stager's move of due scheduled jobs to pending.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// The most rows one stager statement moves; it repeats while it moves that many.
const STAGE_CHUNK: u64 = 1000;
/// The most statements of [`STAGE_CHUNK`] rows one call of [`stage`] sends.
const STAGE_CHUNKS: usize = 10;

/// What one call of [`stage`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Staged {
    pub moved: u64,
    /// It stopped at its bound with rows perhaps left to move: call again at once.
    pub more: bool,
}

/// The stager: moves due `scheduled` jobs to `pending` (to `blocked` when they have a
/// concurrency key: the gate admits them), and jobs a producer inserted as `pending` with a
/// future run_at to `scheduled` (and blocked ones whose run_at an UPDATE moved later), so
/// that the claim's and the gate's ranges hold due jobs only. Three ranges of the `(status,
/// run_at)` index: when nothing is due, a read of an entry
/// or two. The UPDATE repeats while it moves a whole chunk, a bounded number of times, so
/// that a stager's connection is never busy for long. With a `lag`, only the scheduled jobs
/// due for longer than that move: what a stager without the lock does when the one with it
/// has fallen behind (see `stager`).
pub async fn stage(conn: &mut Conn, lag: Duration) -> anyhow::Result<Staged> {
    let lag = lag.as_micros() as u64;
    // A plain read first, which takes no lock: an UPDATE's range scan locks the first row
    // past each range, a claimed row that outcome writes and claims are busy with, and when
    // nothing is due (nearly always) there is nothing to change anyway.
    let due: Option<u8> = conn
        .exec_first(
            "SELECT 1 FROM myjob_jobs FORCE INDEX (myjob_jobs_due) \
             WHERE (status = 'scheduled' AND run_at <= NOW(6) - INTERVAL ? MICROSECOND) \
                OR (status IN ('pending', 'blocked') AND run_at > NOW(6)) \
             LIMIT 1",
            (lag,),
        )
        .await
        .context("looking for jobs to stage")?;
    if due.is_none() {
        return Ok(Staged::default());
    }
    let mut staged = Staged::default();
    for _ in 0..STAGE_CHUNKS {
        conn.exec_drop(
            "UPDATE myjob_jobs FORCE INDEX (myjob_jobs_due) \
             SET status = IF(status = 'scheduled', \
                              IF(concurrency_key IS NULL, 'pending', 'blocked'), 'scheduled') \
             WHERE (status = 'scheduled' AND run_at <= NOW(6) - INTERVAL ? MICROSECOND) \
                OR (status IN ('pending', 'blocked') AND run_at > NOW(6)) \
             LIMIT ?",
            (lag, STAGE_CHUNK),
        )
        .await
        .context("staging scheduled jobs")?;
        let n = conn.affected_rows();
        staged.moved += n;
        staged.more = n == STAGE_CHUNK;
        if !staged.more {
            break;
        }
    }
    Ok(staged)
}
