//! The consumer: one per instance. It owns the connection whose `CONNECTION_ID()` marks its
//! claims as alive, claims as many due jobs as it has free handler slots, starts a handler for
//! each, and writes their outcomes back, fenced by batch_id.
//!
//! Why one claimer per instance rather than one per slot: claimers racing for the head of the
//! queue wait on each other's row locks, and throughput falls as they are added. One claimer
//! per instance keeps one connection per instance in the race.
//!
//! Claims are sized to the free slots plus a small prefetch: the jobs the instance will start
//! within the next [`PREFETCH_HORIZON`] at its recent completion rate. A slot that frees up is
//! refilled at once from the prefetch, without waiting for a round trip to the database, while
//! slow jobs (a low rate) get no prefetch, so an instance never sits on jobs that another could
//! start. A shutdown releases the prefetched jobs without using up an attempt.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::sync::{oneshot, watch};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{DatabaseSettings, QueueSettings, Settings};
use crate::db::{self, Failure, ServerId};
use crate::handler::{self, Exit};
use crate::jobs::{self, Claimer, Outcome, Write};
use crate::retry;
use crate::stats::Stats;

/// How long the claim connection may sit without a query before it is pinged, so that a
/// server's `wait_timeout` never closes it under a long-running handler.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// After a shutdown, how long myjob keeps trying to write the last outcomes.
const FINAL_WRITE: Duration = Duration::from_secs(10);
/// How far ahead the prefetch looks: the jobs the instance finishes in this long, at its
/// recent rate, are claimed ahead of a free slot (at most `batch_size`).
const PREFETCH_HORIZON: Duration = Duration::from_millis(100);
/// Outcomes are written together: once half a batch has finished, once the oldest has waited
/// this long, or when nothing is running. Each write is a commit (an fsync on the server),
/// so one per finished handler would cost more than the claims.
const WRITE_AFTER: Duration = Duration::from_millis(10);
/// How often the completion rate is re-estimated.
const RATE_WINDOW: Duration = Duration::from_millis(250);

/// Completions per second, smoothed over a few windows.
struct Rate {
    count: u64,
    since: Instant,
    per_sec: f64,
}

impl Rate {
    fn new() -> Self {
        Rate {
            count: 0,
            since: Instant::now(),
            per_sec: 0.0,
        }
    }

    /// How many jobs to hold ready beyond the free slots.
    fn prefetch(&mut self, now: Instant, batch_size: usize) -> usize {
        let elapsed = now.duration_since(self.since);
        if elapsed >= RATE_WINDOW {
            let recent = self.count as f64 / elapsed.as_secs_f64();
            self.per_sec = (self.per_sec + recent) / 2.0;
            self.count = 0;
            self.since = now;
        }
        ((self.per_sec * PREFETCH_HORIZON.as_secs_f64()) as usize).min(batch_size)
    }
}

/// A claimed job waiting for a slot.
struct Ready {
    job: jobs::ClaimedJob,
    batch_id: u64,
    queue: Arc<QueueSettings>,
}

/// What the consumer remembers about a running handler, by its task id: enough to write an
/// outcome even if the task itself died.
struct Running {
    job_id: u64,
    batch_id: u64,
    attempt: u32,
    max_attempts: u32,
    queue: Arc<QueueSettings>,
}

pub struct Consumer {
    db: DatabaseSettings,
    settings: watch::Receiver<Arc<Settings>>,
    instance: String,
    /// `host:pid:instance`, written into claimed rows.
    worker: String,
    stats: Arc<Stats>,
    conn: Option<Conn>,
    /// `owner_server` for claims made on `conn`.
    server: String,
    /// While `conn` is None: when to try connecting again, and the wait after a failure. The
    /// loop keeps turning meanwhile: handlers finish, prefetched jobs start, outcomes wait.
    reconnect_at: Instant,
    backoff: db::Backoff,
    last_query: Instant,
    handlers: JoinSet<Write>,
    running: HashMap<Id, Running>,
    /// Claimed jobs not started yet: the prefetch.
    ready: VecDeque<Ready>,
    rate: Rate,
    /// Outcomes not yet written (the database may be away), and when the oldest came in.
    unwritten: Vec<Outcome>,
    unwritten_since: Option<Instant>,
    /// Fired when the shutdown runs out of time: kills every handler still running.
    abort: CancellationToken,
    /// Which queue the next claim starts with: each claim starts one further, so that when
    /// every queue has a backlog none waits behind the others.
    rotation: usize,
    /// When the stager runs next (see [`jobs::stage`]): once per `poll_interval`.
    next_stage: Instant,
    /// Not before then: the last write lost a race (see [`Consumer::db_error`]).
    write_again_at: Instant,
    /// Told once the first connection is up and the server's identity read: the daemon sends
    /// READY=1 only then.
    connected: Option<oneshot::Sender<()>>,
}

