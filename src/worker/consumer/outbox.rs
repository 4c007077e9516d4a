//! The outbox: outcomes of finished jobs, held until they are written. Each write is a commit
//! (an fsync on the server), so outcomes are written together rather than one per handler,
//! and kept when the database is away or the write lost a race.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::time::Instant;
use tracing::{debug, error, warn, Span};

use crate::db::{self, Failure};
use crate::error::chain;
use crate::metrics::{self, QueueMetrics};
use crate::store::jobs::{self, BatchId, Completion, JobId, KeySlot, Outcome, Unwritten};

/// Where an attempt's outcome is counted once it is written: its queue's metrics, and the
/// outcome its handler gave. None for a job given back before it started.
pub type Tally = Option<(Arc<QueueMetrics>, metrics::Outcome)>;

/// The longest an outcome waits for others to share its write.
pub const WRITE_AFTER: Duration = Duration::from_millis(10);

/// One outcome held: what its write says, where it is counted once written, and its job's
/// span, so that the lines about its write carry the job's fields.
struct Held {
    completion: Completion,
    tally: Tally,
    span: Span,
}

impl AsRef<Completion> for Held {
    fn as_ref(&self) -> &Completion {
        &self.completion
    }
}

#[derive(Default)]
pub struct Outbox {
    held: Vec<Held>,
    /// When the oldest held outcome came in.
    since: Option<Instant>,
    /// Not before then: the last write lost a race (see [`Outbox::lost_race`]).
    not_before: Option<Instant>,
    /// The concurrency-key slots that written outcomes gave up, to hand on (see
    /// [`Outbox::take_freed`]).
    freed: Vec<KeySlot>,
}

impl Outbox {
    pub fn push(&mut self, c: Completion, tally: Tally, span: Span) {
        self.since.get_or_insert_with(Instant::now);
        self.held.push(Held {
            completion: c,
            tally,
            span,
        });
    }

    /// A job given back before its handler started: its claim undone, no attempt counted.
    pub fn release(&mut self, job_id: JobId, batch_id: BatchId, span: Span) {
        let c = Completion {
            job_id,
            batch_id,
            outcome: Outcome::Release,
            slot: None,
        };
        self.push(c, None, span);
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// The slots given up by the outcomes written since the last call: each is handed on to
    /// its key's next blocked job.
    pub fn take_freed(&mut self) -> Vec<KeySlot> {
        std::mem::take(&mut self.freed)
    }

    /// The batches the held outcomes belong to: still this instance's claims.
    pub fn batches(&self) -> impl Iterator<Item = BatchId> + '_ {
        self.held.iter().map(|h| h.completion.batch_id)
    }

    /// Whether to write now: once `enough` have finished, once the oldest has waited
    /// [`WRITE_AFTER`], or when nothing else is running (`idle`); never during the pause after
    /// a lost race.
    pub fn due(&self, now: Instant, enough: usize, idle: bool) -> bool {
        !self.held.is_empty()
            && self.not_before.is_none_or(|t| now >= t)
            && (self.held.len() >= enough.max(1)
                || idle
                || self.since.is_some_and(|t| now >= t + WRITE_AFTER))
    }

    /// When [`Outbox::due`] turns true by waiting alone.
    pub fn deadline(&self) -> Option<Instant> {
        let since = self.since? + WRITE_AFTER;
        Some(self.not_before.map_or(since, |t| t.max(since)))
    }

    /// The write lost a race (a deadlock, a Galera conflict, a lock wait): the outcomes stay,
    /// and are written again after a short random pause, so that two conflicting writers do
    /// not meet again at once.
    pub fn lost_race(&mut self) {
        self.not_before =
            Some(Instant::now() + Duration::from_millis(5 + rand::random::<u64>() % 45));
    }

    /// Writes everything held. On an error the outcomes stay held. When the server refuses
    /// the write for good (a trigger or a constraint of the user's), they are written one by
    /// one instead, so that one job's outcome does not hold back the others.
    pub async fn write(&mut self, conn: &mut Conn) -> anyhow::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let unwritten = match jobs::write_outcomes(conn, &self.held).await {
            Ok(unwritten) => unwritten,
            Err(e) if matches!(db::classify(&e), Failure::Refused(_)) => {
                warn!(
                    "consumer: the server refused a write of {} outcomes ({}): writing them one by one",
                    self.held.len(),
                    chain(&*e)
                );
                conn.query_drop("ROLLBACK")
                    .await
                    .map_err(|e| anyhow::anyhow!(db::describe(&e)))?;
                return self.write_one_by_one(conn).await;
            }
            Err(e) => return Err(e),
        };
        report(&unwritten, &self.held);
        for h in self.held.drain(..) {
            count(&h.completion, h.tally, &unwritten);
            freed(&mut self.freed, &h.completion, &unwritten);
        }
        self.since = None;
        self.not_before = None;
        Ok(())
    }

    /// A refused outcome becomes a failure of its job with the server's message; if even
    /// that is refused, it is logged and dropped, and the job stays claimed by this instance
    /// until it stops (the reaper then puts it back). Each outcome leaves the outbox only once
    /// written: a write cut short (no answer in time drops this future) keeps the rest held,
    /// their batches re-owned at the reconnect, rather than lose them and leave their jobs
    /// claimed for the reaper to hand out again, finished though they are.
    async fn write_one_by_one(&mut self, conn: &mut Conn) -> anyhow::Result<()> {
        while let Some(h) = self.held.first() {
            match write_or_fail(conn, &h.completion, &h.span).await {
                Ok((unwritten, failed)) => {
                    report(&unwritten, std::slice::from_ref(h));
                    let h = self.held.remove(0);
                    let t = match (h.tally, failed) {
                        (Some((q, _)), true) => Some((q, metrics::Outcome::Failed)),
                        (t, _) => t,
                    };
                    count(&h.completion, t, &unwritten);
                    freed(&mut self.freed, &h.completion, &unwritten);
                }
                Err(e) => {
                    self.since = Some(Instant::now());
                    return Err(e);
                }
            }
        }
        self.since = None;
        self.not_before = None;
        Ok(())
    }
}

