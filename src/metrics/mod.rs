//! The instance's Prometheus metrics: what happened here (counters and histograms of
//! attempts, claims, the database link), labelled by the config's queue names only, never by
//! a job's id, key or payload. Served at `GET /metrics` by [`server`].
//!
//! Families are registered once, at start, and each queue's series made at 0 then, so that a
//! series never appears late (Prometheus's "avoid missing metrics"); a queue added by a
//! reload gets its series on first use.

pub mod server;

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// How an attempt ended, as the `outcome` label says it.
pub const OUTCOMES: [&str; 6] = ["done", "retried", "failed", "cancelled", "released", "lost"];

/// A handler's run time, in seconds: from a few ms to an hour.
const DURATION_BUCKETS: [f64; 17] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
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

/// The instance's metrics. Cheap to update from any task: every metric is atomics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub started: Family<QueueLabel, Counter>,
    pub finished: Family<OutcomeLabels, Counter>,
    pub duration: Family<QueueLabel, Histogram>,
    pub claims: Family<ClaimLabels, Counter>,
    pub slots: Gauge,
    pub busy: Gauge,
    pub prefetched: Gauge,
    pub outcomes_pending: Gauge,
    pub db_up: Gauge,
    pub last_claim: Gauge<f64, AtomicU64>,
    pub reloads: Family<ResultLabel, Counter>,
}

impl Metrics {
    /// The families, with a series at 0 for each of `queues` (the config's).
    pub fn new(queues: &[&str]) -> Metrics {
        let mut registry = Registry::with_prefix("myjob");
        let started = Family::<QueueLabel, Counter>::default();
        registry.register(
            "jobs_started",
            "Attempts handed to a handler.",
            started.clone(),
        );
        let finished = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "jobs_finished",
            "Attempts ended, by outcome: done, retried, failed, cancelled, released (given back \
             without using up the attempt), lost (its claim was gone at a reconnect: another worker's \
             now, and the handler was stopped).",
            finished.clone(),
        );
        let duration = Family::<QueueLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        registry.register_with_unit(
            "job_duration",
            "How long a handler ran, from its start to its exit or answer.",
            Unit::Seconds,
            duration.clone(),
        );
        let claims = Family::<ClaimLabels, Counter>::default();
        registry.register(
            "claims",
            "Claim statements, by whether they got jobs.",
            claims.clone(),
        );
        let slots = Gauge::default();
        registry.register(
            "handler_slots",
            "worker.concurrency: handler slots.",
            slots.clone(),
        );
        let busy = Gauge::default();
        registry.register(
            "handler_slots_busy",
            "Handler slots running a job.",
            busy.clone(),
        );
        let prefetched = Gauge::default();
        registry.register(
            "prefetched_jobs",
            "Jobs claimed ahead, not started yet.",
            prefetched.clone(),
        );
        let outcomes_pending = Gauge::default();
        registry.register(
            "outcomes_pending",
            "Outcomes not written yet: held while the database is away.",
            outcomes_pending.clone(),
        );
        let db_up = Gauge::default();
        registry.register(
            "db_up",
            "1 while the claim connection is up, 0 while it reconnects.",
            db_up.clone(),
        );
        let last_claim = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "last_claim_timestamp",
            "When a claim last got jobs, as a Unix time (alert on time() minus it).",
            Unit::Seconds,
            last_claim.clone(),
        );
        let reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Config reloads (SIGHUP), by result: ok or error.",
            reloads.clone(),
        );
        registry.register(
            "build",
            "The myjob version serving these metrics.",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let metrics = Metrics {
            registry,
            started,
            finished,
            duration,
            claims,
            slots,
            busy,
            prefetched,
            outcomes_pending,
            db_up,
            last_claim,
            reloads,
        };
        for q in queues {
            metrics.queue(q);
        }
        for result in ["ok", "error"] {
            let _ = metrics.reloads.get_or_create(&ResultLabel {
                result: result.to_owned(),
            });
        }
        metrics
    }

    /// Makes queue `name`'s series, at 0 where they are new.
    pub fn queue(&self, name: &str) {
        let queue = || name.to_owned();
        let _ = self.started.get_or_create(&QueueLabel { queue: queue() });
        let _ = self.duration.get_or_create(&QueueLabel { queue: queue() });
        for outcome in OUTCOMES {
            let _ = self.finished.get_or_create(&OutcomeLabels {
                queue: queue(),
                outcome: outcome.to_owned(),
            });
        }
        for result in ["jobs", "empty"] {
            let _ = self.claims.get_or_create(&ClaimLabels {
                queue: queue(),
                result: result.to_owned(),
            });
        }
    }

    /// An attempt of a job of `queue` ended with `outcome` (one of [`OUTCOMES`]) after
    /// `seconds`.
    pub fn finished(&self, queue: &str, outcome: &str, seconds: f64) {
        self.finished
            .get_or_create(&OutcomeLabels {
                queue: queue.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
        self.duration
            .get_or_create(&QueueLabel {
                queue: queue.to_owned(),
            })
            .observe(seconds);
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
