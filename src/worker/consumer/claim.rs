//! The claim: jobs of the busy queues into the prefetch, one statement per queue, in shares
//! the planner ([`Shares`]) decides; rate-limited queues through their budget (see
//! [`rate::claim`]).

use super::*;
use crate::config::RateLimit;
use crate::store::jobs::{BatchId, Lane};

/// Reads back the jobs a committed claim took under `batch_id`. When the read fails, the
/// batch is kept in `unread`, this instance's still, and read after the reconnect.
pub(super) async fn read_back(
    metrics: &Metrics,
    conn: &mut mysql_async::Conn,
    limit: Duration,
    batch_id: BatchId,
    max_payload_bytes: u64,
    unread: &mut Vec<BatchId>,
) -> anyhow::Result<Vec<jobs::ClaimedJob>> {
    let read = jobs::read_batch(conn, batch_id, max_payload_bytes);
    let claimed = metrics.within(Op::ReadBatch, limit, read).await;
    if claimed.is_err() {
        unread.push(batch_id);
    }
    claimed
}

/// The claim's share planner: each busy queue is offered an even share of what is still
/// wanted, in rounds over the busy list; a queue that comes back short is drained and leaves
/// the list, and what it left is offered again to the queues that filled their share. Each
/// round either fills the claim or drains a queue: at most one round per busy queue, and
/// one when every queue has plenty. No I/O: the claim asks it whom to offer what.
#[derive(Debug)]
pub(super) struct Shares {
    want: usize,
    left: usize,
    /// The index in the busy list of the next queue to offer a share to.
    next: usize,
    /// How many queues of this round have not been offered a share yet.
    offered: usize,
}

/// What a queue did with its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Took {
    /// All of it: the queue may have more, and stays busy.
    Filled,
    /// Less: the queue is drained, and leaves the busy list.
    Drained,
}

impl Shares {
    pub(super) fn new(want: usize) -> Shares {
        Shares {
            want,
            left: want,
            next: 0,
            offered: 0,
        }
    }

    /// The next queue to offer a share to (its index in a busy list `busy` long) and its
    /// share; None once nothing is left to claim or no queue is busy.
    pub(super) fn next(&mut self, busy: usize) -> Option<(usize, usize)> {
        if self.left == 0 || busy == 0 {
            return None;
        }
        if self.next >= busy || self.offered == 0 {
            // A new round over the queues still busy.
            self.next = 0;
            self.offered = busy;
        }
        let share = self.left.div_ceil(self.offered);
        self.offered -= 1;
        Some((self.next, share))
    }

    /// The queue offered `share` got `n`. A drained queue is to be removed from the busy
    /// list, which moves the next one up to its index.
    pub(super) fn got(&mut self, n: usize, share: usize) -> Took {
        self.left = self.left.saturating_sub(n);
        if n < share {
            return Took::Drained;
        }
        self.next += 1;
        Took::Filled
    }

    /// The queue got `n` and is to be removed from the busy list for a reason of its own
    /// (its rate budget ran out), whatever it got.
    pub(super) fn held_back(&mut self, n: usize) {
        self.left = self.left.saturating_sub(n);
    }

    /// Whether the claim got no job at all.
    pub(super) fn got_none(&self) -> bool {
        self.left == self.want
    }
}

/// One queue's claim of up to `share` jobs under `batch_id`, through its rate limit if it has
/// one.
async fn claim_queue(
    conn: &mut mysql_async::Conn,
    batch_id: BatchId,
    queue: &str,
    rate: Option<RateLimit>,
    share: usize,
    who: &Claimer<'_>,
    lane: Lane,
) -> anyhow::Result<rate::Limited> {
    match rate {
        None => {
            let claimed = jobs::claim(conn, batch_id, queue, share, who, lane).await?;
            Ok(rate::Limited {
                claimed,
                wait: None,
            })
        }
        Some(rate) => rate::claim(conn, batch_id, queue, &rate, share, who, lane).await,
    }
}

