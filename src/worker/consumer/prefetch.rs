//! The prefetch: claimed jobs waiting for a slot, and how many to claim.
//!
//! Claims are sized to the free slots plus the jobs the instance will start within the next
//! [`HORIZON`] at its recent completion rate. A slot that frees up is refilled at once from
//! the prefetch, without a round trip to the database, while slow jobs (a low rate) get no
//! prefetch, so an instance never sits on jobs that another could start.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{QueueSettings, WorkerSettings};
use crate::store::jobs::{BatchId, Claim, ClaimedJob, JobId};

/// How far ahead the prefetch looks (at most `batch_size` jobs).
const HORIZON: Duration = Duration::from_millis(100);

/// How often the completion rate is re-estimated.
const RATE_WINDOW: Duration = Duration::from_millis(250);

/// A claimed job waiting for a slot.
pub struct Ready {
    pub job: ClaimedJob,
    pub batch_id: BatchId,
    pub queue: Arc<QueueSettings>,
    /// Its lines' span (see `logging::job_span`).
    pub span: tracing::Span,
}

impl Ready {
    /// The span its lines are logged in.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }
}

/// What the next claim should ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// How many jobs to claim.
    pub jobs: usize,
    /// The prefetch has run low: worth a claim now.
    pub low: bool,
    /// The least worth a claim while a backlog is draining: fewer, fuller claims rather than
    /// one per finished handler.
    pub least: usize,
}

pub struct Prefetch {
    ready: VecDeque<Ready>,
    /// Completions since `since`, and the smoothed rate per second.
    count: u64,
    since: Instant,
    per_sec: f64,
}

impl Prefetch {
    pub fn new(now: Instant) -> Self {
        Prefetch {
            ready: VecDeque::new(),
            count: 0,
            since: now,
            per_sec: 0.0,
        }
    }

    pub fn push(&mut self, r: Ready) {
        self.ready.push_back(r);
    }

    pub fn pop(&mut self) -> Option<Ready> {
        self.ready.pop_front()
    }

    /// How many jobs wait.
    pub fn len(&self) -> usize {
        self.ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// The batches of the waiting jobs: still this instance's claims.
    pub fn batches(&self) -> impl Iterator<Item = BatchId> + '_ {
        self.ready.iter().map(|r| r.batch_id)
    }

    /// The waiting jobs' claims.
    pub fn claims(&self) -> Vec<Claim> {
        self.ready
            .iter()
            .map(|r| Claim {
                job_id: r.job.id,
                batch_id: r.batch_id,
            })
            .collect()
    }

    /// Keeps only the waiting jobs in `held`; returns the ids of the others.
    pub fn keep_only(&mut self, held: &[JobId]) -> Vec<Ready> {
        self.retain(|id| held.contains(&id))
    }

    /// Drops the waiting jobs among `ids` (an operator cancelled them); returns those dropped.
    pub fn drop_jobs(&mut self, ids: &[JobId]) -> Vec<Ready> {
        self.retain(|id| !ids.contains(&id))
    }

    /// Keeps the waiting jobs whose id passes `keep`; returns the others.
    fn retain(&mut self, keep: impl Fn(JobId) -> bool) -> Vec<Ready> {
        let mut dropped = Vec::new();
        for r in std::mem::take(&mut self.ready) {
            if keep(r.job.id) {
                self.ready.push_back(r);
            } else {
                dropped.push(r);
            }
        }
        dropped
    }

    /// Every waiting job, for release at a shutdown.
    pub fn take_all(&mut self) -> Vec<Ready> {
        self.ready.drain(..).collect()
    }

    /// A handler finished: counts toward the completion rate.
    pub fn completed(&mut self) {
        self.count += 1;
    }

    /// How many jobs to hold ready beyond the free slots.
    fn ahead(&mut self, now: Instant, batch_size: usize) -> usize {
        let elapsed = now.duration_since(self.since);
        if elapsed >= RATE_WINDOW {
            let recent = self.count as f64 / elapsed.as_secs_f64();
            self.per_sec = (self.per_sec + recent) / 2.0;
            self.count = 0;
            self.since = now;
        }
        ((self.per_sec * HORIZON.as_secs_f64()) as usize).min(batch_size)
    }

    /// What to claim with `running` handlers busy: the free slots plus the prefetch, less
    /// what is waiting already, at most `batch_size`.
    pub fn want(&mut self, now: Instant, running: usize, worker: &WorkerSettings) -> Want {
        let ahead = self.ahead(now, worker.batch_size);
        let held = running + self.ready.len();
        Want {
            jobs: (worker.concurrency + ahead)
                .saturating_sub(held)
                .min(worker.batch_size),
            low: self.ready.len() <= ahead / 2,
            least: (worker.concurrency.min(worker.batch_size) / 8).max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(concurrency: usize, batch_size: usize) -> WorkerSettings {
        WorkerSettings {
            concurrency,
            batch_size,
            max_payload_bytes: 1024,
            poll_interval: Duration::from_millis(500),
            shutdown_timeout: Duration::from_secs(30),
            kill_grace: Duration::from_secs(5),
        }
    }

    #[test]
    fn slow_jobs_get_no_prefetch_and_free_slots_are_wanted() {
        let t = Instant::now();
        let mut p = Prefetch::new(t);
        let w = worker(64, 100);
        // Nothing finished yet: the free slots only.
        let want = p.want(t, 57, &w);
        assert_eq!(want.jobs, 7);
        assert!(want.low);
        // Seven free slots are below `least` while a backlog drains, but `want` still asks
        // for them: the consumer claims them at the poll.
        assert_eq!(want.least, 8);
    }

    #[test]
    fn a_fast_rate_claims_ahead_up_to_the_batch_size() {
        let t = Instant::now();
        let mut p = Prefetch::new(t);
        let w = worker(8, 100);
        // 500 jobs in a quarter second: 2,000/s, 200 in the horizon, capped at 100.
        for _ in 0..500 {
            p.completed();
        }
        let want = p.want(t + RATE_WINDOW, 8, &w);
        // Smoothed with the earlier rate (0): 1,000/s, 100 ahead.
        assert_eq!(want.jobs, 100);
        let want = p.want(t + RATE_WINDOW * 2, 8, &w);
        assert_eq!(want.jobs, 50, "the rate halves when nothing finishes");
    }
}