/// Writes one outcome; if the server refuses it, fails the job with the server's message
/// (then says so: true). An outcome dropped because every write about the job is refused
/// reads as lost.
async fn write_or_fail(
    conn: &mut Conn,
    c: &Completion,
    span: &Span,
) -> anyhow::Result<(Unwritten, bool)> {
    let e = match jobs::write_outcomes(conn, std::slice::from_ref(c)).await {
        Err(e) if matches!(db::classify(&e), Failure::Refused(_)) => e,
        other => return other.map(|u| (u, false)),
    };
    let reason = chain(&*e);
    let failed = Completion {
        outcome: Outcome::Fail {
            error: format!("the server refused this job's outcome: {reason}"),
        },
        ..c.clone()
    };
    match jobs::write_outcomes(conn, std::slice::from_ref(&failed)).await {
        Err(e) if matches!(db::classify(&e), Failure::Refused(_)) => {
            span.in_scope(|| {
                error!(
                    job_id = c.job_id.get(),
                    batch_id = c.batch_id.get(),
                    "job outcome dropped: the server refused it ({reason}), and refuses its failure too ({})",
                    chain(&*e)
                )
            });
            Ok((
                Unwritten {
                    lost: vec![c.claim()],
                    ..Unwritten::default()
                },
                false,
            ))
        }
        Ok(unwritten) => {
            // Said once the failure is written, the only time it is final: a write cut short
            // comes back here, and a claim put back meanwhile runs the job again.
            if !unwritten.lost.contains(&c.claim()) && !unwritten.finished.contains(&c.job_id) {
                span.in_scope(|| {
                    error!(
                        target: "myjob::msg::failed",
                        job_id = c.job_id.get(),
                        batch_id = c.batch_id.get(),
                        "job failed: the server refused its outcome: {reason}"
                    )
                });
            }
            Ok((unwritten, true))
        }
        Err(e) => Err(e),
    }
}

/// Counts a written outcome: as its handler gave it, or `lost` when the fenced write matched
/// no row (the claim was put back and is someone else's now).
fn count(c: &Completion, tally: Tally, unwritten: &Unwritten) {
    let Some((queue, outcome)) = tally else {
        return;
    };
    if unwritten.lost.contains(&c.claim()) {
        queue.ended(metrics::Outcome::Lost);
    } else {
        queue.ended(outcome);
    }
}

/// Keeps the slot a written outcome gave up. A job released goes back to pending in its
/// slot; one whose claim was put back is someone else's, slot and all; a job its handler
/// finished itself (the exactly-once recipe) gave its slot up with its own commit.
fn freed(freed: &mut Vec<KeySlot>, c: &Completion, unwritten: &Unwritten) {
    let Some(slot) = &c.slot else {
        return;
    };
    if c.outcome != Outcome::Release && !unwritten.lost.contains(&c.claim()) {
        freed.push(slot.clone());
    }
}

/// Logs the outcomes among `held` that were not written, each in its job's span.
fn report(unwritten: &Unwritten, held: &[Held]) {
    let span_of = |job_id: JobId, batch_id: Option<BatchId>| {
        held.iter()
            .find(|h| {
                let c = &h.completion;
                c.job_id == job_id && batch_id.is_none_or(|b| b == c.batch_id)
            })
            .map_or_else(Span::none, |h| h.span.clone())
    };
    for &jobs::Claim { job_id, batch_id } in &unwritten.lost {
        span_of(job_id, Some(batch_id)).in_scope(|| {
            warn!(
                job_id = job_id.get(),
                batch_id = batch_id.get(),
                "job outcome not written: its claim was reaped and the job was put back meanwhile"
            )
        });
    }
    for &job_id in &unwritten.finished {
        span_of(job_id, None).in_scope(|| {
            debug!(
                job_id = job_id.get(),
                "job outcome not written: its handler finished the job in its own transaction"
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(job_id: u64) -> Completion {
        Completion {
            job_id: JobId::new(job_id),
            batch_id: BatchId::new(1),
            outcome: Outcome::Done,
            slot: None,
        }
    }

    #[test]
    fn writes_when_enough_have_finished_when_idle_or_after_a_wait() {
        let now = Instant::now();
        let mut o = Outbox::default();
        assert!(!o.due(now, 4, true), "nothing to write");
        assert_eq!(o.deadline(), None);
        o.push(done(1), None, Span::none());
        let t = o.deadline().unwrap();
        assert!(!o.due(now, 4, false));
        assert!(o.due(now, 4, true), "nothing else runs");
        assert!(o.due(t, 4, false), "the first has waited long enough");
        for id in 2..=4 {
            o.push(done(id), None, Span::none());
        }
        assert!(o.due(now, 4, false), "a batch's worth");
        assert_eq!(o.batches().collect::<Vec<_>>(), [BatchId::new(1); 4]);
    }

    #[test]
    fn waits_a_short_pause_after_a_lost_race() {
        let mut o = Outbox::default();
        o.push(done(1), None, Span::none());
        o.lost_race();
        let now = Instant::now();
        assert!(!o.due(now, 1, true), "not during the pause");
        let t = o.deadline().unwrap();
        assert!(t > now && t <= now + Duration::from_millis(50));
        assert!(o.due(t, 1, true));
    }
}
