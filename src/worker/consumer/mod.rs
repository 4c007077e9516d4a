//! The consumer: one per instance. It claims as many due jobs as it has free handler slots,
//! starts a handler for each, and writes their outcomes back, fenced by batch_id. Its parts
//! each own one concern: the [`Link`] (the connection), the [`Prefetch`] (claimed jobs not
//! started yet), the [`Slots`] (running handlers) and the [`Outbox`] (outcomes not written
//! yet); the loop only decides what is due and waits for the earliest deadline.
//!
//! Why one claimer per instance rather than one per slot: claimers racing for the head of the
//! queue wait on each other's row locks, and throughput falls as they are added. One claimer
//! per instance keeps one connection per instance in the race.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::*;
use tokio::sync::{oneshot, watch};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{DatabaseSettings, Settings};
use crate::daemon::status::Counters;
use crate::db::{self, Failure, ServerId};
use crate::error::chain;
use crate::logging::job_span;
use crate::metrics::{self, Metrics, Op};
use crate::stager::gate::Wakes;
use crate::store::jobs::keys::Referee;
use crate::store::jobs::{self, BatchId, Claimer, Completion, JobId, Outcome};
use crate::store::servers;
use crate::worker::name::WorkerName;

mod claim;
mod drain;
mod finish;
mod handoff;
pub(crate) mod lanes;
pub(crate) mod link;
mod outbox;
mod prefetch;
mod probe;
mod quarantine;
mod rate;
mod reconnect;
mod slots;

use lanes::Lanes;
use link::{Fresh, Link};
use outbox::Outbox;
use prefetch::{Prefetch, Ready};
use slots::{Finished, Slots};

use finish::CANCEL_CHECK;
use probe::PauseReads;
use quarantine::Quarantine;

use claim::read_back;

/// A healthy loop turns at least this often, for the watchdog (see [`Counters::beat`]).
const TURN: Duration = Duration::from_secs(1);

pub struct Consumer {
    settings: watch::Receiver<Arc<Settings>>,
    metrics: Arc<Metrics>,
    /// `host:pid:instance` (see [`WorkerName`]), written into claimed rows.
    worker: String,
    counters: Arc<Counters>,
    link: Link,
    prefetch: Prefetch,
    slots: Slots,
    outbox: Outbox,
    /// The served queues that may hold more pending jobs: those the last probe found some in,
    /// less those a claim has since drained. Claims go to these only, so a drained queue
    /// never makes a claim come back short while another still has jobs. Each claim starts
    /// one queue further along it, so that when every queue has a backlog none waits behind
    /// the others.
    busy: Vec<String>,
    /// When to ask again which queues have pending jobs (see [`jobs::probe`]):
    /// once per `poll_interval`, and only when there is room for a job.
    next_probe: Instant,
    /// The queues an operator paused (`myjob pause`): not claimed. Read by the probe.
    paused: Vec<String>,
    /// Whether the probe may read them (see [`PauseReads`]).
    pause_reads: PauseReads,
    /// When to ask next about cancelled jobs (see [`CANCEL_CHECK`]).
    next_cancel_check: Instant,
    /// The quarantine slot, for the one suspect this instance may run at a time.
    quarantine: Quarantine,
    /// Batches claimed (the claim committed) whose read-back failed: this instance's jobs,
    /// re-owned at the reconnect and read then (see [`Consumer::read_unread`]), rather than
    /// left to the reaper as a dead worker's.
    unread: Vec<BatchId>,
    /// When to stamp the heartbeat of the server this instance claims through next (see
    /// [`Consumer::stamp`]).
    next_stamp: Instant,
    /// On a Galera node, the part of each queue's head this instance claims first.
    lanes: Lanes,
    /// Running jobs whose claim was gone at a reconnect (see [`Consumer::adopt`]): their
    /// handlers were stopped, and their end is logged as that, not as an operator's cancel.
    lost: Vec<JobId>,
    /// Rate-limited queues whose budget ran out before their jobs did, and when it has a
    /// start again: left out of the claims and the probe's answer until then, then claimed
    /// at once (see [`rate::claim`]).
    rate_wait: Vec<(String, Instant)>,
    /// Shared with this instance's gate: it says when it admitted jobs, and is told when the
    /// probe saw blocked ones.
    wakes: Arc<Wakes>,
}

