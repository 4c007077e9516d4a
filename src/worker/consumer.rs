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
use crate::db::{self, Failure, ServerId};
use crate::error::chain;
use crate::gate::Wakes;
use crate::logging::job_span;
use crate::metrics::{self, Metrics, Op};
use crate::stats::Stats;
use crate::store::jobs::keys::Referee;
use crate::store::jobs::{self, Claimer, Completion, Outcome};
use crate::store::servers;
use crate::worker::handoff;
use crate::worker::lanes::Lanes;
use crate::worker::link::{Fresh, Link};
use crate::worker::name::WorkerName;
use crate::worker::outbox::Outbox;
use crate::worker::prefetch::{Prefetch, Ready};
use crate::worker::rate;
use crate::worker::slots::{Finished, Slots};

/// After a shutdown, how long myjob keeps trying to write the last outcomes.
const FINAL_WRITE: Duration = Duration::from_secs(10);
/// A healthy loop turns at least this often, for the watchdog (see [`Stats::beat`]).
const TURN: Duration = Duration::from_secs(1);
/// While the account may not read the paused queues, the probe asks again once in this many.
const PAUSES_RETRY: u32 = 20;
/// While jobs run, how often the consumer asks whether an operator cancelled one. The
/// question stands in for the keepalive's ping, so it costs a query only under load.
const CANCEL_CHECK: Duration = Duration::from_secs(1);

pub struct Consumer {
    settings: watch::Receiver<Arc<Settings>>,
    metrics: Arc<Metrics>,
    /// `host:pid:instance` (see [`WorkerName`]), written into claimed rows.
    worker: String,
    stats: Arc<Stats>,
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
    /// The account may not read the paused queues: said once, and asked again only every
    /// [`PAUSES_RETRY`] probes.
    pauses_denied: Option<u32>,
    /// When to ask next about cancelled jobs (see [`CANCEL_CHECK`]).
    next_cancel_check: Instant,
    /// The quarantine slot: the batch of the one suspect this instance holds, until its
    /// outcome is written (see [`jobs::claim_suspect`]). A suspect is a job that was held at
    /// two deaths of its workers; while it runs here no other suspect does, so that if this
    /// instance dies, the reaper knows which job to charge.
    quarantine: Option<u64>,
    /// A queue the last probe found a suspect in, while the quarantine slot was free. Claimed
    /// from whenever the slot and a handler slot are free, until a claim comes back empty:
    /// suspects follow each other without waiting for a poll.
    suspects: Option<String>,
    /// Batches claimed (the claim committed) whose read-back failed: this instance's jobs,
    /// re-owned at the reconnect and read then (see [`Consumer::read_unread`]), rather than
    /// left to the reaper as a dead worker's.
    unread: Vec<u64>,
    /// When to stamp the heartbeat of the server this instance claims through next (see
    /// [`Consumer::stamp`]).
    next_stamp: Instant,
    /// On a Galera node, the part of each queue's head this instance claims first.
    lanes: Lanes,
    /// Running jobs whose claim was gone at a reconnect (see [`Consumer::adopt`]): their
    /// handlers were stopped, and their end is logged as that, not as an operator's cancel.
    lost: Vec<u64>,
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
        stats: Arc<Stats>,
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
            stats,
            link: Link::new(db, connected),
            prefetch: Prefetch::new(now),
            slots: Slots::new(&name.instance, metrics.clone()),
            outbox: Outbox::default(),
            busy: Vec::new(),
            next_probe: now,
            paused: Vec::new(),
            pauses_denied: None,
            next_cancel_check: now,
            quarantine: None,
            suspects: None,
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
            self.stats.beat();
            let settings = self.settings.borrow_and_update().clone();
            let worker = &settings.worker;
            self.stats.slots.store(worker.concurrency, Relaxed);
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
            self.slots.sweep(&settings);
            self.fill(&settings);
            self.reconnect_if_due().await;
            self.read_unread(&settings).await;
            let now = Instant::now();
            if now >= self.next_stamp && self.link.is_up() {
                self.next_stamp = now + settings.reaper.interval;
                self.stamp(&settings).await;
            }
            if self.lanes.due(now) && self.link.is_up() {
                self.refresh_lanes(&settings).await;
            }
            if self
                .outbox
                .due(now, worker.batch_size / 2, self.slots.is_empty())
            {
                self.write().await;
            }

