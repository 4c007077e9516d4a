//! The families an instance registers, by concern: what its attempts did, what its handler
//! slots hold, what the database answered. Each group registers itself once, at start (see
//! [`Metrics::new`](super::Metrics::new)), and keeps the handles the instance updates.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry, Unit};

use super::{
    ClaimLabels, ErrorLabels, ExitLabels, Op, OpLabel, OutcomeLabel, OutcomeLabels, ProcessLabels,
    QueueLabel, DURATION_BUCKETS, STATEMENT_BUCKETS, WAIT_BUCKETS,
};

/// What the attempts did: started, ended by outcome, how long they waited and ran; the claims
/// that got them, and the dead workers' claims this instance's reaper put back.
#[derive(Debug)]
pub struct Attempts {
    pub(super) started: Family<QueueLabel, Counter>,
    pub(super) finished: Family<OutcomeLabels, Counter>,
    pub(super) duration: Family<QueueLabel, Histogram>,
    pub(super) wait: Family<QueueLabel, Histogram>,
    pub(super) claims: Family<ClaimLabels, Counter>,
    pub(super) rescued: Family<OutcomeLabel, Counter>,
    pub last_claim: Gauge<f64, AtomicU64>,
}

impl Attempts {
    pub(super) fn register(registry: &mut Registry) -> Attempts {
        let started = register(
            registry,
            "jobs_started",
            "Attempts handed to a handler",
            Family::<QueueLabel, Counter>::default(),
        );
        let finished = register(
            registry,
            "jobs_finished",
            "Attempts ended, by outcome, counted once written: done, retried, failed, cancelled, \
             released (given back without using up the attempt), lost (the write matched no row: \
             the claim had been put back while this instance was away, and is another worker's)",
            Family::<OutcomeLabels, Counter>::default(),
        );
        let duration = seconds(
            registry,
            "job_duration",
            "How long a handler ran, from its start to its exit or answer",
            Family::<QueueLabel, Histogram>::new_with_constructor(|| {
                Histogram::new(DURATION_BUCKETS)
            }),
        );
        let wait = seconds(
            registry,
            "job_wait",
            "How long a job waited from due (its run_at) to its handler's start: from the \
             database's clock to the claim, then this instance's to the start",
            Family::<QueueLabel, Histogram>::new_with_constructor(|| Histogram::new(WAIT_BUCKETS)),
        );
        let claims = register(
            registry,
            "claims",
            "Claim statements, by whether they got jobs",
            Family::<ClaimLabels, Counter>::default(),
        );
        let rescued = register(
            registry,
            "rescued_jobs",
            "Claims of dead workers this instance's reaper put back: requeued, or failed (a \
             poison pill: its workers died under it max_rescues times)",
            Family::<OutcomeLabel, Counter>::default(),
        );
        let last_claim = seconds(
            registry,
            "last_claim_timestamp",
            "When a claim last got jobs, as a Unix time (alert on time() minus it)",
            Gauge::<f64, AtomicU64>::default(),
        );
        Attempts {
            started,
            finished,
            duration,
            wait,
            claims,
            rescued,
            last_claim,
        }
    }
}

/// What the handler slots hold: busy ones, jobs claimed ahead, persistent processes and why
/// they ended.
#[derive(Debug)]
pub struct Handlers {
    pub(super) processes: Family<ProcessLabels, Gauge>,
    pub(super) exits: Family<ExitLabels, Counter>,
    pub slots: Gauge,
    pub busy: Gauge,
    pub prefetched: Gauge,
}

impl Handlers {
    pub(super) fn register(registry: &mut Registry) -> Handlers {
        let processes = register(
            registry,
            "persistent_processes",
            "Persistent handler processes, by state: idle or busy",
            Family::<ProcessLabels, Gauge>::default(),
        );
        let exits = register(
            registry,
            "persistent_process_exits",
            "Persistent handler processes ended, by reason: recycled (max_jobs_per_process), \
             idle (idle_timeout, or room made for another queue), reload (its queue changed), \
             unfit (found dead or writing out of turn while idle), job (it died with its job, \
             or was killed with it: a timeout, a cancel), shutdown",
            Family::<ExitLabels, Counter>::default(),
        );
        let slots = register(
            registry,
            "handler_slots",
            "worker.concurrency: handler slots",
            Gauge::default(),
        );
        let busy = register(
            registry,
            "handler_slots_busy",
            "Handler slots running a job",
            Gauge::default(),
        );
        let prefetched = register(
            registry,
            "prefetched_jobs",
            "Jobs claimed ahead, not started yet",
            Gauge::default(),
        );
        Handlers {
            processes,
            exits,
            slots,
            busy,
            prefetched,
        }
    }
}

/// What the database answered: each statement's time by op, failures by kind, whether the
/// claim connection is up, and the outcomes held while it is not.
#[derive(Debug)]
pub struct Database {
    /// Each op's histogram, in [`Op::ALL`]'s order: found without a label set.
    pub(super) statements: Vec<Histogram>,
    pub(super) errors: Family<ErrorLabels, Counter>,
    pub outcomes_pending: Gauge,
    pub db_up: Gauge,
}

impl Database {
    pub(super) fn register(registry: &mut Registry) -> Database {
        let statements = seconds(
            registry,
            "db_statement_duration",
            "How long the database took to answer, by what was asked (op)",
            Family::<OpLabel, Histogram>::new_with_constructor(|| {
                Histogram::new(STATEMENT_BUCKETS)
            }),
        );
        let statements = Op::ALL
            .iter()
            .map(|op| {
                statements
                    .get_or_create(&OpLabel {
                        op: op.label().to_owned(),
                    })
                    .clone()
            })
            .collect();
        let errors = register(
            registry,
            "db_errors",
            "Statements that failed, by op and kind: deadlock (or a Galera certification \
             conflict), lock_wait, read_only (the server takes no writes), refused, connection \
             (broken, or no answer in time), other",
            Family::<ErrorLabels, Counter>::default(),
        );
        let outcomes_pending = register(
            registry,
            "outcomes_pending",
            "Outcomes not written yet: held while the database is away",
            Gauge::default(),
        );
        let db_up = register(
            registry,
            "db_up",
            "1 while the claim connection is up, 0 while it reconnects",
            Gauge::default(),
        );
        Database {
            statements,
            errors,
            outcomes_pending,
            db_up,
        }
    }
}

/// Registers `metric` as `name` and gives it back: the registry keeps a clone, which shares
/// its values.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// [`register`], in seconds.
fn seconds<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register_with_unit(name, help, Unit::Seconds, metric.clone());
    metric
}