impl Consumer {
    pub fn new(
        db: DatabaseSettings,
        settings: watch::Receiver<Arc<Settings>>,
        name: &WorkerName,
        counters: Arc<Counters>,
        metrics: Arc<Metrics>,
        connected: oneshot::Sender<()>,
        wakes: Arc<Wakes>,
    ) -> Self {
        let now = Instant::now();
        Consumer {
            wakes,
            settings,
            metrics: metrics.clone(),
            worker: name.to_string(),
            counters,
            link: Link::new(db, connected),
            prefetch: Prefetch::new(now),
            slots: Slots::new(&name.instance, metrics.clone()),
            outbox: Outbox::default(),
            busy: Vec::new(),
            next_probe: now,
            paused: Vec::new(),
            pause_reads: PauseReads::default(),
            next_cancel_check: now,
            quarantine: Quarantine::default(),
            unread: Vec::new(),
            next_stamp: now,
            lanes: Lanes::new(now),
            lost: Vec::new(),
            rate_wait: Vec::new(),
        }
    }

    /// Claims and runs jobs until `shutdown` fires, then drains: see [`Consumer::drain`].
    pub async fn run(mut self, shutdown: CancellationToken) {
        // The loop's one exit is the shutdown token; database trouble only reconnects.
        while !shutdown.is_cancelled() {
            self.counters.beat();
            let settings = self.settings.borrow_and_update().clone();
            let worker = &settings.worker;
            let now = self.tend(&settings).await;

            let want = self.prefetch.want(now, self.slots.len(), worker);
            // At the poll, with room for a job, ask which queues have pending jobs: queues
            // drained since, or idle until now, get their turn again.
            let poll = want.low && want.jobs > 0 && now >= self.next_probe;
            if poll {
                self.next_probe = now + worker.poll_interval;
                self.probe(&settings).await;
            }
            // A suspect first, into a free slot at once: never prefetched behind other jobs.
            if self.prefetch.is_empty()
                && self.slots.len() < worker.concurrency
                && self.quarantine_free()
                && self.quarantine.is_found()
            {
                if let Err(e) = self.claim_suspect(&settings).await {
                    self.quarantine.forget_queue();
                    self.db_error(e).await;
                }
                self.fill(&settings);
            }
            // Claim when the prefetch runs low, and while some queue has a backlog for at
            // least `least` jobs: fewer, fuller claims. At the poll, any free slot is worth one.
            // A rate-limited queue whose budget has a start again: claimed now, whatever the
            // prefetch's least, or a budget of one start at a time would wait for the poll.
            let rate_due = self.rate_due(now);
            let backlog = !self.busy.is_empty();
            let due = backlog && (poll || rate_due || want.jobs >= want.least);
            if now >= self.next_cancel_check {
                self.next_cancel_check = now + CANCEL_CHECK;
                self.check_cancelled().await;
            }
            if want.low && due {
                let claimed = match self.claim(&settings, want.jobs).await {
                    Ok(n) => n,
                    Err(e) => {
                        // Tried again at the next poll, when the probe has looked afresh.
                        self.busy.clear();
                        self.db_error(e).await;
                        0
                    }
                };
                self.fill(&settings);
                // Another claim at once only after one that got jobs: with the link down a
                // claim gets none, and going round again would spin until the reconnect.
                if claimed > 0
                    && !self.busy.is_empty()
                    && self.prefetch.is_empty()
                    && self.slots.len() < worker.concurrency
                {
                    continue;
                }
            } else {
                self.link.keepalive().await;
            }

            let wake = Deadlines {
                now,
                room: self.slots.len() < worker.concurrency,
                probe: self.next_probe,
                rate: self.rate_wait.iter().map(|(_, t)| *t).min(),
                // Outcomes wait for the link when it is down: its reconnect is the deadline then.
                outbox: self.outbox.deadline().filter(|_| self.link.is_up()),
                link: self.link.deadline(),
                holding: !self.slots.is_empty() || !self.prefetch.is_empty(),
                cancel_check: self.next_cancel_check,
            }
            .earliest();
            self.wait(wake, &settings, &shutdown).await;
        }
        // Prefetched jobs never started: back to pending, the attempt given back.
        self.release_prefetched("job released: claimed ahead but not started before the shutdown");
        let timeout = self.settings.borrow().worker.shutdown_timeout;
        self.drain(timeout).await;
    }