impl Consumer {
    pub fn new(
        db: DatabaseSettings,
        settings: watch::Receiver<Arc<Settings>>,
        instance: &str,
        stats: Arc<Stats>,
        connected: oneshot::Sender<()>,
    ) -> Self {
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        Consumer {
            db,
            settings,
            instance: instance.to_owned(),
            worker: format!("{host}:{}:{instance}", std::process::id()),
            stats,
            conn: None,
            server: String::new(),
            reconnect_at: Instant::now(),
            backoff: db::Backoff::default(),
            last_query: Instant::now(),
            handlers: JoinSet::new(),
            running: HashMap::new(),
            ready: VecDeque::new(),
            rate: Rate::new(),
            unwritten: Vec::new(),
            unwritten_since: None,
            abort: CancellationToken::new(),
            rotation: 0,
            next_stage: Instant::now(),
            write_again_at: Instant::now(),
            connected: Some(connected),
        }
    }

    /// Claims and runs jobs until `shutdown` fires, then drains: see [`Consumer::drain`].
    pub async fn run(mut self, shutdown: CancellationToken) {
        // A full claim means more jobs are waiting: claim again as soon as there is room.
        // Otherwise wait for `poll_interval` before the next claim.
        let mut backlog = false;
        let mut next_claim = Instant::now();
        // The loop's one exit is the shutdown token; database trouble only reconnects.
        while !shutdown.is_cancelled() {
            self.stats.beat();
            let settings = self.settings.borrow_and_update().clone();
            let worker = &settings.worker;
            self.stats.slots.store(worker.concurrency, Relaxed);
            while let Some(r) = self.handlers.try_join_next_with_id() {
                self.finished(r);
            }
            self.fill(&settings);
            self.reconnect_if_due().await;
            let now = Instant::now();
            let write_due = self.unwritten.len() >= (worker.batch_size / 2).max(1)
                || self.handlers.is_empty()
                || self
                    .unwritten_since
                    .is_some_and(|t| now.duration_since(t) >= WRITE_AFTER);
            // After a write lost a race, the loop goes on (claims, starts) and writes again
            // after the pause.
            if write_due && now >= self.write_again_at {
                if let Err(e) = self.write_unwritten().await {
                    self.db_error(e).await;
                }
            }

            let prefetch = self.rate.prefetch(now, worker.batch_size);
            let held = self.handlers.len() + self.ready.len();
            let want = (worker.concurrency + prefetch)
                .saturating_sub(held)
                .min(worker.batch_size);
            // Claim when the prefetch runs low, and while the queue has a backlog for at least
            // a few jobs: fewer, fuller claims rather than one per finished handler. At the
            // poll, any free slot is worth a claim.
            let least = (worker.concurrency.min(worker.batch_size) / 8).max(1);
            let low = self.ready.len() <= prefetch / 2;
            let due = (backlog && want >= least) || (now >= next_claim && want > 0);
            if now >= self.next_stage {
                if let Err(e) = self.stage().await {
                    self.db_error(e).await;
                }
                // From the end of this pass: a stager that waited out a lock must not run
                // again at once and keep the claims from their turn.
                self.next_stage = Instant::now() + worker.poll_interval;
            }
            if low && due {
                match self.claim(&settings, want).await {
                    Ok(got) => backlog = got == want,
                    Err(e) => {
                        self.db_error(e).await;
                        backlog = false;
                    }
                }
                self.fill(&settings);
                if !backlog {
                    next_claim = now + worker.poll_interval;
                } else if self.ready.is_empty() && self.handlers.len() < worker.concurrency {
                    continue;
                }
            } else if now.duration_since(self.last_query) >= KEEPALIVE {
                self.keepalive().await;
            }

            let mut wake = if backlog {
                now + KEEPALIVE
            } else {
                next_claim.min(now + KEEPALIVE)
            };
            if let Some(t) = self.unwritten_since {
                wake = wake.min(t + WRITE_AFTER);
            }
            if self.conn.is_none() {
                wake = wake.min(self.reconnect_at);
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                Some(r) = self.handlers.join_next_with_id(), if !self.handlers.is_empty() => {
                    self.finished(r);
                    self.fill(&settings);
                }
                _ = sleep_until(wake) => {}
                _ = self.settings.changed() => {}
            }
        }
        // Prefetched jobs never started: back to pending, the attempt given back.
        for r in std::mem::take(&mut self.ready) {
            info!(
                job_id = r.job.id,
                "job released: claimed ahead but not started before the shutdown"
            );
            self.unwritten.push(Outcome {
                job_id: r.job.id,
                batch_id: r.batch_id,
                write: Write::Release,
            });
        }
        let timeout = self.settings.borrow().worker.shutdown_timeout;
        self.drain(timeout).await;
    }

