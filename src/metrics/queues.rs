//! The queue gauges: each queue's jobs by state and the age of its oldest due job, read from
//! the database's indexes at scrape time and cached for [`CACHE`], by one instance only of all
//! those using the database (N instances exporting N copies of one global figure would make
//! every `sum()` N times too large).
//!
//! The one instance is the holder of a named lock of its own (`GET_LOCK`, one per database on
//! the server), taken by its first scrape and held by an idle connection for as long as that
//! lives. Not the reaper's lock: the reaper takes that for each pass and lets it go, so that a
//! frozen instance never stops the reaping; a leader must stay the same from one scrape to
//! the next. When the leader dies its connection closes, the server frees the lock, and the
//! next scrape of another instance takes it. On Galera the lock is the node's (one leader per
//! node; `max without(instance)` makes them one), and where the server refuses lock functions
//! every instance serves the gauges. An instance that nobody scrapes opens no connection; one
//! that is scraped holds one more, idle between scrapes, and a leader nobody scrapes for
//! [`IDLE`] lets the lead go with it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::Conn;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tracing::{debug, info};

use super::{Metrics, Op};
use crate::config::DatabaseSettings;
use crate::db::{self, NamedLock};
use crate::error::chain;
use crate::store::jobs::admin::{self, QueueStats};
use crate::store::queues;

/// How long one reading of the database serves scrapes: several Prometheus servers (or one
/// with a short interval) cost the database one count per this.
pub const CACHE: Duration = Duration::from_secs(5);
/// The most a reading may take; past it the reading is given up (the gauges are left out
/// until the next one) and the server stops the statement. A scrape waits for less (see
/// `server`), and meanwhile gets the reading before.
const READ_LIMIT: Duration = Duration::from_secs(5);
/// The leader's session ends (and its lock with it) when unused for this long: a leader
/// that nobody scrapes any more, or that is cut off, hands over within it.
const IDLE: Duration = Duration::from_secs(120);
/// The most queues the gauges name; the jobs of any more count as [`OTHER`].
const MAX_QUEUES: usize = 100;
/// The leader's lock.
const LOCK: &str = "myjob_metrics";
/// The label of the jobs of queues past the first [`MAX_QUEUES`].
const OTHER: &str = "(other)";
/// The states the gauges count: those still to act on (done and cancelled jobs are history
/// that retention deletes, and counting them would walk the whole table).
const STATES: [&str; 6] = [
    "pending",
    "blocked",
    "suspect",
    "scheduled",
    "claimed",
    "failed",
];
/// The families only the leader serves, as a scrape names them.
pub const FAMILIES: [&str; 3] = [
    "myjob_queue_jobs",
    "myjob_queue_oldest_due_age_seconds",
    "myjob_queue_paused",
];

/// What the last reading found, per queue.
#[derive(Debug, Default, Clone, Copy)]
struct Depth {
    /// The count of each of [`STATES`].
    counts: [u64; 6],
    /// The oldest due job's age in seconds.
    age: u64,
    paused: bool,
}

/// The queues' depths, and whether the paused queues could be read.
#[derive(Debug, Default)]
struct Reading {
    queues: BTreeMap<String, Depth>,
    pauses_read: bool,
}

/// The leader's connection and whether it holds the lock.
#[derive(Default)]
struct Reader {
    conn: Option<Conn>,
    leading: bool,
    /// When the last reading was made, successful or not.
    at: Option<Instant>,
}

pub struct QueueGauges {
    db: DatabaseSettings,
    /// The config's queue names: each gets its series at 0, empty or not.
    names: Mutex<Vec<String>>,
    reader: tokio::sync::Mutex<Reader>,
    /// What the scrapes encode: None when this instance does not lead.
    shown: Mutex<Option<Reading>>,
    /// 1 while this instance serves the gauges.
    leader: Gauge,
}

impl std::fmt::Debug for QueueGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueGauges")
            .field("database", &self.db.display)
            .finish_non_exhaustive()
    }
}

