//! The instance's Prometheus metrics: what happened here (counters and histograms of
//! attempts, claims, rescues, the database's statements), labelled by the config's queue names
//! only, never by a job's id, key or payload; and, from one instance of all those on a server,
//! the queues' depth by state (see [`queues`]). Served at `GET /metrics` by [`server`].
//!
//! Families are registered once, at start, and each queue's series made at 0 then, so that a
//! series never appears late (Prometheus's "avoid missing metrics"); a queue added by a
//! reload gets its series then. The hot path (a claim, a start, an end) updates a queue's
//! handles found by name, never building a label set.

mod families;
pub mod queues;
pub mod server;

pub use families::{Attempts, Database, Handlers};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::db;

/// How an attempt ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Retried,
    Failed,
    Cancelled,
    /// Given back without using up the attempt.
    Released,
    /// Its outcome matched no row when written: the claim had been put back (a reaper, while
    /// this instance was away) and is another worker's now.
    Lost,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Done,
        Outcome::Retried,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::Released,
        Outcome::Lost,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Retried => "retried",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Released => "released",
            Outcome::Lost => "lost",
        }
    }
}

/// The statements the instance sends, as the `op` label says them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The probe of which queues have due jobs (and which are paused).
    Probe,
    /// A claim's UPDATE.
    Claim,
    /// The read-back of a claimed batch.
    ReadBatch,
    /// Writing outcomes.
    Outcomes,
    /// The rollback after a write that failed and kept its connection.
    Rollback,
    /// The check for cancelled claims.
    Cancelled,
    /// The server's heartbeat row.
    Heartbeat,
    /// Re-owning the claims after a reconnect.
    Adopt,
    /// A reaper pass (several statements).
    Reap,
    /// A stager pass, the gate's admissions of blocked jobs included.
    Stage,
    /// Handing the slots of finished jobs on to their keys' next blocked jobs.
    HandOff,
    /// A pass of the gate woken by the consumer (the stager's passes include the gate's).
    Gate,
    /// The queue gauges' counts.
    QueueGauges,
}

impl Op {
    const ALL: [Op; 13] = [
        Op::Probe,
        Op::Claim,
        Op::ReadBatch,
        Op::Outcomes,
        Op::Rollback,
        Op::Cancelled,
        Op::Heartbeat,
        Op::Adopt,
        Op::Reap,
        Op::Stage,
        Op::HandOff,
        Op::Gate,
        Op::QueueGauges,
    ];

    fn label(self) -> &'static str {
        match self {
            Op::Probe => "probe",
            Op::Claim => "claim",
            Op::ReadBatch => "read_batch",
            Op::Outcomes => "outcomes",
            Op::Rollback => "rollback",
            Op::Cancelled => "cancelled",
            Op::Heartbeat => "heartbeat",
            Op::Adopt => "adopt",
            Op::Reap => "reap",
            Op::Stage => "stage",
            Op::HandOff => "hand_off",
            Op::Gate => "gate",
            Op::QueueGauges => "queue_gauges",
        }
    }
}

/// The kind of a failed statement's error: the race lost (a deadlock, which is also how
/// Galera reports a certification conflict, or a lock wait timeout), a server that takes no
/// writes, a statement refused for good, a connection broken or in doubt (no answer within
/// the statement limit included), or another error the server sent.
fn error_kind(e: &anyhow::Error) -> &'static str {
    use db::{Failure, Race};
    match db::classify(e) {
        Failure::Conflict(Race::Deadlock) => "deadlock",
        Failure::Conflict(Race::LockWait) => "lock_wait",
        Failure::ReadOnly => "read_only",
        Failure::Refused(_) => "refused",
        Failure::Denied | Failure::Missing | Failure::Server(_) => "other",
        Failure::Lost => "connection",
    }
}

/// Why a persistent handler process ended, as the `reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessExit {
    /// `max_jobs_per_process` reached.
    Recycled,
    /// Idle for the queue's `idle_timeout`, or stopped to make room for another queue's.
    Idle,
    /// A reload changed or removed its queue.
    Reload,
    /// Found dead, or writing out of turn, while idle: replaced.
    Unfit,
    /// It did not come back from a job: it died, or was killed with it (a timeout, a cancel,
    /// a claim gone, the shutdown's deadline).
    Job,
    /// The instance's shutdown closed it.
    Shutdown,
}

impl ProcessExit {
    const ALL: [ProcessExit; 6] = [
        ProcessExit::Recycled,
        ProcessExit::Idle,
        ProcessExit::Reload,
        ProcessExit::Unfit,
        ProcessExit::Job,
        ProcessExit::Shutdown,
    ];

