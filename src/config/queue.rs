//! `[[queue]]`: a queue's name and how its jobs are handled: the handler, its timeout and
//! retries, persistent processes, and the limits on how many start.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::handler::check_pass_env;
use super::raw::RawQueue;
use super::values::{duration_min, int_in, parse_rate};
use super::KeyError;

/// `queue.timeout`: a handler's whole run, its start included.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(100);

/// `queue.backoff` (and so `backoff_max`): a failing job retried in a tight loop otherwise.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// `queue.idle_timeout`: shorter would stop a persistent process between two jobs.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// The largest `key_limit`: each running job of a key holds a numbered slot (a SMALLINT).
const MAX_KEY_LIMIT: i64 = 10_000;

/// One `[[queue]]`: its name and how its jobs are handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    pub name: String,
    /// The handler's argv; `command[0]` is run directly, without a shell.
    pub command: Vec<String>,
    pub timeout: Duration,
    /// Used when a job's own `max_attempts` is NULL.
    pub max_attempts: u32,
    /// The first retry waits about this long; each further one twice as long, up to `backoff_max`.
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// Names of variables copied from myjob's environment into the handler's.
    pub pass_env: Vec<String>,
    /// `persistent = true`: one long-lived handler process per slot, jobs framed on its stdin
    /// (see `worker::handler::process`). None: a process per job.
    pub persistent: Option<Persistent>,
    /// `rate_limit`: how many of the queue's jobs may start per period, across every
    /// instance and host. None: as many as there are slots for.
    pub rate: Option<RateLimit>,
    /// `key_limit`: how many jobs of one concurrency key may run at once, across every
    /// instance and host (jobs without a key are not limited).
    pub key_limit: u16,
}

/// A queue's rate limit, as the generic cell rate algorithm keeps it (see
/// `store::queues::reserve`): each start takes `interval_us` of a budget that refills with
/// time and holds at most `burst` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// `rate_limit = "N/PERIOD"`: PERIOD / N, in microseconds (the database's unit); at
    /// least 1, at most ten years.
    pub interval_us: i64,
    /// `rate_burst`: how many jobs may start at once after a quiet spell (default N).
    pub burst: u32,
}

/// How a persistent queue's processes are recycled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistent {
    /// After this many jobs a process gets EOF on stdin and a fresh one takes the next job
    /// (php-fpm's `pm.max_requests`, for leaky code). None: no limit.
    pub max_jobs_per_process: Option<u64>,
    /// A process that has waited this long without a job is stopped (EOF on stdin); the next
    /// job starts a new one.
    pub idle_timeout: Duration,
}

/// Checks the `[[queue]]` tables into settings: names unique, handlers named, limits in range.
pub(super) fn validate(raw: Vec<RawQueue>) -> Result<Vec<Arc<QueueSettings>>, KeyError> {
    let mut names = HashSet::new();
    let mut queues = Vec::new();
    for (i, q) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("queue[{i}].{k}");
        check_queue_name(&q.name).map_err(KeyError::at(key("name")))?;
        if !names.insert(q.name.clone()) {
            return Err(KeyError::new(
                key("name"),
                format!("queue {:?} is defined twice", q.name),
            ));
        }
        queues.push(Arc::new(queue(q, &key)?));
    }
    Ok(queues)
}

/// One `[[queue]]` whose name was checked: the rest of its keys, in the file's order.
fn queue(q: RawQueue, key: &impl Fn(&str) -> String) -> Result<QueueSettings, KeyError> {
    if q.command.first().is_none_or(|c| c.is_empty()) {
        return Err(KeyError::new(
            key("command"),
            "must name a program: [\"/path/to/handler\", \"arg\", …]".into(),
        ));
    }
    for name in &q.pass_env {
        check_pass_env(name).map_err(KeyError::at(key("pass_env")))?;
    }
    let backoff = duration_min(q.backoff.clone(), "10s", MIN_BACKOFF, &key("backoff"))?;
    let backoff_max = duration_min(
        q.backoff_max.clone(),
        "1h",
        MIN_BACKOFF,
        &key("backoff_max"),
    )?;
    if backoff_max < backoff {
        return Err(KeyError::new(
            key("backoff_max"),
            "must not be shorter than backoff".into(),
        ));
    }
    let persistent = persistent(&q, key)?;
    let rate = rate(&q, key)?;
    Ok(QueueSettings {
        rate,
        key_limit: int_in(q.key_limit, 1, 1, MAX_KEY_LIMIT, &key("key_limit"))? as u16,
        persistent,
        timeout: duration_min(q.timeout, "5m", MIN_TIMEOUT, &key("timeout"))?,
        max_attempts: int_in(q.max_attempts, 10, 1, 1000, &key("max_attempts"))? as u32,
        backoff,
        backoff_max,
        pass_env: q.pass_env,
        command: q.command,
        name: q.name,
    })
}

/// `persistent = true` and its keys, which mean nothing without it.
fn persistent(q: &RawQueue, key: &impl Fn(&str) -> String) -> Result<Option<Persistent>, KeyError> {
    if !q.persistent {
        for (set, k) in [
            (q.max_jobs_per_process.is_some(), "max_jobs_per_process"),
            (q.idle_timeout.is_some(), "idle_timeout"),
        ] {
            if set {
                return Err(KeyError::new(
                    key(k),
                    "applies only to a queue with persistent = true".into(),
                ));
            }
        }
        return Ok(None);
    }
    Ok(Some(Persistent {
        max_jobs_per_process: match q.max_jobs_per_process {
            None => None,
            Some(n) => Some(int_in(Some(n), 0, 1, i64::MAX, &key("max_jobs_per_process"))? as u64),
        },
        idle_timeout: duration_min(
            q.idle_timeout.clone(),
            "10m",
            MIN_IDLE_TIMEOUT,
            &key("idle_timeout"),
        )?,
    }))
}

/// `rate_limit`, and `rate_burst`, which means nothing without it.
fn rate(q: &RawQueue, key: &impl Fn(&str) -> String) -> Result<Option<RateLimit>, KeyError> {
    let Some(text) = q.rate_limit.as_deref() else {
        if q.rate_burst.is_some() {
            return Err(KeyError::new(
                key("rate_burst"),
                "applies only with a rate_limit".into(),
            ));
        }
        return Ok(None);
    };
    let (count, interval_us) = parse_rate(text).map_err(KeyError::at(key("rate_limit")))?;
    let burst = int_in(q.rate_burst, count.into(), 1, 1_000_000, &key("rate_burst"))?;
    Ok(Some(RateLimit {
        interval_us,
        burst: burst as u32,
    }))
}

/// Whether `name` is 1 to 64 of A-Z a-z 0-9 - _ . : (a queue's and a schedule's names).
pub(super) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

/// Queue names appear in logs, in the environment and in SQL parameters: keep them plain.
pub fn check_queue_name(name: &str) -> Result<(), String> {
    if is_plain_name(name) {
        Ok(())
    } else {
        Err(format!(
            "queue name {name:?} must be 1 to 64 letters, digits or _ - . :"
        ))
    }
}
