//! The idle persistent processes of an instance, and the ones on their way out.
//!
//! A slot that runs a job of a persistent queue takes an idle process of that queue, or starts
//! one; the process comes back here when the job is answered. There is at most one persistent
//! process per slot, busy or idle: idle ones of other queues make room when a queue needs a
//! new one. (Per-job handlers hold no process between jobs and take no such room.)
//! A process leaves (EOF on its stdin, see [`Process::close`]) when it has served
//! `max_jobs_per_process` jobs, has been idle for `idle_timeout`, when a reload changed its
//! queue, and at the shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{QueueSettings, Settings};
use crate::metrics::{Metrics, ProcessExit};
use crate::worker::handler::process::Process;

/// The first delay after a process of a queue failed to start; it doubles with each failure
/// in a row, up to [`START_DELAY_MAX`], and resets once one is ready.
const START_DELAY: Duration = Duration::from_secs(1);
const START_DELAY_MAX: Duration = Duration::from_secs(60);

pub struct Pool {
    /// Idle processes, the longest idle first.
    idle: Vec<Process>,
    /// Per queue: failed starts in a row, and when the next start may be.
    failures: HashMap<String, (u32, Instant)>,
    /// Processes given EOF (or killed), until they are gone.
    leaving: JoinSet<()>,
    kill_grace: Duration,
    /// The end of a shutdown's time: processes still leaving are killed.
    abort: CancellationToken,
    /// Exits counted by reason.
    metrics: Arc<Metrics>,
}

impl Pool {
    pub fn new(abort: CancellationToken, metrics: Arc<Metrics>) -> Self {
        Pool {
            metrics,
            idle: Vec::new(),
            failures: HashMap::new(),
            leaving: JoinSet::new(),
            kill_grace: Duration::from_secs(5),
            abort,
        }
    }

    /// The token that kills the processes that leave from now on (see `Slots::fence`).
    pub fn set_abort(&mut self, abort: CancellationToken) {
        self.abort = abort;
    }

    /// Whether processes are still on their way out.
    pub fn is_leaving(&self) -> bool {
        !self.leaving.is_empty()
    }

    /// Waits for one leaving process to be gone; pending for ever when none is leaving.
    pub async fn left(&mut self) {
        if self.leaving.join_next().await.is_none() {
            std::future::pending::<()>().await;
        }
    }

    /// An idle process of `queue`, started with these very settings; the most recently used
    /// one, so that the others may reach their idle timeout. Unfit ones met on the way (dead,
    /// or with stray output) are ended.
    pub fn take(&mut self, queue: &QueueSettings) -> Option<Process> {
        while let Some(i) = self.idle.iter().rposition(|p| *p.queue == *queue) {
            let mut p = self.idle.remove(i);
            match p.check_idle() {
                Ok(()) => return Some(p),
                Err(why) => self.unfit(p, &why),
            }
        }
        None
    }

    /// A process that answered its job and may take another.
    pub fn put(&mut self, p: Process, kill_grace: Duration) {
        self.kill_grace = kill_grace;
        let limit = p
            .queue
            .persistent
            .as_ref()
            .and_then(|s| s.max_jobs_per_process);
        if limit.is_some_and(|n| p.jobs >= n) {
            info!(queue = %p.queue.name, pid = p.pid(), jobs = p.jobs, "handler process recycled: max_jobs_per_process reached");
            self.close(p, ProcessExit::Recycled);
        } else {
            self.idle.push(p);
        }
    }

    /// When the next process of `queue` may start: `None` unless its last start failed.
    pub fn not_before(&self, queue: &str) -> Option<Instant> {
        self.failures.get(queue).map(|f| f.1)
    }

    /// A start of `queue` failed: the next one waits, longer with each failure in a row.
    pub fn start_failed(&mut self, queue: &str, why: &str) {
        let failures = self.failures.get(queue).map_or(0, |f| f.0) + 1;
        let delay = START_DELAY
            .saturating_mul(1 << (failures - 1).min(16))
            .min(START_DELAY_MAX);
        self.failures
            .insert(queue.to_owned(), (failures, Instant::now() + delay));
        warn!(
            queue,
            failures,
            "handler process did not start: {why}; next start in {}",
            humantime::format_duration(delay)
        );
    }

    /// A process of `queue` became ready.
    pub fn started(&mut self, queue: &str) {
        self.failures.remove(queue);
    }

    /// Stops idle processes, the longest idle first, until at most `keep` are left: a slot
    /// needs the room for a process of another queue.
    pub fn make_room(&mut self, keep: usize) {
        while self.idle.len() > keep {
            let p = self.idle.remove(0);
            info!(queue = %p.queue.name, pid = p.pid(), "handler process stopped: its slot is needed by another queue");
            self.close(p, ProcessExit::Idle);
        }
    }

    /// Each persistent queue's idle processes.
    pub fn idle_by_queue(&self) -> HashMap<&str, usize> {
        let mut n = HashMap::new();
        for p in &self.idle {
            *n.entry(p.queue.name.as_str()).or_default() += 1;
        }
        n
    }

    /// Once per turn of the consumer: ends idle processes that died or wrote out of turn, and
    /// stops those idle for longer than their queue's `idle_timeout`, those whose queue a
    /// reload changed or removed, and those beyond the slots left by `busy` persistent ones.
    pub fn sweep(&mut self, settings: &Settings, busy: usize) {
        self.kill_grace = settings.worker.kill_grace;
        while self.leaving.try_join_next().is_some() {}
        let now = Instant::now();
        let mut i = 0;
        while i < self.idle.len() {
            let current = settings.queue(&self.idle[i].queue.name);
            let p = &mut self.idle[i];
            let stop = match (p.check_idle(), current) {
                (Err(why), _) => Err(why),
                (Ok(()), None) => Ok((
                    "its queue is no longer configured".to_owned(),
                    ProcessExit::Reload,
                )),
                (Ok(()), Some(q)) if **q != *p.queue => Ok((
                    "the reload changed its queue's settings".to_owned(),
                    ProcessExit::Reload,
                )),
                (Ok(()), Some(_)) => match &p.queue.persistent {
                    Some(s) if now.duration_since(p.idle_since) >= s.idle_timeout => Ok((
                        format!("idle for {}", humantime::format_duration(s.idle_timeout)),
                        ProcessExit::Idle,
                    )),
                    _ => {
                        i += 1;
                        continue;
                    }
                },
            };
            let p = self.idle.remove(i);
            match stop {
                Err(why) => self.unfit(p, &why),
                Ok((why, exit)) => {
                    info!(queue = %p.queue.name, pid = p.pid(), "handler process stopped: {why}");
                    self.close(p, exit);
                }
            }
        }
        self.make_room(settings.worker.concurrency.saturating_sub(busy));
    }

    /// The shutdown: every idle process gets EOF now.
    pub fn close_all(&mut self) {
        for p in std::mem::take(&mut self.idle) {
            self.close(p, ProcessExit::Shutdown);
        }
    }

    /// EOF on its stdin, and it leaves in the background.
    pub fn close(&mut self, p: Process, why: ProcessExit) {
        self.metrics.queue(&p.queue.name).process_exited(why);
        self.leaving
            .spawn(p.close(self.kill_grace, self.abort.clone()));
    }

    /// A process found dead or misbehaving while idle: logged, and killed.
    fn unfit(&mut self, mut p: Process, why: &str) {
        warn!(queue = %p.queue.name, pid = p.pid(), "handler process replaced: {why}");
        self.metrics
            .queue(&p.queue.name)
            .process_exited(ProcessExit::Unfit);
        self.leaving.spawn(async move { p.kill().await });
    }
}