    fn label(self) -> &'static str {
        match self {
            ProcessExit::Recycled => "recycled",
            ProcessExit::Idle => "idle",
            ProcessExit::Reload => "reload",
            ProcessExit::Unfit => "unfit",
            ProcessExit::Job => "job",
            ProcessExit::Shutdown => "shutdown",
        }
    }
}

/// A handler's run time, in seconds: from a few ms to an hour.
const DURATION_BUCKETS: [f64; 17] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// A job's wait from due to start, in seconds: a poll's worth to an hour behind.
const WAIT_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// A statement's time, in seconds: from a fraction of a ms to a lock wait.
const STATEMENT_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub queue: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    pub queue: String,
    /// `jobs` when the claim got some, `empty` when none.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub op: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessLabels {
    pub queue: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExitLabels {
    pub queue: String,
    pub reason: String,
}

/// One queue's series, found by name on the hot path: handles to the families' atomics.
#[derive(Debug)]
pub struct QueueMetrics {
    started: Counter,
    finished: [Counter; 6],
    duration: Histogram,
    wait: Histogram,
    claims: [Counter; 2],
    processes: [Gauge; 2],
    exits: [Counter; 6],
}

impl QueueMetrics {
    /// An attempt was handed to a handler `waited` after the job was due.
    pub fn started(&self, waited: Duration) {
        self.started.inc();
        self.wait.observe(waited.as_secs_f64());
    }

    /// An attempt's handler ran for `ran_for`.
    pub fn ran(&self, ran_for: Duration) {
        self.duration.observe(ran_for.as_secs_f64());
    }

    /// An attempt's outcome was written (or found to be someone else's: [`Outcome::Lost`]).
    pub fn ended(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.finished[i].inc();
    }

    /// A claim statement ran; `got` says whether it got jobs.
    pub fn claimed(&self, got: bool) {
        self.claims[usize::from(!got)].inc();
    }

    /// The queue's persistent processes now: idle ones and busy ones.
    pub fn processes(&self, idle: usize, busy: usize) {
        self.processes[0].set(idle as i64);
        self.processes[1].set(busy as i64);
    }

    /// A persistent process of the queue ended.
    pub fn process_exited(&self, why: ProcessExit) {
        let i = ProcessExit::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.exits[i].inc();
    }
}

/// The instance's metrics. Cheap to update from any task: every metric is atomics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub attempts: Attempts,
    pub handlers: Handlers,
    pub database: Database,
    reloads: Family<ResultLabel, Counter>,
    /// Each queue's handles, by name.
    queues: RwLock<HashMap<String, Arc<QueueMetrics>>>,
    /// The queue gauges, when this instance is the one serving them.
    pub queue_gauges: Option<Arc<queues::QueueGauges>>,
}

