//! The handler slots: the handlers running now, each a task that ends with its job's outcome.
//! What each was started for is kept beside its task, so that a task that dies (a bug) still
//! gives its job an outcome. A job of a persistent queue runs on a process from the [`Pool`],
//! which gets it back when the job is answered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::config::{Settings, WorkerSettings};
use crate::metrics::{Metrics, ProcessExit};
use crate::store::jobs::{BatchId, Claim, Completion, JobId, Outcome, Payload};
use crate::worker::consumer::prefetch::Ready;
use crate::worker::handler::exit;
use crate::worker::handler::pool::Pool;
use crate::worker::handler::process::{self, Process};
use crate::worker::handler::{self, Exit};

/// A handler that ended, with its job's outcome.
#[derive(Debug)]
pub struct Finished {
    pub attempt: u32,
    /// The job's queue, for the metrics.
    pub queue: String,
    /// How long its handler ran; None when no handler ran (its payload was too big).
    pub ran_for: Option<std::time::Duration>,
    pub completion: Completion,
    /// The job's span, for the lines about its outcome.
    pub span: Span,
}

/// What a slot's job runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runs {
    /// Nothing: it was refused before any handler (its payload too big to load).
    Nothing,
    /// A process of its own.
    Process,
    /// A persistent process of its queue.
    Persistent,
}

/// What a slot remembers about its handler.
struct Running {
    job_id: JobId,
    runs: Runs,
    batch_id: BatchId,
    /// The concurrency-key slot its job holds.
    slot: Option<crate::store::jobs::KeySlot>,
    attempt: u32,
    max_attempts: u32,
    queue: std::sync::Arc<crate::config::QueueSettings>,
    /// When its handler started.
    started: std::time::Instant,
    /// Its lines' span: the task runs in it.
    span: Span,
    /// Fired when an operator cancels the job: its handler is stopped.
    cancel: CancellationToken,
    /// Fired when the job's claim is gone: its handler is killed at once (see
    /// [`Slots::kill`]). A child of the slots' abort token, which kills every handler.
    kill: CancellationToken,
}

/// What a slot's task hands back: its job's outcome, and for a persistent queue the process
/// if it may take another job, and how a start went if the job needed one.
enum Ran {
    /// No handler ran (see [`Runs::Nothing`]), or a process of its own.
    Alone(Outcome),
    Persistent {
        outcome: Outcome,
        /// Boxed: a process is large, and most jobs run without one.
        process: Option<Box<Process>>,
        start: Option<Result<(), String>>,
    },
}

pub struct Slots {
    /// `MYJOB_INSTANCE` for the handlers.
    instance: String,
    tasks: JoinSet<Ran>,
    running: HashMap<Id, Running>,
    pool: Pool,
    /// Persistent processes counted by state, and their exits.
    metrics: Arc<Metrics>,
    /// When the process gauges were last set.
    gauges_at: Option<tokio::time::Instant>,
    /// The drain has begun: processes that answer their job leave instead of idling.
    stopping: bool,
    kill_grace: Duration,
    /// Fired when a shutdown runs out of time: kills every handler still running.
    abort: CancellationToken,
}

/// How often the persistent process gauges are set.
const PROCESS_GAUGES_EVERY: Duration = Duration::from_secs(1);