impl QueueGauges {
    pub fn new(db: DatabaseSettings) -> Self {
        QueueGauges {
            db,
            names: Mutex::new(Vec::new()),
            reader: tokio::sync::Mutex::new(Reader::default()),
            shown: Mutex::new(None),
            leader: Gauge::default(),
        }
    }

    /// Registers the leader gauge and the collector of the queue gauges.
    pub(super) fn register(self: &std::sync::Arc<Self>, registry: &mut Registry) {
        registry.register(
            "queue_gauges_leader",
            "1 on the one instance that serves the queue gauges (myjob_queue_*) for the \
             database, 0 on the others",
            self.leader.clone(),
        );
        registry.register_collector(Box::new(Shown(self.clone())));
    }

    /// Queue `name` is in the config.
    pub(super) fn configured(&self, name: &str) {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }

    /// Before a scrape: reads the database again when the last reading is older than
    /// [`CACHE`], taking the lead if nobody holds it. Concurrent scrapes wait for one reading.
    pub async fn refresh(&self, metrics: &Metrics) {
        let mut reader = self.reader.lock().await;
        if reader.at.is_some_and(|at| at.elapsed() < CACHE) {
            return;
        }
        let was_leading = reader.leading;
        let t = Instant::now();
        let read = db::within(READ_LIMIT, reader.read(&self.db)).await;
        reader.at = Some(Instant::now());
        let reading = match read {
            Ok(Some(stats)) => {
                metrics.statement(Op::QueueGauges, t.elapsed(), None);
                Some(self.reading(stats))
            }
            Ok(None) => None,
            Err(e) => {
                metrics.statement(Op::QueueGauges, t.elapsed(), Some(&e));
                debug!("metrics: reading the queue gauges: {}", chain(&*e));
                // A fresh connection next time; the lock goes with this one.
                *reader = Reader {
                    at: reader.at,
                    ..Reader::default()
                };
                None
            }
        };
        if reader.leading != was_leading {
            if reader.leading {
                info!("metrics: this instance serves the queue gauges");
            } else {
                info!("metrics: this instance no longer serves the queue gauges");
            }
        }
        self.leader.set(i64::from(reading.is_some()));
        *self.shown.lock().unwrap_or_else(|e| e.into_inner()) = reading;
    }

    /// The database's counts by queue: the config's queues (at 0 when empty) and the
    /// table's, by name whichever instance leads, up to [`MAX_QUEUES`]; the rest as [`OTHER`].
    fn reading(&self, (stats, paused): Counted) -> Reading {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut queues: BTreeMap<String, Depth> = names
            .iter()
            .map(|n| (n.clone(), Depth::default()))
            .collect();
        for (name, q) in stats {
            let key = if queues.contains_key(&name) || queues.len() < MAX_QUEUES {
                name
            } else {
                OTHER.to_owned()
            };
            let d = queues.entry(key).or_default();
            for (c, n) in d.counts.iter_mut().zip([
                q.pending,
                q.blocked,
                q.suspect,
                q.scheduled,
                q.claimed,
                q.failed,
            ]) {
                *c += n;
            }
            d.age = d.age.max(q.oldest_pending_age_s);
        }
        let pauses_read = paused.is_some();
        for name in paused.unwrap_or_default() {
            if let Some(d) = queues.get_mut(&name) {
                d.paused = true;
            }
        }
        Reading {
            queues,
            pauses_read,
        }
    }
}

/// A reading's counts by queue, and the paused queues (None when the account may not read
/// them).
type Counted = (BTreeMap<String, QueueStats>, Option<Vec<String>>);

impl Reader {
    /// One reading, or None when another instance leads. A connection that broke since the
    /// last reading (a server's wait_timeout, a KILL, a restart) is replaced at once, once.
    async fn read(&mut self, db: &DatabaseSettings) -> anyhow::Result<Option<Counted>> {
        let had = self.conn.is_some();
        match self.read_once(db).await {
            Err(e) if had && !db::classify(&e).keeps_connection() => {
                *self = Reader {
                    at: self.at,
                    ..Reader::default()
                };
                self.read_once(db).await
            }
            read => read,
        }
    }