impl Metrics {
    /// The families, with a series at 0 for each of `queue_names` (the config's). With
    /// `gauges`, the queues' depth is read from the database when this instance leads.
    pub fn new(queue_names: &[&str], gauges: Option<queues::QueueGauges>) -> Metrics {
        let mut registry = Registry::with_prefix("myjob");
        let attempts = Attempts::register(&mut registry);
        let handlers = Handlers::register(&mut registry);
        let database = Database::register(&mut registry);
        let reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Config reloads (SIGHUP), by result: ok or error",
            reloads.clone(),
        );
        registry.register(
            "build",
            "The myjob version serving these metrics",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let queue_gauges = gauges.map(Arc::new);
        if let Some(g) = &queue_gauges {
            g.register(&mut registry);
        }
        let metrics = Metrics {
            registry,
            attempts,
            handlers,
            database,
            reloads,
            queues: RwLock::new(HashMap::new()),
            queue_gauges,
        };
        for q in queue_names {
            metrics.add_queue(q);
        }
        for result in ["ok", "error"] {
            let _ = metrics.reloads.get_or_create(&ResultLabel {
                result: result.to_owned(),
            });
        }
        for outcome in ["requeued", "failed"] {
            let _ = metrics.attempts.rescued.get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            });
        }
        metrics
    }

    /// Makes queue `name`'s series, at 0 where they are new (a queue a reload added), and
    /// tells the queue gauges it is configured.
    pub fn add_queue(&self, name: &str) {
        if let Some(g) = &self.queue_gauges {
            g.configured(name);
        }
        let mut queues = self.queues.write().unwrap_or_else(|e| e.into_inner());
        if queues.contains_key(name) {
            return;
        }
        let queue = || QueueLabel {
            queue: name.to_owned(),
        };
        let handles = QueueMetrics {
            started: self.attempts.started.get_or_create(&queue()).clone(),
            finished: Outcome::ALL.map(|o| {
                self.attempts
                    .finished
                    .get_or_create(&OutcomeLabels {
                        queue: name.to_owned(),
                        outcome: o.label().to_owned(),
                    })
                    .clone()
            }),
            duration: self.attempts.duration.get_or_create(&queue()).clone(),
            wait: self.attempts.wait.get_or_create(&queue()).clone(),
            claims: ["jobs", "empty"].map(|r| {
                self.attempts
                    .claims
                    .get_or_create(&ClaimLabels {
                        queue: name.to_owned(),
                        result: r.to_owned(),
                    })
                    .clone()
            }),
            processes: ["idle", "busy"].map(|s| {
                self.handlers
                    .processes
                    .get_or_create(&ProcessLabels {
                        queue: name.to_owned(),
                        state: s.to_owned(),
                    })
                    .clone()
            }),
            exits: ProcessExit::ALL.map(|r| {
                self.handlers
                    .exits
                    .get_or_create(&ExitLabels {
                        queue: name.to_owned(),
                        reason: r.label().to_owned(),
                    })
                    .clone()
            }),
        };
        queues.insert(name.to_owned(), Arc::new(handles));
    }

    /// Queue `name`'s handles. A name the config does not hold (a job claimed before a
    /// reload removed its queue) gets its series then.
    pub fn queue(&self, name: &str) -> Arc<QueueMetrics> {
        if let Some(q) = self
            .queues
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return q.clone();
        }
        self.add_queue(name);
        self.queues
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .unwrap_or_else(|| unreachable!("queue {name} was just added"))
    }

    /// Every queue with series, and its handles.
    pub fn queues(&self) -> Vec<(String, Arc<QueueMetrics>)> {
        self.queues
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect()
    }

    /// The reaper put a dead worker's claim back (`failed` false) or failed its job.
    pub fn rescued(&self, failed: bool) {
        let outcome = if failed { "failed" } else { "requeued" };
        self.attempts
            .rescued
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// A statement (or a pass of several) of kind `op` took `took`, and failed with `error`.
    pub fn statement(&self, op: Op, took: Duration, error: Option<&anyhow::Error>) {
        let i = Op::ALL.iter().position(|o| *o == op).unwrap_or(0);
        if let Some(h) = self.database.statements.get(i) {
            h.observe(took.as_secs_f64());
        }
        if let Some(e) = error {
            self.database
                .errors
                .get_or_create(&ErrorLabels {
                    op: op.label().to_owned(),
                    kind: error_kind(e).to_owned(),
                })
                .inc();
        }
    }

    /// [`db::within`], timed and counted as `op`.
    pub async fn within<T>(
        &self,
        op: Op,
        limit: Duration,
        statement: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let t = Instant::now();
        let result = db::within(limit, statement).await;
        self.statement(op, t.elapsed(), result.as_ref().err());
        result
    }

    /// A config reload (SIGHUP) was taken, or refused.
    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }

    /// The text of a scrape: OpenMetrics when the scraper asks for it, Prometheus's classic
    /// text format otherwise (what `promtool check metrics` reads).
    pub fn encode(&self, openmetrics: bool) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family has HELP, base units and `_total` where Prometheus wants them, and the
    /// docs/monitoring.md lists exactly the families the code serves.
    #[test]
    fn the_readme_lists_every_family_served() {
        let settings =
            crate::config::from_text("[database]\nurl = \"mysql://u@127.0.0.1:3306/d\"\n").unwrap();
        let m = Metrics::new(&["q"], Some(queues::QueueGauges::new(settings.database)));
        // A family with no series yet is not encoded: one error makes it so.
        m.statement(Op::Claim, Duration::ZERO, Some(&anyhow::anyhow!("gone")));
        let text = m.encode(false).unwrap();
        let mut served: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
            .collect();
        // The leader's families, encoded only where it leads.
        served.extend(queues::FAMILIES.iter().map(|f| f.to_string()));
        served.sort();
        for l in text.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(l.split(' ').count() > 3, "no help: {l}");
        }
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/monitoring.md"))
                .unwrap();
        let mut listed: Vec<String> = readme
            .lines()
            .filter_map(|l| l.strip_prefix("| `myjob_"))
            .filter_map(|l| l.split('`').next())
            .map(|n| format!("myjob_{}", n.split('{').next().unwrap_or_default()))
            .collect();
        listed.sort();
        listed.dedup();
        assert_eq!(
            listed, served,
            "docs/monitoring.md's metric table and the code differ"
        );
    }
}