impl Slots {
    pub fn new(instance: &str, metrics: Arc<Metrics>) -> Self {
        let abort = CancellationToken::new();
        Slots {
            instance: instance.to_owned(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            pool: Pool::new(abort.clone(), metrics.clone()),
            metrics,
            gauges_at: None,
            stopping: false,
            kill_grace: Duration::from_secs(5),
            abort,
        }
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The batches of the running jobs: still this instance's claims.
    pub fn batches(&self) -> impl Iterator<Item = BatchId> + '_ {
        self.running.values().map(|r| r.batch_id)
    }

    /// The running jobs' claims.
    pub fn claims(&self) -> Vec<Claim> {
        self.running
            .values()
            .map(|r| Claim {
                job_id: r.job_id,
                batch_id: r.batch_id,
            })
            .collect()
    }

    /// The span of the running job `job_id`; none when it does not run here.
    pub fn span_of(&self, job_id: JobId) -> Span {
        self.running
            .values()
            .find(|r| r.job_id == job_id)
            .map_or_else(Span::none, |r| r.span.clone())
    }

    /// Starts a handler for `r`; a job whose payload was too big to load fails in its slot
    /// at once, without one.
    pub fn start(&mut self, r: Ready, worker: &WorkerSettings) {
        let kill_grace = worker.kill_grace;
        self.kill_grace = kill_grace;
        let Ready {
            job,
            batch_id,
            queue,
            span,
        } = r;
        let max_attempts = job.max_attempts.unwrap_or(queue.max_attempts);
        let abort = self.abort.child_token();
        let kill = abort.clone();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let q = queue.clone();
        let attempt = job.attempt;
        let runs = match (&job.payload, q.persistent.is_some()) {
            (Payload::TooBig(_), _) => Runs::Nothing,
            (Payload::Loaded(_), false) => Runs::Process,
            (Payload::Loaded(_), true) => Runs::Persistent,
        };
        let task = match job.payload {
            Payload::TooBig(length) => {
                let reason = format!(
                    "its payload of {length} bytes is over worker.max_payload_bytes ({}), and was not loaded: raise the limit, or pass a reference to the data instead",
                    worker.max_payload_bytes
                );
                let outcome = exit::decide(Exit::Refused { reason }, attempt, max_attempts, &q);
                self.tasks
                    .spawn(async move { Ran::Alone(outcome) }.instrument(span.clone()))
            }
            Payload::Loaded(payload) => {
                let run = handler::Job {
                    id: job.id,
                    queue: job.queue,
                    payload: payload.into(),
                    attempt,
                    max_attempts,
                    batch_id,
                    instance: self.instance.clone(),
                };
                // Which instance started which attempt: the first line of each run's story.
                span.in_scope(|| {
                    tracing::info!(job_id = run.id.get(), attempt = run.attempt, queue = %run.queue, "job started")
                });
                if runs == Runs::Persistent {
                    self.start_persistent(run, q, worker, stop, abort, &span)
                } else {
                    self.tasks.spawn(
                        async move {
                            let exit = handler::run(&run, &q, kill_grace, &stop, &abort).await;
                            Ran::Alone(exit::decide(exit, run.attempt, run.max_attempts, &q))
                        }
                        .instrument(span.clone()),
                    )
                }
            }
        };
        self.running.insert(
            task.id(),
            Running {
                job_id: job.id,
                runs,
                batch_id,
                slot: job.slot,
                attempt,
                max_attempts,
                queue,
                started: std::time::Instant::now(),
                span,
                cancel,
                kill,
            },
        );
    }

    /// The task of a job of a persistent queue: on an idle process of the queue, or on a new
    /// one when there is none (and room for it).
    fn start_persistent(
        &mut self,
        run: handler::Job,
        q: Arc<crate::config::QueueSettings>,
        worker: &WorkerSettings,
        stop: CancellationToken,
        abort: CancellationToken,
        span: &Span,
    ) -> tokio::task::AbortHandle {
        let kill_grace = worker.kill_grace;
        let process = self.pool.take(&q);
        let not_before = match process {
            Some(_) => None,
            None => {
                // At most one persistent process per slot: counting this job's new one,
                // the busy ones and the idle ones.
                let busy = self.busy_processes() + 1;
                self.pool.make_room(worker.concurrency.saturating_sub(busy));
                self.pool.not_before(&q.name)
            }
        };
        self.tasks.spawn(
            async move {
                let (attempt, max_attempts) = (run.attempt, run.max_attempts);
                let served =
                    process::serve(run, q.clone(), process, not_before, kill_grace, stop, abort)
                        .await;
                Ran::Persistent {
                    outcome: exit::decide(served.exit, attempt, max_attempts, &q),
                    process: served.process.map(Box::new),
                    start: served.start,
                }
            }
            .instrument(span.clone()),
        )
    }

    /// Kills the handlers of the jobs among `ids` that run here at once, without the grace
    /// of a SIGTERM: their claims are gone, and the jobs may already run elsewhere. They end
    /// as aborted handlers do (released, which the batch_id fence makes a no-op).
    pub fn kill(&self, ids: &[JobId]) {
        for r in self.running.values().filter(|r| ids.contains(&r.job_id)) {
            r.kill.cancel();
        }
    }

    /// Stops the handlers of the jobs among `ids` that run here: an operator cancelled them.
    pub fn cancel(&self, ids: &[JobId]) {
        for r in self.running.values().filter(|r| ids.contains(&r.job_id)) {
            r.cancel.cancel();
        }
    }

    /// A handler that has ended already, if any.
    pub fn try_finished(&mut self) -> Option<Finished> {
        loop {
            let r = self.tasks.try_join_next_with_id()?;
            if let Some(f) = self.finished(r) {
                return Some(f);
            }
        }
    }

    /// Waits for the next handler to end; pending for ever when none runs.
    pub async fn next_finished(&mut self) -> Finished {
        loop {
            match self.tasks.join_next_with_id().await {
                Some(r) => {
                    if let Some(f) = self.finished(r) {
                        return f;
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Kills every handler still running (their jobs are then released), and every process
    /// still on its way out.
    pub fn abort(&self) {
        self.abort.cancel();
    }

    /// Kills every handler running now, as [`Slots::abort`] does, and goes on serving: the
    /// handlers started later, and the processes that leave later, answer to a new token.
    pub fn fence(&mut self) {
        let old = std::mem::replace(&mut self.abort, CancellationToken::new());
        self.pool.set_abort(self.abort.clone());
        old.cancel();
    }

    /// Idle persistent processes: see [`Pool::sweep`].
    pub fn sweep(&mut self, settings: &Settings) {
        self.pool.sweep(settings, self.busy_processes());
        // The process gauges, once a second rather than each turn (a scrape is seldom more
        // often): every queue the metrics know, so that one a reload removed or made per-job
        // drops to 0.
        if self
            .gauges_at
            .is_none_or(|t| t.elapsed() >= PROCESS_GAUGES_EVERY)
        {
            self.gauges_at = Some(tokio::time::Instant::now());
            let idle = self.pool.idle_by_queue();
            let mut busy: HashMap<&str, usize> = HashMap::new();
            for r in self
                .running
                .values()
                .filter(|r| r.queue.persistent.is_some())
            {
                *busy.entry(r.queue.name.as_str()).or_default() += 1;
            }
            for (name, m) in self.metrics.queues() {
                let of = |n: &HashMap<&str, usize>| n.get(name.as_str()).copied().unwrap_or(0);
                m.processes(of(&idle), of(&busy));
            }
        }
    }

    /// Jobs running on persistent processes (or on their way to one). Per-job handlers do
    /// not count: they hold no process between jobs, and an idle persistent process must not
    /// be stopped to make room for them.
    fn busy_processes(&self) -> usize {
        self.running
            .values()
            .filter(|r| r.runs == Runs::Persistent)
            .count()
    }

    /// The drain begins: idle processes get EOF now, busy ones once their job is answered.
    pub fn stop_processes(&mut self) {
        self.stopping = true;
        self.pool.close_all();
    }

    /// Whether persistent processes are still on their way out.
    pub fn processes_leaving(&self) -> bool {
        self.pool.is_leaving()
    }

    /// The drain's wait: the next handler to end, or `None` when a leaving process is gone
    /// first. Pending for ever when neither is left.
    pub async fn next_in_drain(&mut self) -> Option<Finished> {
        let joined = tokio::select! {
            r = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => r,
            _ = self.pool.left() => return None,
        };
        joined.and_then(|r| self.finished(r))
    }

    fn finished(&mut self, result: Result<(Id, Ran), JoinError>) -> Option<Finished> {
        let id = match &result {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let r = self.running.remove(&id)?;
        let outcome = match result {
            Ok((_, Ran::Alone(outcome))) => outcome,
            Ok((
                _,
                Ran::Persistent {
                    outcome,
                    process,
                    start,
                },
            )) => {
                match &start {
                    Some(Ok(())) => self.pool.started(&r.queue.name),
                    Some(Err(why)) => self.pool.start_failed(&r.queue.name, why),
                    None => {}
                }
                match process {
                    Some(p) if self.stopping => self.pool.close(*p, ProcessExit::Shutdown),
                    Some(p) => self.pool.put(*p, self.kill_grace),
                    // A job whose process started (or was taken idle) and did not come back:
                    // it died, or was killed, with the job.
                    None if !matches!(start, Some(Err(_))) => self
                        .metrics
                        .queue(&r.queue.name)
                        .process_exited(ProcessExit::Job),
                    None => {}
                }
                outcome
            }
            // The task died (a bug); the job must still get an outcome.
            Err(e) => {
                let exit = Exit::Failed {
                    reason: format!("internal error in myjob: {e}"),
                    code: None,
                };
                exit::decide(exit, r.attempt, r.max_attempts, &r.queue)
            }
        };
        Some(Finished {
            attempt: r.attempt,
            queue: r.queue.name.clone(),
            ran_for: (r.runs != Runs::Nothing).then(|| r.started.elapsed()),
            completion: Completion {
                job_id: r.job_id,
                batch_id: r.batch_id,
                outcome,
                slot: r.slot,
            },
            span: r.span,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::QueueSettings;
    use crate::store::jobs::ClaimedJob;

    fn ready(id: u64, command: &[&str], timeout: Duration) -> Ready {
        Ready {
            job: ClaimedJob {
                id: JobId::new(id),
                queue: "q".into(),
                payload: Payload::Loaded(b"x".to_vec()),
                attempt: 1,
                max_attempts: None,
                due_to_claim: Duration::ZERO,
                read_at: tokio::time::Instant::now(),
                slot: None,
            },
            batch_id: BatchId::new(7),
            span: Span::none(),
            queue: Arc::new(QueueSettings {
                name: "q".into(),
                command: command.iter().map(|s| s.to_string()).collect(),
                timeout,
                max_attempts: 3,
                backoff: Duration::from_secs(1),
                backoff_max: Duration::from_secs(10),
                pass_env: Vec::new(),
                persistent: None,
                rate: None,
                key_limit: 1,
            }),
        }
    }

    fn worker(kill_grace: Duration) -> WorkerSettings {
        WorkerSettings {
            concurrency: 8,
            batch_size: 100,
            max_payload_bytes: 1024,
            poll_interval: Duration::from_millis(500),
            shutdown_timeout: Duration::from_secs(30),
            kill_grace,
        }
    }

    #[tokio::test]
    async fn each_handler_ends_with_its_jobs_outcome() {
        let mut slots = Slots::new("t", Arc::new(Metrics::new(&[], None)));
        let t = Duration::from_secs(10);
        let w = worker(t);
        slots.start(ready(1, &["/bin/true"], t), &w);
        slots.start(ready(2, &["/bin/false"], t), &w);
        assert_eq!(slots.len(), 2);
        assert_eq!(slots.batches().collect::<Vec<_>>(), [BatchId::new(7); 2]);
        let mut got = Vec::new();
        for _ in 0..2 {
            let f = slots.next_finished().await;
            assert_eq!((f.attempt, f.completion.batch_id), (1, BatchId::new(7)));
            got.push((f.completion.job_id, f.completion.outcome));
        }
        got.sort_by_key(|g| g.0);
        assert_eq!(got[0].1, Outcome::Done);
        assert!(matches!(got[1].1, Outcome::Retry { .. }), "{:?}", got[1]);
        assert!(slots.is_empty());
        assert!(slots.try_finished().is_none());
    }

    #[tokio::test]
    async fn a_payload_too_big_to_load_fails_its_job_without_a_handler() {
        let mut slots = Slots::new("t", Arc::new(Metrics::new(&[], None)));
        let t = Duration::from_secs(10);
        let mut r = ready(1, &["/nonexistent/handler"], t);
        r.job.payload = Payload::TooBig(16_777_215);
        slots.start(r, &worker(t));
        let f = slots.next_finished().await;
        let Outcome::Fail { error } = f.completion.outcome else {
            panic!("{:?}", f.completion.outcome)
        };
        assert_eq!(
            error,
            "permanent failure on attempt 1: its payload of 16777215 bytes is over \
             worker.max_payload_bytes (1024), and was not loaded: raise the limit, or pass a \
             reference to the data instead"
        );
    }

    #[tokio::test]
    async fn an_abort_kills_the_handlers_and_releases_their_jobs() {
        let mut slots = Slots::new("t", Arc::new(Metrics::new(&[], None)));
        let t = Duration::from_secs(60);
        slots.start(ready(1, &["/bin/sleep", "60"], t), &worker(t));
        slots.abort();
        let f = tokio::time::timeout(Duration::from_secs(10), slots.next_finished())
            .await
            .expect("the handler was killed at once");
        assert_eq!(f.completion.outcome, Outcome::Release);
    }
}