            let want = self.prefetch.want(now, self.slots.len(), worker);
            // At the poll, with room for a job, ask which queues have pending jobs: queues
            // drained since, or idle until now, get their turn again.
            let poll = want.low && want.jobs > 0 && now >= self.next_probe;
            if poll {
                self.next_probe = now + worker.poll_interval;
                self.probe(&settings).await;
            }
            // A suspect first, into a free slot at once: never prefetched behind other jobs.
            if self.suspects.is_some()
                && self.prefetch.is_empty()
                && self.slots.len() < worker.concurrency
                && self.quarantine_free()
            {
                if let Err(e) = self.claim_suspect(&settings).await {
                    self.suspects = None;
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

            let mut wake = now + TURN;
            // The probe is due only with room for a job; a handler that ends wakes the loop.
            if self.slots.len() < worker.concurrency {
                wake = wake.min(self.next_probe);
                if let Some(t) = self.rate_wait.iter().map(|(_, t)| *t).min() {
                    wake = wake.min(t);
                }
            }
            // Outcomes wait for the link when it is down: its reconnect is the deadline then.
            if let Some(t) = self.outbox.deadline().filter(|_| self.link.is_up()) {
                wake = wake.min(t);
            }
            wake = wake.min(self.link.deadline());
            if !self.slots.is_empty() || !self.prefetch.is_empty() {
                wake = wake.min(self.next_cancel_check);
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                f = self.slots.next_finished(), if !self.slots.is_empty() => {
                    self.finished(f);
                    self.fill(&settings);
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
        // Prefetched jobs never started: back to pending, the attempt given back.
        self.release_prefetched("job released: claimed ahead but not started before the shutdown");
        let timeout = self.settings.borrow().worker.shutdown_timeout;
        self.drain(timeout).await;
    }

    /// The database has not answered for the link's fence (a partition, a host cut off, a
    /// server down for long): every running handler is killed at once and its job released,
    /// as are the jobs claimed ahead. The server drops a connection it has not heard from
    /// for the session's `wait_timeout`, longer than this, and the reaper then puts the
    /// claims back for another worker: a handler still running here would run beside its
    /// job's next run. When the server is up and turns the reconnects down, the fence is
    /// shorter (see [`Link::refused_fence`]). The releases wait for the connection; fenced by
    /// batch_id, they change nothing once the reaper was first.
    fn fence_if_silent(&mut self) {
        if self.slots.is_empty() && self.prefetch.is_empty() {
            return;
        }
        let interval = self.settings.borrow().reaper.interval;
        let fence = self
            .link
            .refused_fence(interval)
            .unwrap_or(self.link.fence());
        let silent = self.link.silent_for();
        if silent < fence {
            return;
        }
        let ahead = self.prefetch.take_all();
        error!(
            running = self.slots.len(),
            claimed_ahead = ahead.len(),
            "consumer: no answer from the database for {}s: killing the running handlers and releasing their jobs, which the server will soon hand to another worker",
            silent.as_secs()
        );
        self.slots.fence();
        for r in ahead {
            self.outbox.release(r.job.id, r.batch_id, r.span());
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
        self.stats.running.store(self.slots.len(), Relaxed);
        self.metrics.handlers.busy.set(self.slots.len() as i64);
        self.metrics
            .handlers
            .prefetched
            .set(self.prefetch.len() as i64);
    }

    /// The stop path: no new claims; running handlers get `timeout` to finish, then are
    /// killed and their jobs released without using up an attempt; persistent processes get
    /// EOF on stdin once their job is answered, and the same `timeout` to exit; every outcome
    /// is written, with a few more seconds of reconnecting if the database is away.
    async fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.slots.stop_processes();
        if !self.slots.is_empty() {
            info!(
                running = self.slots.len(),
                "draining: waiting up to {} for running handlers",
                humantime::format_duration(timeout)
            );
        }
        let mut aborted = false;
        while !self.slots.is_empty() || self.slots.processes_leaving() {
            self.stats.beat();
            // The link is tended as in the main loop, a drop noticed within a second and the
            // claims re-owned on a new connection: a deploy is when a server or a proxy is
            // also restarted, and a claim whose connection is gone would be put back by
            // another instance's reaper and run again beside the handler still running here.
            let wake = self.link.deadline().min(self.next_cancel_check);
            tokio::select! {
                f = self.slots.next_in_drain() => if let Some(f) = f { self.finished(f) },
                _ = sleep_until(deadline), if !aborted => {
                    warn!(running = self.slots.len(), "shutdown_timeout passed: killing the handlers still running");
                    self.slots.abort();
                    aborted = true;
                }
                _ = sleep_until(wake) => {}
            }
            if Instant::now() >= self.next_cancel_check {
                self.next_cancel_check = Instant::now() + CANCEL_CHECK;
                self.check_cancelled().await;
            }
            self.link.keepalive().await;
            self.write_or_reconnect().await;
            self.fence_if_silent();
        }
        let give_up = Instant::now() + FINAL_WRITE;
        self.release_unread().await;
        while !(self.outbox.is_empty() && self.unread.is_empty()) && Instant::now() < give_up {
            // The reconnect when the link is down; the pause after a lost race when it is up.
            let next = match self.link.is_up() {
                true => self.outbox.deadline(),
                false => Some(self.link.deadline()),
            };
            if let Some(t) = next {
                sleep_until(t.min(give_up)).await;
            }
            self.write_or_reconnect().await;
            self.release_unread().await;
        }
        if !(self.outbox.is_empty() && self.unread.is_empty()) {
            error!(
                jobs = self.outbox.len(),
                unread_batches = self.unread.len(),
                "cannot write the last outcomes; the reaper will put these jobs back"
            );
        }
        self.link.close().await;
    }

    /// The stop path's part of [`Consumer::read_unread`]: batches claimed whose read-back
    /// failed are read once the link is back, and their jobs released at once, rather than
    /// left claimed for the reaper (which would count them as a dead worker's).
    async fn release_unread(&mut self) {
        if self.unread.is_empty() {
            return;
        }
        let settings = self.settings.borrow().clone();
        self.read_unread(&settings).await;
        self.release_prefetched(
            "job released: claimed before the connection broke, and the shutdown came first",
        );
    }

    /// Every prefetched job back to pending at the shutdown, its attempt given back, each
    /// logged with `why`.
    fn release_prefetched(&mut self, why: &str) {
        for r in self.prefetch.take_all() {
            let span = r.span();
            span.in_scope(|| info!(job_id = r.job.id, "{why}"));
            self.outbox.release(r.job.id, r.batch_id, span);
        }
    }

    /// While jobs run or wait to start: asks which of them an operator cancelled, stops the
    /// handlers of those running, and drops those waiting. It stands in for the keepalive.
    async fn check_cancelled(&mut self) {
        if self.slots.is_empty() && self.prefetch.is_empty() {
            return;
        }
        let limit = self.link.limit();
        let Some(conn) = self.link.conn() else {
            return;
        };
        let mut batches: Vec<u64> = self
            .slots
            .batches()
            .chain(self.prefetch.batches())
            .collect();
        batches.sort_unstable();
        batches.dedup();
        match self
            .metrics
            .within(Op::Cancelled, limit, jobs::cancelled(conn, &batches))
            .await
        {
            Ok(ids) => {
                self.link.succeeded();
                if ids.is_empty() {
                    return;
                }
                self.slots.cancel(&ids);
                for r in self.prefetch.drop_jobs(&ids) {
                    r.span()
                        .in_scope(|| info!(job_id = r.job.id, "job cancelled before its start"));
                    // Said as for a handler stopped: the row's owner is cleared, which frees
                    // its concurrency-key slot, handed on once written.
                    let seen = Completion {
                        job_id: r.job.id,
                        batch_id: r.batch_id,
                        outcome: Outcome::Cancelled,
                        slot: r.job.slot.clone(),
                    };
                    self.outbox.push(seen, None, r.span());
                }
            }
            Err(e) => self.db_error(e).await,
        }
    }

    /// Asks which served queues have pending jobs, and which queues are paused (one statement
    /// for all of them), and makes the busy ones that are not paused the ones claims go to.
    /// On an error the claims wait for the next poll, and the last paused list stands. An
    /// account without SELECT on `myjob_queues` (GRANTs from before the table existed) gets
    /// one error line and goes on claiming every queue: the jobs run, though pauses go unseen.
    async fn probe(&mut self, settings: &Settings) {
        const ER_TABLEACCESS_DENIED: u16 = 1142;
        self.busy.clear();
        let quarantine_free = self.quarantine_free();
        let limit = self.link.limit();
        let Some(conn) = self.link.conn() else {
            return;
        };
        let served: Vec<&str> = settings.queues.iter().map(|q| q.name.as_str()).collect();
        // Suspects only for a free quarantine slot, and of the queues not known paused.
        let suspects: Vec<&str> = match quarantine_free {
            true => served
                .iter()
                .copied()
                .filter(|q| !self.paused.iter().any(|p| p == q))
                .collect(),
            false => Vec::new(),
        };
        let pauses = match self.pauses_denied.as_mut() {
            None => true,
            Some(probes) => {
                *probes += 1;
                *probes % PAUSES_RETRY == 0
            }
        };
        let mut found = self
            .metrics
            .within(
                Op::Probe,
                limit,
                jobs::probe(conn, &served, pauses, &suspects),
            )
            .await;
        if let Err(e) = &found {
            if db::server_code(e) == Some(ER_TABLEACCESS_DENIED) {
                if self.pauses_denied.is_none() {
                    error!("consumer: {}; claiming every queue, paused or not (GRANT SELECT ON the database's myjob_queues to this account)", chain(&**e));
                    self.pauses_denied = Some(0);
                }
                self.paused.clear();
                found = self
                    .metrics
                    .within(
                        Op::Probe,
                        limit,
                        jobs::probe(conn, &served, false, &suspects),
                    )
                    .await;
            }
        }
        match found {
            Ok(probe) => {
                self.link.succeeded();
                if let Some(paused) = probe.paused {
                    self.pauses_denied = None;
                    if paused != self.paused {
                        info!(paused = ?paused, "paused queues changed");
                        self.paused = paused;
                    }
                }
                let paused = &self.paused;
                let rate_wait = &self.rate_wait;
                self.busy = probe.busy;
                self.busy.retain(|q| {
                    !paused.contains(q) && !rate_wait.iter().any(|(held, _)| held == q)
                });
                self.suspects = probe.suspects.filter(|q| !paused.contains(q));
                if probe.blocked {
                    self.wakes.blocked.notify_one();
                }
            }
            Err(e) => self.db_error(e).await,
        }
    }

    /// Claims up to `want` jobs into the prefetch, one statement per busy queue. Each busy
    /// queue is offered an even share of what is still wanted, starting one queue further
    /// each time; a queue that comes back short is drained and leaves the busy list, and
    /// what it left is offered again to the queues that filled their share. So the claim
    /// comes back short only when every served queue is drained. Returns how many it got.
    async fn claim(&mut self, settings: &Settings, want: usize) -> anyhow::Result<usize> {
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return Ok(0);
        };
        let batch_id = jobs::new_batch_id();
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
        let mut left = want;
        // Each queue's claim commits by itself: when one fails, what the others claimed is
        // read all the same, or it would sit claimed by a live connection, never run.
        let mut failed = None;
        // Each round either fills `left` or drains at least one queue: at most one round
        // per busy queue, and one when every queue has plenty.
        'rounds: while left > 0 && !self.busy.is_empty() {
            let mut k = 0;
            let mut offered = self.busy.len();
            while k < self.busy.len() && left > 0 {
                let share = left.div_ceil(offered);
                offered -= 1;
                let queue = &self.busy[k];
                let lane = self.lanes.of(queue);
                let claimed = match settings.queue(queue).and_then(|q| q.rate) {
                    None => {
                        let claim = jobs::claim(conn, batch_id, queue, share, &who, lane);
                        let n = self.metrics.within(Op::Claim, limit, claim).await;
                        n.map(|claimed| rate::Limited {
                            claimed,
                            wait: None,
                        })
                    }
                    Some(rate) => {
                        let claim = rate::claim(conn, batch_id, queue, &rate, share, &who, lane);
                        self.metrics.within(Op::Claim, limit, claim).await
                    }
                };
                if let Ok(got) = &claimed {
                    self.metrics.queue(queue).claimed(got.claimed > 0);
                    // Tried with room for jobs, whatever it got: this instance keeps its
                    // lane while it has room, even when the jobs of now are other lanes'.
                    self.lanes.claimed(queue);
                }
                match claimed {
                    Ok(rate::Limited {
                        claimed: n,
                        wait: Some(wait),
                        ..
                    }) => {
                        left -= n;
                        let queue = self.busy.remove(k);
                        self.rate_wait.push((queue, Instant::now() + wait));
                    }
                    Ok(rate::Limited { claimed: n, .. }) if n < share => {
                        left -= n;
                        self.busy.remove(k);
                    }
                    Ok(rate::Limited { claimed: n, .. }) => {
                        left -= n;
                        k += 1;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break 'rounds;
                    }
                }
            }
        }
        if left == want {
            return match failed {
                Some(e) => {
                    // The connection broke on an UPDATE that may have committed: its jobs
                    // would be claimed by this instance with nobody to run them. Read back
                    // after the reconnect (an empty batch reads as nothing). An error the
                    // server sent says the statement did not commit.
                    if db::classify(&e) == Failure::Connection && db::server_code(&e).is_none() {
                        self.unread.push(batch_id);
                    }
                    self.link.used();
                    Err(e)
                }
                // Nothing claimed. Not proof that the server takes writes: a claim that read
                // no due job sends no UPDATE (nor a lane that picked none), and on a
                // read-only server each poll would say it takes writes again, then not.
                None => {
                    self.link.succeeded();
                    Ok(0)
                }
            };
        }
        let claimed = match self
            .metrics
            .within(
                Op::ReadBatch,
                limit,
                jobs::read_batch(conn, batch_id, settings.worker.max_payload_bytes),
            )
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                self.unread.push(batch_id);
                return Err(e);
            }
        };
        self.link.used();
        self.stats.claimed();
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            self.metrics.attempts.last_claim.set(now.as_secs_f64());
        }
        debug!(batch_id, jobs = claimed.len(), "claimed a batch");
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

    /// Puts the rate-limited queues whose budget has a start again back among the busy ones.
    /// Returns whether there was any.
    fn rate_due(&mut self, now: Instant) -> bool {
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
    fn take(&mut self, settings: &Settings, batch_id: u64, claimed: Vec<jobs::ClaimedJob>) {
        for job in claimed {
            let span = job_span(job.id, &job.queue, job.attempt, Some(batch_id));
            let _in_job = span.enter();
            // Claimed by its exact name, so the lookup finds it; a claim that cannot be
            // started all the same goes back at once rather than sit claimed.
            let Some(queue) = settings.queue(&job.queue).cloned() else {
                warn!(job_id = job.id, queue = %job.queue, "job released: claimed for a queue this instance does not serve");
                self.outbox.release(job.id, batch_id, span.clone());
                continue;
            };
            if self.quarantine == Some(batch_id) {
                info!(
                    job_id = job.id,
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

    /// Reads back the batches whose read-back failed (see `unread`), once the link is up
    /// again and has re-owned them: their jobs run as if the claim had just been made.
    async fn read_unread(&mut self, settings: &Settings) {
        while let Some(&batch_id) = self.unread.first() {
            let limit = self.link.limit();
            let Some(conn) = self.link.conn() else {
                return;
            };
            match self
                .metrics
                .within(
                    Op::ReadBatch,
                    limit,
                    jobs::read_batch(conn, batch_id, settings.worker.max_payload_bytes),
                )
                .await
            {
                Ok(claimed) => {
                    self.link.succeeded();
                    self.unread.remove(0);
                    // A claim that broke before it committed reads back empty.
                    if !claimed.is_empty() {
                        info!(
                            batch_id,
                            jobs = claimed.len(),
                            "consumer: read back the batch claimed before the connection broke"
                        );
                    }
                    self.take(settings, batch_id, claimed);
                }
                Err(e) => return self.db_error(e).await,
            }
        }
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

    /// Whether the quarantine slot is free: its suspect, if any, is no longer running, waiting
    /// or waiting for its outcome to be written. Until the outcome is written the row still
    /// says claimed, and a death would charge it.
    fn quarantine_free(&mut self) -> bool {
        let Some(batch) = self.quarantine else {
            return true;
        };
        let held = self
            .slots
            .batches()
            .chain(self.prefetch.batches())
            .chain(self.outbox.batches())
            .chain(self.unread.iter().copied())
            .any(|b| b == batch);
        if !held {
            self.quarantine = None;
        }
        !held
    }

    /// Claims one suspect of the queue the probe found one in, under a batch of its own, into
    /// the quarantine slot; with none left there, that queue is done with until the next
    /// probe finds another.
    async fn claim_suspect(&mut self, settings: &Settings) -> anyhow::Result<()> {
        let Some(queue) = self.suspects.clone() else {
            return Ok(());
        };
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return Ok(());
        };
        if settings.queue(&queue).is_none() {
            self.suspects = None;
            return Ok(());
        }
        let batch_id = jobs::new_batch_id();
        let who = Claimer {
            owner_server: server,
            worker: &self.worker,
        };
        if !self
            .metrics
            .within(
                Op::Claim,
                limit,
                jobs::claim_suspect(conn, batch_id, &queue, &who),
            )
            .await?
        {
            self.link.used();
            self.suspects = None;
            return Ok(());
        }
        // Claimed: the quarantine slot is its from now, read back or not.
        self.quarantine = Some(batch_id);
        let claimed = match self
            .metrics
            .within(
                Op::ReadBatch,
                limit,
                jobs::read_batch(conn, batch_id, settings.worker.max_payload_bytes),
            )
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                self.unread.push(batch_id);
                return Err(e);
            }
        };
        self.link.succeeded();
        self.take(settings, batch_id, claimed);
        Ok(())
    }

    /// A handler ended: log its outcome and keep it for the next write.
    fn finished(&mut self, f: Finished) {
        self.prefetch.completed();
        // Whatever it ended with, a job stopped at a reconnect is no longer awaited.
        let lost = match self.lost.iter().position(|&id| id == f.completion.job_id) {
            Some(i) => {
                self.lost.swap_remove(i);
                true
            }
            None => false,
        };
        self.stats.running.store(self.slots.len(), Relaxed);
        let (job_id, attempt) = (f.completion.job_id, f.attempt);
        // Counted by outcome once written (see `Outbox`): a fenced write that matches no row
        // is a lost attempt, whatever its handler said.
        let ended = match &f.completion.outcome {
            Outcome::Done => metrics::Outcome::Done,
            Outcome::Retry { .. } => metrics::Outcome::Retried,
            Outcome::Fail { .. } => metrics::Outcome::Failed,
            Outcome::Release => metrics::Outcome::Released,
            Outcome::Cancelled => metrics::Outcome::Cancelled,
        };
        let queue = self.metrics.queue(&f.queue);
        if let Some(ran_for) = f.ran_for {
            queue.ran(ran_for);
        }
        self.metrics.handlers.busy.set(self.slots.len() as i64);
        let _in_job = f.span.enter();
        match &f.completion.outcome {
            _ if lost => info!(
                job_id,
                attempt, "job's handler ended: its claim had been put back"
            ),
            Outcome::Done => {
                self.stats.done.fetch_add(1, Relaxed);
                info!(job_id, attempt, "job done");
            }
            Outcome::Retry { delay, error } => {
                self.stats.retried.fetch_add(1, Relaxed);
                // To the millisecond: "8s 731ms", not "8s 730ms 944us 851ns".
                let retry_in = Duration::from_millis(delay.as_millis() as u64);
                warn!(job_id, attempt, retry_in = %humantime::format_duration(retry_in), "job failed, will retry: {}", jobs::fit_error(error));
            }
            Outcome::Fail { error } => {
                self.stats.failed.fetch_add(1, Relaxed);
                error!(target: "myjob::msg::failed", job_id, attempt, "job failed: {}", jobs::fit_error(error));
            }
            Outcome::Release => info!(
                job_id,
                attempt, "job released: cut short by the shutdown, the attempt does not count"
            ),
            Outcome::Cancelled => info!(job_id, attempt, "job cancelled: its handler was stopped"),
        }
        drop(_in_job);
        self.outbox.push(f.completion, Some((queue, ended)), f.span);
    }

    /// Writes the outbox; on an error the outcomes stay for the next write.
    async fn write(&mut self) {
        // Nothing to write is not a statement that succeeded: the keepalive still pings.
        if self.outbox.is_empty() {
            return;
        }
        let limit = self.link.limit();
        let Some(conn) = self.link.conn() else {
            return;
        };
        match self
            .metrics
            .within(Op::Outcomes, limit, self.outbox.write(conn))
            .await
        {
            Ok(()) => self.link.wrote(),
            Err(e) => return self.db_error(e).await,
        }
        self.hand_on().await;
    }

    /// Hands the slots the written outcomes gave up on to their keys' next blocked jobs (see
    /// [`handoff`]), and claims from the queues that got one at the next turn. A hand-off
    /// that fails is left to the gate, which admits the job within a poll.
    async fn hand_on(&mut self) {
        let freed = self.outbox.take_freed();
        if freed.is_empty() {
            return;
        }
        let settings = self.settings.borrow().clone();
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return;
        };
        let referee = ServerId::parse(server).map_or(Referee::Index, |s| Referee::of(&s));
        let handed = handoff::hand_on(conn, referee, &settings, &freed);
        match self.metrics.within(Op::HandOff, limit, handed).await {
            Ok(queues) => {
                for queue in queues {
                    let held = self.rate_wait.iter().any(|(q, _)| *q == queue)
                        || self.paused.contains(&queue);
                    if !held && !self.busy.contains(&queue) {
                        self.busy.push(queue);
                    }
                }
            }
            Err(e) => {
                debug!(
                    "consumer: handing slots on: {}; the gate admits their next jobs",
                    chain(&*e)
                );
                if db::classify(&e) == Failure::Connection {
                    self.link.lost(&e);
                }
            }
        }
    }

    /// A statement failed: what comes next depends on what the error says of the connection.
    /// A lost race (a deadlock, a Galera certification conflict, a lock wait timeout) or a
    /// statement the server refuses keeps the connection: the loop goes on, and the outbox
    /// writes again after a short random pause (a claim is tried again at its next turn).
    /// Anything else drops the connection.
    async fn db_error(&mut self, e: anyhow::Error) {
        if db::classify(&e) == Failure::Connection {
            self.link.lost(&e);
            return;
        }
        warn!(
            "consumer: {}; trying again on the same connection",
            chain(&*e)
        );
        // A deadlock has rolled the transaction back, a lock wait timeout only the statement.
        let limit = self.link.limit();
        if let Some(conn) = self.link.conn() {
            let rollback = async {
                conn.query_drop("ROLLBACK")
                    .await
                    .map_err(|e| anyhow::anyhow!(db::describe(&e)))
            };
            if let Err(e) = self.metrics.within(Op::Rollback, limit, rollback).await {
                self.link.lost(&e);
                return;
            }
        }
        self.outbox.lost_race();
    }

    /// Writes the outbox, connecting first if the link is down and an attempt is due.
    async fn write_or_reconnect(&mut self) {
        self.reconnect_if_due().await;
        self.write().await;
    }

    /// When the link is down and its backoff has passed, one attempt to connect. A new
    /// connection first adopts the claims this instance still holds, so the reaper does not
    /// take them from running handlers.
    async fn reconnect_if_due(&mut self) {
        if self.link.is_up() {
            return;
        }
        self.stats.beat();
        let stale_after = self.settings.borrow().reaper.stale_after;
        let Some(mut fresh) = self.link.connect_if_due(stale_after).await else {
            return;
        };
        let limit = self.link.limit();
        let metrics = self.metrics.clone();
        match metrics
            .within(Op::Adopt, limit, self.adopt(&mut fresh))
            .await
        {
            Ok(adopted) => self.link.install(fresh, adopted),
            Err(e) => self.link.failed(&e.context("setting up the connection")),
        }
    }

    /// Re-owns this instance's claims on a new connection, and lets go of those the reaper
    /// took while the connection was away: they are someone else's now. A prefetched job is
    /// dropped; a running one has its handler's process group killed at once (the job may
    /// already run elsewhere: no grace), so that it does not run beside the job's next run. (Its outcome is still written, fenced by batch_id: it
    /// changes nothing of a claim that is gone.) On a Galera node these statements wait for
    /// the cluster, so that a put-back committed through another node is seen.
    async fn adopt(&mut self, fresh: &mut Fresh) -> anyhow::Result<u64> {
        let mut batches: Vec<u64> = self
            .slots
            .batches()
            .chain(self.prefetch.batches())
            .chain(self.outbox.batches())
            .chain(self.unread.iter().copied())
            .collect();
        batches.sort_unstable();
        batches.dedup();
        let galera = db::causal(&mut fresh.conn, db::Causal::Everything).await?;
        let adopted = jobs::adopt(&mut fresh.conn, &batches, &fresh.server).await?;
        let running = self.slots.claims();
        let mut claims = self.prefetch.claims();
        claims.extend_from_slice(&running);
        let held = jobs::still_claimed(&mut fresh.conn, &claims).await?;
        if galera {
            db::causal_off(&mut fresh.conn).await?;
        }
        for r in self.prefetch.keep_only(&held) {
            r.span().in_scope(|| {
                warn!(
                    job_id = r.job.id,
                    "job dropped before its start: its claim was put back while the connection was away"
                )
            });
        }
        let gone: Vec<u64> = running
            .iter()
            .map(|c| c.0)
            .filter(|id| !held.contains(id))
            .collect();
        for &job_id in &gone {
            self.slots.span_of(job_id).in_scope(|| {
                warn!(
                    job_id,
                    "job's handler stopped: its claim was put back while the connection was away, for another worker to run"
                )
            });
        }
        self.slots.kill(&gone);
        self.lost.extend(gone);
        Ok(adopted)
    }
}
