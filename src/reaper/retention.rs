//! Deleting finished jobs gently: the reaper's pass over the config's `[retention]`, and
//! [`purge`], which it shares with `myjob purge`. A purge deletes batches of at most a
//! thousand rows (`store::jobs::purge`), each followed by a pause as long as the batch took, so
//! that the server spends at most half its time on it and claims and producers' INSERTs never
//! queue behind it.

use std::time::{Duration, Instant};

use mysql_async::Conn;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::store::jobs::purge::{purge_batch, Cursor};

use anyhow::Context as _;

use super::{info, keys, ServerId, Settings};

/// What a purge deleted.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Purged {
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// False when the purge stopped at its time budget, or was stopped, with rows left.
    pub complete: bool,
}

impl Purged {
    pub fn total(&self) -> u64 {
        self.done + self.failed + self.cancelled
    }

    fn add(&mut self, status: &str, n: u64) {
        match status {
            "done" => self.done += n,
            "failed" => self.failed += n,
            _ => self.cancelled += n,
        }
    }
}

/// Deletes the jobs of each final state in `ages` that finished longer ago than its age, of
/// `queue` only if given. It stops early, with `complete` false, once `budget` has passed or
/// when `stop` fires; a batch is never cut short.
pub async fn purge(
    conn: &mut Conn,
    ages: &[(&'static str, Duration)],
    queue: Option<&str>,
    budget: Option<Duration>,
    stop: &CancellationToken,
) -> anyhow::Result<Purged> {
    let deadline = budget.map(|b| Instant::now() + b);
    let mut purged = Purged::default();
    for &(status, age) in ages {
        let mut cursor: Option<Cursor> = None;
        loop {
            let started = Instant::now();
            let batch = purge_batch(conn, status, age, queue, cursor.as_ref()).await?;
            purged.add(status, batch.deleted);
            let Some(next) = batch.next else {
                break;
            };
            cursor = Some(next);
            let pause = started.elapsed();
            if deadline.is_some_and(|d| Instant::now() + pause >= d) {
                return Ok(purged);
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(purged),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
    purged.complete = true;
    Ok(purged)
}

/// Deletes finished jobs past their retention, for at most half an interval; on a Galera node,
/// a batch of the slots' anchors not admitted into for a day as well (only admissions there
/// write them).
pub(super) async fn retain(
    conn: &mut Conn,
    server: &ServerId,
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let ages = settings.retention.ages();
    let budget = settings.reaper.interval / 2;
    let purged = purge(conn, &ages, None, Some(budget), shutdown)
        .await
        .context("retention")?;
    if purged.total() > 0 {
        info!(
            done = purged.done,
            failed = purged.failed,
            cancelled = purged.cancelled,
            complete = purged.complete,
            "reaper: deleted finished jobs past their retention"
        );
    }
    if keys::Referee::of(server) == keys::Referee::Certification {
        keys::purge_anchors(conn).await.context("retention")?;
    }
    Ok(())
}