impl Consumer {
    /// Claims up to `want` jobs into the prefetch, one statement per busy queue. Each busy
    /// queue is offered an even share of what is still wanted, starting one queue further
    /// each time; a queue that comes back short is drained and leaves the busy list, and
    /// what it left is offered again to the queues that filled their share. So the claim
    /// comes back short only when every served queue is drained. Returns how many it got.
    pub(super) async fn claim(
        &mut self,
        settings: &Settings,
        want: usize,
    ) -> anyhow::Result<usize> {
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return Ok(0);
        };
        let batch_id = jobs::BatchId::random();
        let who = Claimer {
            owner_server: server,
            worker: &self.worker,
        };
        // A reload may have dropped a queue, an operator paused one since the probe.
        self.busy
            .retain(|q| settings.queue(q).is_some() && !self.paused.contains(q));
        if !self.busy.is_empty() {
            self.busy.rotate_left(1);
        }
        let mut plan = Shares::new(want);
        // Each queue's claim commits by itself: when one fails, what the others claimed is
        // read all the same, or it would sit claimed by a live connection, never run.
        let mut failed = None;
        while let Some((k, share)) = plan.next(self.busy.len()) {
            let queue = &self.busy[k];
            let lane = self.lanes.of(queue);
            let rate = settings.queue(queue).and_then(|q| q.rate);
            let claim = claim_queue(conn, batch_id, queue, rate, share, &who, lane);
            let claimed = self.metrics.within(Op::Claim, limit, claim).await;
            if let Ok(got) = &claimed {
                self.metrics.queue(queue).claimed(got.claimed > 0);
                // Tried with room for jobs, whatever it got: this instance keeps its lane
                // while it has room, even when the jobs of now are other lanes'.
                self.lanes.claimed(queue);
            }
            match claimed {
                Ok(rate::Limited {
                    claimed: n,
                    wait: Some(wait),
                    ..
                }) => {
                    plan.held_back(n);
                    let queue = self.busy.remove(k);
                    self.rate_wait.push((queue, Instant::now() + wait));
                }
                Ok(rate::Limited { claimed: n, .. }) => {
                    if plan.got(n, share) == Took::Drained {
                        self.busy.remove(k);
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if plan.got_none() {
            return self.got_none(batch_id, failed);
        }
        let max = settings.worker.max_payload_bytes;
        let read = read_back(&self.metrics, conn, limit, batch_id, max, &mut self.unread);
        let claimed = read.await?;
        self.link.used();
        self.counters.claimed();
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            self.metrics.attempts.last_claim.set(now.as_secs_f64());
        }
        debug!(
            batch_id = batch_id.get(),
            jobs = claimed.len(),
            "claimed a batch"
        );
        let got = claimed.len();
        self.take(settings, batch_id, claimed);
        match failed {
            Some(e) => Err(e),
            None => {
                self.link.wrote();
                Ok(got)
            }
        }
    }

    /// A claim that took no job, `failed` or not.
    fn got_none(
        &mut self,
        batch_id: BatchId,
        failed: Option<anyhow::Error>,
    ) -> anyhow::Result<usize> {
        match failed {
            Some(e) => {
                // The connection broke on an UPDATE that may have committed: its jobs would be
                // claimed by this instance with nobody to run them. Read back after the
                // reconnect (an empty batch reads as nothing). An error the server sent says
                // the statement did not commit.
                if db::classify(&e) == Failure::Lost {
                    self.unread.push(batch_id);
                }
                self.link.used();
                Err(e)
            }
            // Nothing claimed. Not proof that the server takes writes: a claim that read no due
            // job sends no UPDATE (nor a lane that picked none), and on a read-only server each
            // poll would say it takes writes again, then not.
            None => {
                self.link.succeeded();
                Ok(0)
            }
        }
    }

    /// Puts the rate-limited queues whose budget has a start again back among the busy ones.
    /// Returns whether there was any.
    pub(super) fn rate_due(&mut self, now: Instant) -> bool {
        let mut due = false;
        let busy = &mut self.busy;
        self.rate_wait.retain(|(queue, at)| {
            if *at > now {
                return true;
            }
            if !busy.contains(queue) {
                busy.push(queue.clone());
            }
            due = true;
            false
        });
        due
    }

    /// Takes the jobs read back from a claim into the prefetch.
    pub(super) fn take(
        &mut self,
        settings: &Settings,
        batch_id: BatchId,
        claimed: Vec<jobs::ClaimedJob>,
    ) {
        for job in claimed {
            let span = job_span(job.id, &job.queue, job.attempt, Some(batch_id));
            let _in_job = span.enter();
            // Claimed by its exact name, so the lookup finds it; a claim that cannot be
            // started all the same goes back at once rather than sit claimed.
            let Some(queue) = settings.queue(&job.queue).cloned() else {
                warn!(job_id = job.id.get(), queue = %job.queue, "job released: claimed for a queue this instance does not serve");
                self.outbox.release(job.id, batch_id, span.clone());
                continue;
            };
            if self.quarantine.holds(batch_id) {
                info!(
                    job_id = job.id.get(),
                    queue = %job.queue,
                    "suspect claimed: it was running at two deaths of its workers; it runs in the quarantine slot, the one suspect of this instance"
                );
            }
            drop(_in_job);
            self.prefetch.push(Ready {
                job,
                batch_id,
                queue,
                span,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Shares, Took};

    /// Runs a claim of `want` over queues holding `jobs` each, as the consumer does; returns
    /// each offer (queue, share) and what each queue gave.
    fn claim(want: usize, jobs: &[usize]) -> (Vec<(usize, usize)>, Vec<usize>) {
        let mut busy: Vec<usize> = (0..jobs.len()).collect();
        let mut left = jobs.to_vec();
        let mut gave = vec![0; jobs.len()];
        let mut offers = Vec::new();
        let mut plan = Shares::new(want);
        while let Some((k, share)) = plan.next(busy.len()) {
            let q = busy[k];
            offers.push((q, share));
            let n = share.min(left[q]);
            left[q] -= n;
            gave[q] += n;
            if plan.got(n, share) == Took::Drained {
                busy.remove(k);
            }
        }
        (offers, gave)
    }

    #[test]
    fn shares_are_even_the_first_queues_taking_the_rounding() {
        let (offers, gave) = claim(10, &[100, 100, 100]);
        assert_eq!(offers, [(0, 4), (1, 3), (2, 3)]);
        assert_eq!(gave, [4, 3, 3]);
        assert_eq!(claim(10, &[100]).0, [(0, 10)]);
    }

    #[test]
    fn what_a_drained_queue_leaves_goes_to_the_others() {
        // Queue 0 drains at once: its share goes to the next ones in the same round.
        let (offers, gave) = claim(9, &[1, 100, 100]);
        assert_eq!(offers, [(0, 3), (1, 4), (2, 4)]);
        assert_eq!(gave, [1, 4, 4]);
        // The last queue drains: a second round gives its leftover to the first.
        let (offers, gave) = claim(10, &[100, 2]);
        assert_eq!(offers, [(0, 5), (1, 5), (0, 3)]);
        assert_eq!(gave, [8, 2]);
    }

    #[test]
    fn a_claim_ends_short_only_when_every_queue_is_drained() {
        let (offers, gave) = claim(10, &[3, 2]);
        assert_eq!(gave, [3, 2]);
        assert_eq!(offers.len(), 2);
        let mut plan = Shares::new(5);
        assert_eq!(plan.next(0), None, "no busy queue: nothing to offer");
        assert!(plan.got_none());
    }

    #[test]
    fn a_queue_held_back_leaves_its_place_to_the_next() {
        let mut plan = Shares::new(6);
        assert_eq!(plan.next(2), Some((0, 3)));
        plan.held_back(1);
        // The caller removed queue 0; queue 1 moved up to index 0 and gets what is left.
        assert_eq!(plan.next(1), Some((0, 5)));
        assert_eq!(plan.got(5, 5), Took::Filled);
        assert_eq!(plan.next(1), None);
        assert!(!plan.got_none());
    }
}