    /// Starts prefetched jobs while there are free slots.
    fn fill(&mut self, settings: &Settings) {
        while self.handlers.len() < settings.worker.concurrency {
            let Some(r) = self.ready.pop_front() else {
                break;
            };
            self.start(r.job, r.batch_id, r.queue, settings.worker.kill_grace);
        }
        self.stats.running.store(self.handlers.len(), Relaxed);
    }

    /// The stop path: no new claims; running handlers get `timeout` to finish, then are
    /// killed and their jobs released without using up an attempt; every outcome is written,
    /// with a few more seconds of reconnecting if the database is away.
    async fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if !self.handlers.is_empty() {
            info!(
                running = self.handlers.len(),
                "draining: waiting up to {} for running handlers",
                humantime::format_duration(timeout)
            );
        }
        let mut aborted = false;
        while !self.handlers.is_empty() {
            self.stats.beat();
            let retry = self.conn.is_none().then_some(self.reconnect_at);
            tokio::select! {
                Some(r) = self.handlers.join_next_with_id() => self.finished(r),
                _ = sleep_until(deadline), if !aborted => {
                    warn!(running = self.handlers.len(), "shutdown_timeout passed: killing the handlers still running");
                    self.abort.cancel();
                    aborted = true;
                }
                _ = sleep_until(retry.unwrap_or(deadline)), if retry.is_some() => {}
            }
            self.write_or_reconnect().await;
        }
        let give_up = CancellationToken::new();
        let timer = {
            let give_up = give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep(FINAL_WRITE).await;
                give_up.cancel();
            })
        };
        while !self.unwritten.is_empty() && !give_up.is_cancelled() {
            if self.conn.is_none() {
                tokio::select! {
                    _ = give_up.cancelled() => break,
                    _ = sleep_until(self.reconnect_at) => {}
                }
            }
            self.write_or_reconnect().await;
        }
        timer.abort();
        if !self.unwritten.is_empty() {
            error!(
                jobs = self.unwritten.len(),
                "cannot write the last outcomes; the reaper will put these jobs back"
            );
        }
        if let Some(conn) = self.conn.take() {
            let _ = conn.disconnect().await;
        }
    }

    /// Runs the stager: due scheduled jobs become pending, and the other way (see
    /// [`jobs::stage`]).
    async fn stage(&mut self) -> anyhow::Result<()> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let moved = jobs::stage(conn).await?;
        self.last_query = Instant::now();
        self.backoff.reset();
        if moved > 0 {
            debug!(
                jobs = moved,
                "stager: jobs moved between scheduled and pending"
            );
        }
        Ok(())
    }

    /// Claims up to `want` jobs into the prefetch, one statement per queue: each queue is
    /// offered an even share of what is still wanted, starting one queue further each time.
    /// Returns how many it got.
    async fn claim(&mut self, settings: &Settings, want: usize) -> anyhow::Result<usize> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(0);
        };
        let batch_id = jobs::new_batch_id();
        let who = Claimer {
            owner_server: &self.server,
            worker: &self.worker,
        };
        let queues = &settings.queues;
        let first = self.rotation % queues.len().max(1);
        self.rotation = self.rotation.wrapping_add(1);
        let mut left = want;
        // Each queue's claim commits by itself: when one fails, what the others claimed is
        // read all the same, or it would sit claimed by a live connection, never run.
        let mut failed = None;
        for k in 0..queues.len() {
            if left == 0 {
                break;
            }
            let queue = &queues[(first + k) % queues.len()];
            let share = left.div_ceil(queues.len() - k);
            match jobs::claim(conn, batch_id, &queue.name, share, &who).await {
                Ok(n) => left -= n,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        self.last_query = Instant::now();
        if left == want {
            return failed.map_or(Ok(0), Err);
        }
        let claimed = jobs::read_batch(conn, batch_id).await?;
        self.stats.claimed();
        debug!(batch_id, jobs = claimed.len(), "claimed a batch");
        let got = claimed.len();
        for job in claimed {
            // Claimed by its exact name, so the lookup finds it; a claim that cannot be
            // started all the same goes back at once rather than sit claimed.
            let Some(queue) = settings.queue(&job.queue).cloned() else {
                warn!(job_id = job.id, queue = %job.queue, "job released: claimed for a queue this instance does not serve");
                self.unwritten_since.get_or_insert_with(Instant::now);
                self.unwritten.push(Outcome {
                    job_id: job.id,
                    batch_id,
                    write: Write::Release,
                });
                continue;
            };
            self.ready.push_back(Ready {
                job,
                batch_id,
                queue,
            });
        }
        match failed {
            Some(e) => Err(e),
            None => {
                self.backoff.reset();
                Ok(got)
            }
        }
    }

    fn start(
        &mut self,
        job: jobs::ClaimedJob,
        batch_id: u64,
        queue: Arc<QueueSettings>,
        kill_grace: Duration,
    ) {
        let max_attempts = job.max_attempts.unwrap_or(queue.max_attempts);
        let run = handler::Job {
            id: job.id,
            queue: job.queue,
            payload: job.payload.into(),
            attempt: job.attempt,
            max_attempts,
            batch_id,
            instance: self.instance.clone(),
        };
        debug!(job_id = run.id, attempt = run.attempt, queue = %run.queue, "job started");
        let abort = self.abort.clone();
        let q = queue.clone();
        let task = self.handlers.spawn(async move {
            let exit = handler::run(&run, &q, kill_grace, &abort).await;
            retry::decide(exit, run.attempt, run.max_attempts, &q)
        });
        self.running.insert(
            task.id(),
            Running {
                job_id: job.id,
                batch_id,
                attempt: job.attempt,
                max_attempts,
                queue,
            },
        );
    }

    /// A handler task ended: log its outcome and keep it for the next write.
    fn finished(&mut self, result: Result<(Id, Write), JoinError>) {
        let (id, write) = match result {
            Ok((id, write)) => (id, write),
            Err(e) => {
                // The task died (a bug); the job must still get an outcome.
                let id = e.id();
                let Some(r) = self.running.get(&id) else {
                    return;
                };
                let exit = Exit::Failed {
                    reason: format!("internal error in myjob: {e}"),
                    code: None,
                };
                (id, retry::decide(exit, r.attempt, r.max_attempts, &r.queue))
            }
        };
        let Some(r) = self.running.remove(&id) else {
            return;
        };
        self.rate.count += 1;
        self.stats.running.store(self.handlers.len(), Relaxed);
        let (job_id, attempt) = (r.job_id, r.attempt);
        match &write {
            Write::Done => {
                self.stats.done.fetch_add(1, Relaxed);
                info!(job_id, attempt, "job done");
            }
            Write::Retry { delay, error } => {
                self.stats.retried.fetch_add(1, Relaxed);
                warn!(job_id, attempt, retry_in = %humantime::format_duration(*delay), "job failed, will retry: {error}");
            }
            Write::Fail { error } => {
                self.stats.failed.fetch_add(1, Relaxed);
                error!(job_id, attempt, "job failed: {error}");
            }
            Write::Release => info!(
                job_id,
                attempt, "job released: cut short by the shutdown, the attempt does not count"
            ),
        }
        self.unwritten_since.get_or_insert_with(Instant::now);
        self.unwritten.push(Outcome {
            job_id,
            batch_id: r.batch_id,
            write,
        });
    }

    /// Writes the outcomes held so far. They stay held if the write fails.
    async fn write_unwritten(&mut self) -> anyhow::Result<()> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let fenced = match jobs::write_outcomes(conn, &self.unwritten).await {
            Ok(fenced) => fenced,
            Err(e) if db::classify(&e) == Failure::Refused => {
                warn!(
                    "consumer: the server refused a write of {} outcomes ({}): writing them one by one",
                    self.unwritten.len(),
                    crate::error::chain(&*e)
                );
                conn.query_drop("ROLLBACK")
                    .await
                    .map_err(|e| anyhow::anyhow!(db::describe(&e)))?;
                return self.write_one_by_one().await;
            }
            Err(e) => return Err(e),
        };
        self.last_query = Instant::now();
        self.backoff.reset();
        for job_id in fenced {
            warn!(
                job_id,
                "job outcome not written: its claim was reaped and the job was put back meanwhile"
            );
        }
        self.unwritten.clear();
        self.unwritten_since = None;
        Ok(())
    }

    /// After the server refused a write of several outcomes: each on its own, so that one
    /// job's outcome (a trigger or a constraint of the user's that rejects it) does not hold
    /// back the others. A refused outcome becomes a failure of its job with the server's
    /// message; if even that is refused, it is logged and dropped, and the job stays claimed
    /// by this instance until it stops (the reaper then puts it back).
    async fn write_one_by_one(&mut self) -> anyhow::Result<()> {
        let mut left: VecDeque<Outcome> = std::mem::take(&mut self.unwritten).into();
        self.unwritten_since = None;
        while let Some(o) = left.pop_front() {
            let Some(conn) = self.conn.as_mut() else {
                left.push_front(o);
                break;
            };
            let result = match jobs::write_outcomes(conn, std::slice::from_ref(&o)).await {
                Err(e) if db::classify(&e) == Failure::Refused => {
                    let reason = crate::error::chain(&*e);
                    error!(
                        job_id = o.job_id,
                        "job failed: the server refused its outcome: {reason}"
                    );
                    let failed = Outcome {
                        write: Write::Fail {
                            error: format!("the server refused this job's outcome: {reason}"),
                        },
                        ..o.clone()
                    };
                    match jobs::write_outcomes(conn, std::slice::from_ref(&failed)).await {
                        Err(e) if db::classify(&e) == Failure::Refused => {
                            error!(
                                job_id = o.job_id,
                                "job outcome dropped: the server refuses every write about it ({})",
                                crate::error::chain(&*e)
                            );
                            Ok(Vec::new())
                        }
                        other => other,
                    }
                }
                other => other,
            };
            match result {
                Ok(fenced) => {
                    for job_id in fenced {
                        warn!(job_id, "job outcome not written: its claim was reaped and the job was put back meanwhile");
                    }
                }
                Err(e) => {
                    left.push_front(o);
                    self.unwritten.extend(left);
                    self.unwritten_since = Some(Instant::now());
                    return Err(e);
                }
            }
        }
        self.unwritten.extend(left);
        self.last_query = Instant::now();
        Ok(())
    }

    async fn keepalive(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match conn.ping().await {
            Ok(()) => self.last_query = Instant::now(),
            Err(e) => self.lost_connection(anyhow::anyhow!(db::describe(&e))),
        }
    }

    /// A statement failed: what comes next depends on what the error says of the connection.
    /// A lost race (a deadlock, a Galera certification conflict, a lock wait timeout) or a
    /// statement the server refuses keeps the connection: the loop goes on, and writes again
    /// after a short random pause, so that two conflicting writers do not meet again at once
    /// (a claim is tried again at its next turn). Anything else drops the connection.
    async fn db_error(&mut self, e: anyhow::Error) {
        if db::classify(&e) == Failure::Connection {
            self.lost_connection(e);
            return;
        }
        warn!(
            "consumer: {}; trying again on the same connection",
            crate::error::chain(&*e)
        );
        // A deadlock has rolled the transaction back, a lock wait timeout only the statement.
        if let Some(conn) = self.conn.as_mut() {
            if let Err(e) = conn.query_drop("ROLLBACK").await {
                self.lost_connection(anyhow::anyhow!(db::describe(&e)));
                return;
            }
        }
        self.write_again_at =
            Instant::now() + Duration::from_millis(5 + rand::random::<u64>() % 45);
    }

    fn lost_connection(&mut self, e: anyhow::Error) {
        warn!(
            "consumer: database error, reconnecting: {}",
            crate::error::chain(&*e)
        );
        // Dropping the connection closes it; its id is then gone from the processlist. The
        // backoff counts on until a statement succeeds again, so a connection that works and
        // a statement that always fails cannot make a tight connect-fail loop.
        self.conn = None;
        self.reconnect_at = Instant::now() + self.backoff.count();
    }

    /// Writes the held outcomes, connecting first if the connection is gone and an attempt
    /// is due.
    async fn write_or_reconnect(&mut self) {
        self.reconnect_if_due().await;
        if self.conn.is_some() {
            if let Err(e) = self.write_unwritten().await {
                self.db_error(e).await;
            }
        }
    }

    /// When the connection is gone and the backoff has passed, one attempt to connect again.
    /// On success it adopts the claims this instance still holds, so the reaper does not take
    /// them from running handlers; on failure the next attempt waits for the backoff.
    async fn reconnect_if_due(&mut self) {
        if self.conn.is_some() || Instant::now() < self.reconnect_at {
            return;
        }
        self.stats.beat();
        let result = match db::connect(&self.db).await {
            Ok(mut conn) => match self.adopt(&mut conn).await {
                Ok(adopted) => Ok((conn, adopted)),
                Err(e) => Err(e.context("setting up the connection")),
            },
            Err(e) => Err(e.into()),
        };
        match result {
            Ok((conn, adopted)) => {
                let id = conn.id();
                if adopted > 0 {
                    info!(
                        connection = id,
                        adopted, "consumer: connected; adopted the claims of running jobs"
                    );
                } else {
                    info!(connection = id, "consumer: connected");
                }
                self.conn = Some(conn);
                self.last_query = Instant::now();
                if let Some(tx) = self.connected.take() {
                    let _ = tx.send(());
                }
            }
            Err(e) => self.reconnect_at = Instant::now() + self.backoff.failed("consumer", &e),
        }
    }

    async fn adopt(&mut self, conn: &mut Conn) -> anyhow::Result<u64> {
        self.server = ServerId::of(conn).await?.to_string();
        let mut batches: Vec<u64> = self
            .running
            .values()
            .map(|r| r.batch_id)
            .chain(self.ready.iter().map(|r| r.batch_id))
            .chain(self.unwritten.iter().map(|o| o.batch_id))
            .collect();
        batches.sort_unstable();
        batches.dedup();
        let adopted = jobs::adopt(conn, &batches, &self.server).await?;
        // Prefetched jobs whose claim the reaper took while the connection was away are not
        // started: they are someone else's now.
        let waiting: Vec<(u64, u64)> = self.ready.iter().map(|r| (r.job.id, r.batch_id)).collect();
        let held = jobs::still_claimed(conn, &waiting).await?;
        self.ready.retain(|r| {
            let keep = held.contains(&r.job.id);
            if !keep {
                warn!(
                    job_id = r.job.id,
                    "job dropped before its start: its claim was put back while the connection was away"
                );
            }
            keep
        });
        Ok(adopted)
    }
}