    async fn read_once(&mut self, db: &DatabaseSettings) -> anyhow::Result<Option<Counted>> {
        if self.conn.is_none() {
            let mut conn = db::connect(db).await?;
            // A leader nobody scrapes any more, or one cut off, lets the lock go once the
            // server closes its idle session; and no count outlives the scrape that wanted
            // it (each server has its own name for the bound).
            let version: Option<String> = conn.query_first("SELECT VERSION()").await?;
            let bound = if version.unwrap_or_default().contains("MariaDB") {
                format!("SET SESSION max_statement_time = {}", READ_LIMIT.as_secs())
            } else {
                format!(
                    "SET SESSION MAX_EXECUTION_TIME = {}",
                    READ_LIMIT.as_millis()
                )
            };
            conn.query_drop(bound).await?;
            db::set_wait_timeout(&mut conn, IDLE).await?;
            self.conn = Some(conn);
            self.leading = false;
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        // A server that takes no writes is not where the workers are: after a failover that
        // kept this session, the old primary's counts would stand beside the new one's.
        let read_only: Option<i64> = conn.query_first("SELECT @@global.read_only").await?;
        if read_only == Some(1) {
            anyhow::bail!("the server is read-only: not the one the workers use");
        }
        if !self.leading {
            match db::try_lock(conn, LOCK).await? {
                NamedLock::Busy => return Ok(None),
                NamedLock::Held | NamedLock::Unsupported => self.leading = true,
            }
        }
        let stats = admin::stats(conn, false).await?;
        // The pauses are the operator's (`myjob pause`): an alert on a paused queue's backlog
        // is noise. An account that may not read them gets the depths all the same.
        let paused = match queues::paused(conn).await {
            Ok(paused) => Some(paused),
            Err(e) => {
                debug!("metrics: reading the paused queues: {}", chain(&*e));
                None
            }
        };
        Ok(Some((stats, paused)))
    }
}

/// The collector: encodes the last reading, nothing when this instance does not lead.
#[derive(Debug)]
struct Shown(std::sync::Arc<QueueGauges>);

impl Collector for Shown {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let shown = self.0.shown.lock().unwrap_or_else(|e| e.into_inner());
        let Some(reading) = shown.as_ref() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            "queue_jobs",
            "Jobs by queue and state (pending, blocked, suspect, scheduled, claimed, failed), counted \
             from the indexes at scrape time and cached for 5 s; served by one instance only \
             (myjob_queue_gauges_leader): aggregate with max without(instance).",
            None,
            MetricType::Gauge,
        )?;
        for (queue, d) in &reading.queues {
            for (state, n) in STATES.iter().zip(d.counts) {
                let labels = [("queue", queue.as_str()), ("state", *state)];
                ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "queue_oldest_due_age",
            "How long the queue's oldest due job has waited past its run_at, 0 when none is \
             due; read at scrape time and cached for 5 s, served by one instance only \
             (myjob_queue_gauges_leader): aggregate with max without(instance).",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for (queue, d) in &reading.queues {
            let labels = [("queue", queue.as_str())];
            ConstGauge::new(d.age as i64).encode(family.encode_family(&labels)?)?;
        }
        if reading.pauses_read {
            let mut family = encoder.encode_descriptor(
                "queue_paused",
                "1 while an operator has paused the queue (myjob pause); served by one \
                 instance only (myjob_queue_gauges_leader).",
                None,
                MetricType::Gauge,
            )?;
            for (queue, d) in &reading.queues {
                let labels = [("queue", queue.as_str())];
                ConstGauge::new(i64::from(d.paused)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::STATES;

    /// The states the docs and the example's queries name are the ones counted.
    #[test]
    fn the_docs_name_the_states_counted() {
        let listed = STATES
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let docs = include_str!("../../docs/monitoring.md");
        assert!(
            docs.contains(&format!("| gauge | leader only: jobs {listed} |")),
            "docs/monitoring.md should list {listed}"
        );
        let example = include_str!("../../examples/prometheus/README.md");
        assert!(
            example.contains(&format!("# Queue depth by state: {}\n", STATES.join(", "))),
            "examples/prometheus/README.md should list {STATES:?}"
        );
    }
}