    /// The start of a turn: the gauges, the handlers that ended, the fence, the slots'
    /// sweep, the link's reconnect and what it left to read, the heartbeat, the lanes, and the
    /// outbox when due. Returns the turn's time, for what comes due in it.
    async fn tend(&mut self, settings: &Settings) -> Instant {
        let worker = &settings.worker;
        self.counters.slots.store(worker.concurrency, Relaxed);
        self.metrics.handlers.slots.set(worker.concurrency as i64);
        self.metrics
            .database
            .db_up
            .set(i64::from(self.link.is_up()));
        self.metrics
            .database
            .outcomes_pending
            .set(self.outbox.len() as i64);
        while let Some(f) = self.slots.try_finished() {
            self.finished(f);
        }
        self.fence_if_silent();
        self.slots.sweep(settings);
        self.fill(settings);
        self.reconnect_if_due().await;
        self.read_unread(settings).await;
        let now = Instant::now();
        if now >= self.next_stamp && self.link.is_up() {
            self.next_stamp = now + settings.reaper.interval;
            self.stamp(settings).await;
        }
        if self.lanes.due(now) && self.link.is_up() {
            self.refresh_lanes(settings).await;
        }
        if self
            .outbox
            .due(now, worker.batch_size / 2, self.slots.is_empty())
        {
            self.write().await;
        }
        now
    }

    /// The end of a turn: waits for the shutdown, a handler that ends, `wake`, a reload or
    /// the gate's admissions, whichever comes first.
    async fn wait(&mut self, wake: Instant, settings: &Settings, shutdown: &CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            f = self.slots.next_finished(), if !self.slots.is_empty() => {
                self.finished(f);
                self.fill(settings);
            }
            _ = sleep_until(wake) => {}
            // A reload may lift or change a limit: the queues it held back are probed
            // again rather than left out until their old wait ends.
            _ = self.settings.changed() => self.rate_wait.clear(),
            // Jobs the gate admitted are pending now: asked for at this turn, not the
            // next poll.
            _ = self.wakes.admitted.notified() => self.next_probe = Instant::now(),
        }
    }

    /// Starts prefetched jobs while there are free slots.
    fn fill(&mut self, settings: &Settings) {
        while self.slots.len() < settings.worker.concurrency {
            let Some(mut r) = self.prefetch.pop() else {
                break;
            };
            // Claimed before a reload, started after it: the queue's settings of now.
            if let Some(queue) = settings.queue(&r.job.queue) {
                r.queue = queue.clone();
            }
            self.metrics
                .queue(&r.job.queue)
                .started(r.job.due_to_claim + r.job.read_at.elapsed());
            self.slots.start(r, &settings.worker);
        }
        self.counters.running.store(self.slots.len(), Relaxed);
        self.metrics.handlers.busy.set(self.slots.len() as i64);
        self.metrics
            .handlers
            .prefetched
            .set(self.prefetch.len() as i64);
    }

    /// Stamps the heartbeat of the server this instance claims through, unless a reaper on it
    /// did lately. A load balancer may send the reaper's connection to another Galera node
    /// than the consumer's: without this, a node that only consumers use would look unused,
    /// and their claims dead, to every reaper.
    async fn stamp(&mut self, settings: &Settings) {
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return;
        };
        let fresh = settings.reaper.interval / 2;
        match self
            .metrics
            .within(
                Op::Heartbeat,
                limit,
                servers::stamp_unless_fresh(conn, server, fresh),
            )
            .await
        {
            Ok(()) => self.link.wrote(),
            Err(e) => self.db_error(e).await,
        }
    }

    /// Stamps and reads the lanes of the served queues that are not paused (see [`Lanes`]).
    async fn refresh_lanes(&mut self, settings: &Settings) {
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return;
        };
        let queues: Vec<&str> = settings
            .queues
            .iter()
            .map(|q| q.name.as_str())
            .filter(|q| !self.paused.iter().any(|p| p == q))
            .collect();
        let refresh = self.lanes.refresh(conn, server, &self.worker, &queues);
        match self.metrics.within(Op::Heartbeat, limit, refresh).await {
            Ok(()) => self.link.used(),
            Err(e) => self.db_error(e).await,
        }
    }
}

/// What the loop waits for at the end of a turn, besides a handler that ends, a reload and
/// the gate's admissions: the earliest of these, and at the latest one [`TURN`] on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    pub now: Instant,
    /// A handler slot is free: the probe, and the budgets of rate-limited queues, matter
    /// only then (a handler that ends wakes the loop).
    pub room: bool,
    /// The next probe.
    pub probe: Instant,
    /// When the first rate-limited queue held back has a start again.
    pub rate: Option<Instant>,
    /// The outbox's next write, while the link is up.
    pub outbox: Option<Instant>,
    /// The link's next need: a ping when up, a reconnect when down.
    pub link: Instant,
    /// Jobs run or wait to start: the cancel check matters.
    pub holding: bool,
    pub cancel_check: Instant,
}

impl Deadlines {
    pub(super) fn earliest(&self) -> Instant {
        let mut wake = self.now + TURN;
        if self.room {
            wake = wake.min(self.probe);
            if let Some(t) = self.rate {
                wake = wake.min(t);
            }
        }
        if let Some(t) = self.outbox {
            wake = wake.min(t);
        }
        wake = wake.min(self.link);
        if self.holding {
            wake = wake.min(self.cancel_check);
        }
        wake
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(now: Instant) -> Deadlines {
        let far = now + Duration::from_secs(3600);
        Deadlines {
            now,
            room: true,
            probe: far,
            rate: None,
            outbox: None,
            link: far,
            holding: false,
            cancel_check: far,
        }
    }

    #[test]
    fn the_loop_turns_at_least_once_a_turn() {
        let now = Instant::now();
        assert_eq!(idle(now).earliest(), now + TURN);
    }

    #[test]
    fn the_probe_and_rate_budgets_wake_only_with_room_for_a_job() {
        let now = Instant::now();
        let soon = now + Duration::from_millis(50);
        let probe = Deadlines {
            probe: soon,
            ..idle(now)
        };
        assert_eq!(probe.earliest(), soon);
        assert_eq!(
            Deadlines {
                room: false,
                ..probe
            }
            .earliest(),
            now + TURN
        );
        let rate = Deadlines {
            rate: Some(soon),
            ..idle(now)
        };
        assert_eq!(rate.earliest(), soon);
        assert_eq!(
            Deadlines {
                room: false,
                ..rate
            }
            .earliest(),
            now + TURN
        );
    }

    #[test]
    fn the_cancel_check_wakes_only_while_jobs_are_held() {
        let now = Instant::now();
        let soon = now + Duration::from_millis(50);
        let check = Deadlines {
            cancel_check: soon,
            ..idle(now)
        };
        assert_eq!(check.earliest(), now + TURN);
        assert_eq!(
            Deadlines {
                holding: true,
                ..check
            }
            .earliest(),
            soon
        );
    }

    #[test]
    fn the_outbox_and_the_link_always_wake() {
        let now = Instant::now();
        let soon = now + Duration::from_millis(20);
        let later = now + Duration::from_millis(40);
        let d = Deadlines {
            room: false,
            outbox: Some(later),
            link: soon,
            ..idle(now)
        };
        assert_eq!(d.earliest(), soon);
        assert_eq!(
            Deadlines {
                link: now + TURN,
                ..d
            }
            .earliest(),
            later
        );
    }
}
