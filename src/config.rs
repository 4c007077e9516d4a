//! The configuration file. It is parsed first (serde, unknown keys rejected) into raw structs,
//! then validated into typed [`Settings`]; every error names the file and the key at fault.
//!
//! The file is read again on SIGHUP, so nothing here keeps state: [`Settings::load`] is the
//! whole story, and a bad new file is reported without touching the settings in use.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// Where `--config` points when it is not given.
pub const DEFAULT_PATH: &str = "/etc/myjob/myjob.toml";

/// The PATH a handler gets when myjob itself has none, and where a handler's bare command name
/// is looked for then.
pub const HANDLER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment variable that overrides `[database] url`.
pub const DATABASE_URL_ENV: &str = "MYJOB_DATABASE_URL";

/// `command = ["myjob:noop"]` runs no process: compiled in only with the `bench` feature, so the
/// benchmark can measure the queue without the cost of a spawn.
#[cfg(feature = "bench")]
pub const NOOP_HANDLER: &str = "myjob:noop";

/// The largest `concurrency` accepted: each slot may hold a process and three pipes.
const MAX_CONCURRENCY: i64 = 1024;
/// The largest `batch_size` accepted.
const MAX_BATCH_SIZE: i64 = 1000;
/// The largest payload a job can have: the MEDIUMBLOB column's.
pub const MAX_PAYLOAD_BYTES: i64 = 16 * 1024 * 1024 - 1;
/// What the default `max_payload_bytes` keeps the payloads an instance holds under: the
/// running jobs' and the prefetched ones', `concurrency + batch_size` at the most. 2 GiB
/// leaves the defaults (8 slots, claims of 100) the column's whole 16 MiB.
pub const PAYLOADS_HELD: i64 = 2 * 1024 * 1024 * 1024;
/// The least default `max_payload_bytes`, however many jobs an instance may hold.
const MIN_DEFAULT_PAYLOAD_BYTES: i64 = 64 * 1024;

// The shortest value of each duration key: below it a loop would spin (a poll, a reaper pass)
// or the value would make no sense (a handler killed before it could start, a persistent
// process stopped between two jobs). Zero is allowed only where it means something.

/// `worker.poll_interval`: the probe and the stager's pass; shorter would busy-loop.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// `worker.shutdown_timeout`: 0 is meaningful (handlers killed at once, their jobs released).
pub const MIN_SHUTDOWN_TIMEOUT: Duration = Duration::ZERO;
/// `worker.kill_grace`: the time a handler has between SIGTERM and SIGKILL, and a persistent
/// process between EOF and SIGTERM. Not 0: every recycled process would be killed.
pub const MIN_KILL_GRACE: Duration = Duration::from_millis(100);
/// `reaper.interval`: one reaper pass (several statements) per interval.
pub const MIN_REAPER_INTERVAL: Duration = Duration::from_millis(100);
/// `reaper.stale_after`: a claim younger than this is never put back.
pub const MIN_STALE_AFTER: Duration = Duration::from_secs(1);
/// `queue.timeout`: a handler's whole run, its start included.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(100);
/// `queue.backoff` (and so `backoff_max`): a failing job retried in a tight loop otherwise.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// `queue.idle_timeout`: shorter would stop a persistent process between two jobs.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// A configuration error: the file, the key (a path such as `queue[1].timeout`) and what is wrong.
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{}: {}: {}", self.file.display(), key, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

// ---- the file as written -------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    database: RawDatabase,
    #[serde(default)]
    worker: RawWorker,
    #[serde(default)]
    reaper: RawReaper,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    queue: Vec<RawQueue>,
    #[serde(default)]
    schedule: Vec<crate::schedule::RawSchedule>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDatabase {
    url: Option<String>,
    password_file: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    lock_wait_timeout: Option<String>,
}

// Integers are read as i64 so that a negative or huge value reaches validation and gets a
// message in our words rather than serde's.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    concurrency: Option<i64>,
    batch_size: Option<i64>,
    max_payload_bytes: Option<i64>,
    poll_interval: Option<String>,
    shutdown_timeout: Option<String>,
    kill_grace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawReaper {
    interval: Option<String>,
    stale_after: Option<String>,
    max_rescues: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    done: Option<String>,
    failed: Option<String>,
    cancelled: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    name: String,
    command: Vec<String>,
    timeout: Option<String>,
    max_attempts: Option<i64>,
    backoff: Option<String>,
    backoff_max: Option<String>,
    #[serde(default)]
    pass_env: Vec<String>,
    #[serde(default)]
    persistent: bool,
    max_jobs_per_process: Option<i64>,
    idle_timeout: Option<String>,
    rate_limit: Option<String>,
    rate_burst: Option<i64>,
    key_limit: Option<i64>,
}

// ---- the validated settings ----------------------------------------------------------------

/// Everything `myjob` reads from its configuration file, checked and typed.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The file these settings came from, for messages.
    pub path: PathBuf,
    pub database: DatabaseSettings,
    pub worker: WorkerSettings,
    pub reaper: ReaperSettings,
    pub retention: Retention,
    pub metrics: MetricsSettings,
    pub queues: Vec<Arc<QueueSettings>>,
    /// `[[schedule]]`: recurring jobs, each tick enqueued once across every instance.
    pub schedules: Vec<Arc<crate::schedule::ScheduleSettings>>,
}

/// `[metrics]`: where the instances serve `GET /metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// The address and base port; instance N listens on the port plus N. None: off.
    pub listen: Option<std::net::SocketAddr>,
    /// Whether the config set `listen`: an instance without a number is then an error, while
    /// under the default it only serves no metrics (see [`MetricsSettings::address_for`]).
    pub explicit: bool,
}

/// `[metrics] listen` when the config says nothing: loopback, and a base port outside
/// Prometheus's default port allocations (9100-9999, every one of them taken), so that it
/// collides with no registered exporter. Instance N serves on 17100 + N.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:17100";

impl MetricsSettings {
    /// Where instance `instance` serves: the base port plus its number. An instance whose
    /// name is not a number has no port of its own: an error when the config set `listen`,
    /// and no endpoint under the default (an instance named `web` kept working when metrics
    /// came on by default; the daemon says so at start).
    pub fn address_for(&self, instance: &str) -> Result<Option<std::net::SocketAddr>, String> {
        let Some(base) = self.listen else {
            return Ok(None);
        };
        if !self.explicit
            && instance
                .parse::<u16>()
                .ok()
                .and_then(|n| base.port().checked_add(n))
                .is_none()
        {
            return Ok(None);
        }
        let n: u16 = instance.parse().map_err(|_| {
            format!(
                "metrics.listen: instance {instance:?} has no number to add to the port {}; \
                 name instances 1, 2, ... (myjob@1) or set [metrics] listen = \"\"",
                base.port()
            )
        })?;
        let port = base.port().checked_add(n).ok_or_else(|| {
            format!(
                "metrics.listen: port {} + instance {n} is past 65535",
                base.port()
            )
        })?;
        Ok(Some(std::net::SocketAddr::new(base.ip(), port)))
    }
}

/// How to reach the database. The password lives only inside `opts`, never in `display`.
#[derive(Clone)]
pub struct DatabaseSettings {
    pub opts: mysql_async::Opts,
    /// `mysql://user@host:port/db`, without the password: safe to log.
    pub display: String,
    /// Where the password came from, for the permission check: the config file's url, or
    /// `password_file`.
    pub url_has_password: bool,
    pub password_file: Option<PathBuf>,
    /// Whether connections are encrypted: the url asks for it (`require_ssl=true`), or
    /// `tls_ca` names the CA that signed the server's certificate.
    pub tls: bool,
    /// The longest a statement waits for a row lock or a metadata lock, in whole seconds.
    pub lock_wait_timeout: u64,
}

impl DatabaseSettings {
    /// The settings of a bare url, as `[database] url = …` alone would give them.
    pub fn from_url(url: &str) -> Result<DatabaseSettings, String> {
        let raw = RawDatabase {
            url: Some(url.to_owned()),
            ..RawDatabase::default()
        };
        validate_database(raw, None).map_err(|(key, message)| format!("{key}: {message}"))
    }
}

impl fmt::Debug for DatabaseSettings {
    // Written by hand so that no `{:?}` of the settings can print the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &self.display)
            .finish_non_exhaustive()
    }
}

/// `[worker]`: how many handlers run at once and how the instance polls and stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Handler slots of one instance: at most this many handlers run at once.
    pub concurrency: usize,
    /// The most jobs one claim takes; a claim takes the free slots plus a short prefetch.
    pub batch_size: usize,
    /// The largest payload a claim loads: a job with a larger one fails without its payload
    /// being read, so that the payloads an instance holds stay under `(concurrency +
    /// batch_size) × max_payload_bytes`.
    pub max_payload_bytes: u64,
    /// How long to wait before claiming again after a claim found fewer jobs than it asked for.
    pub poll_interval: Duration,
    /// How long running handlers may finish after SIGTERM before they are killed.
    pub shutdown_timeout: Duration,
    /// After a handler's timeout, how long between SIGTERM and SIGKILL to its process group.
    pub kill_grace: Duration,
}

/// `[reaper]`: when claims of dead workers are put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaperSettings {
    pub interval: Duration,
    pub stale_after: Duration,
    /// How many times a suspect may be rescued from a worker that died while running it in
    /// quarantine; the rescue that reaches it fails the job.
    pub max_rescues: u32,
}

/// How long finished jobs stay in the table, by final state: `[retention]`, and the ages
/// `myjob purge` is given. None: for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub done: Option<Duration>,
    pub failed: Option<Duration>,
    pub cancelled: Option<Duration>,
}

impl Retention {
    /// Each final state with its age; states kept for ever are left out.
    pub fn ages(&self) -> Vec<(&'static str, Duration)> {
        [
            ("done", self.done),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
        ]
        .into_iter()
        .filter_map(|(status, age)| Some((status, age?)))
        .collect()
    }
}

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
    /// (see `worker::process`). None: a process per job.
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

impl Settings {
    /// Reads, parses and validates the file at `path`. `MYJOB_DATABASE_URL` overrides the url.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let err = |key: Option<&str>, message: String| ConfigError {
            file: path.to_owned(),
            key: key.map(str::to_owned),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| err(None, format!("cannot read: {e}")))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| err(None, "is not a UTF-8 text file".to_owned()))?;
        let raw = parse(&text).map_err(|(key, message)| err(key.as_deref(), message))?;
        let url_override = std::env::var(DATABASE_URL_ENV).ok();
        let mut settings =
            validate(raw, url_override).map_err(|(key, message)| err(Some(&key), message))?;
        settings.path = path.to_owned();
        Ok(settings)
    }

    /// What is wrong with who may read or write the files myjob trusts, one line each: the
    /// config file or `password_file` writable by its group or by every user (who could then
    /// choose the commands myjob runs, or the database it trusts), and the database password
    /// readable by every user (the config file when its url has it, and `password_file`).
    pub fn file_warnings(&self) -> Vec<String> {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
        let readable_by_all = |p: &Path| mode(p) & 0o004 != 0;
        let writable_by = |p: &Path| match mode(p) {
            m if m & 0o002 != 0 => Some("every user (chmod o-w)"),
            m if m & 0o020 != 0 => Some("its group (chmod g-w)"),
            _ => None,
        };
        let mut found = Vec::new();
        if let Some(who) = writable_by(&self.path) {
            found.push(format!(
                "{}: the file is writable by {who}, who may then choose the commands myjob runs",
                self.path.display()
            ));
        }
        if let Some(file) = &self.database.password_file {
            if let Some(who) = writable_by(file) {
                found.push(format!(
                    "{}: database.password_file {} is writable by {who}",
                    self.path.display(),
                    file.display()
                ));
            }
        }
        if self.database.url_has_password && readable_by_all(&self.path) {
            found.push(format!(
                "{}: database.url holds a password and the file is readable by every user (chmod o-r, or move the password to password_file)",
                self.path.display()
            ));
        }
        if let Some(file) = &self.database.password_file {
            if readable_by_all(file) {
                found.push(format!(
                    "{}: database.password_file {} is readable by every user (chmod o-r)",
                    self.path.display(),
                    file.display()
                ));
            }
        }
        found
    }

    /// The queue called `name`.
    pub fn queue(&self, name: &str) -> Option<&Arc<QueueSettings>> {
        self.queues.iter().find(|q| q.name == name)
    }

    /// The checks that only `run` and `check-config` need: at least one queue, and every
    /// handler an executable file. A producer that only enqueues may lack both.
    pub fn check_runnable(&self) -> Result<(), ConfigError> {
        let err = |key: String, message: String| ConfigError {
            file: self.path.clone(),
            key: Some(key),
            message,
        };
        if self.queues.is_empty() {
            return Err(err(
                "queue".into(),
                "no [[queue]] table: myjob run needs at least one".into(),
            ));
        }
        for (i, q) in self.queues.iter().enumerate() {
            check_executable(&q.command[0]).map_err(|m| err(format!("queue[{i}].command"), m))?;
        }
        Ok(())
    }
}

/// Parses the TOML text; an error comes with the key path where serde knows it.
fn parse(text: &str) -> Result<RawConfig, (Option<String>, String)> {
    let line_of = |span: Option<std::ops::Range<usize>>| {
        span.map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
    };
    let de = toml::Deserializer::parse(text).map_err(|e| {
        let at = line_of(e.span())
            .map(|l| format!("line {l}: "))
            .unwrap_or_default();
        (None, format!("{at}{}", one_line(e.message())))
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at = line_of(inner.span())
            .map(|l| format!(" (line {l})"))
            .unwrap_or_default();
        let key = (path != ".").then_some(path);
        (key, format!("{}{at}", one_line(inner.message())))
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

type Invalid = (String, String);

fn validate(raw: RawConfig, url_override: Option<String>) -> Result<Settings, Invalid> {
    let database = validate_database(raw.database, url_override)?;

    let w = raw.worker;
    let concurrency = int_in(w.concurrency, 8, 1, MAX_CONCURRENCY, "worker.concurrency")?;
    let batch_size = int_in(w.batch_size, 100, 1, MAX_BATCH_SIZE, "worker.batch_size")?;
    let worker = WorkerSettings {
        concurrency: concurrency as usize,
        batch_size: batch_size as usize,
        max_payload_bytes: int_in(
            w.max_payload_bytes,
            default_max_payload(concurrency, batch_size),
            1,
            MAX_PAYLOAD_BYTES,
            "worker.max_payload_bytes",
        )? as u64,
        poll_interval: duration_min(
            w.poll_interval,
            "500ms",
            MIN_POLL_INTERVAL,
            "worker.poll_interval",
        )?,
        shutdown_timeout: duration_min(
            w.shutdown_timeout,
            "30s",
            MIN_SHUTDOWN_TIMEOUT,
            "worker.shutdown_timeout",
        )?,
        kill_grace: duration_min(w.kill_grace, "5s", MIN_KILL_GRACE, "worker.kill_grace")?,
    };

    let reaper = ReaperSettings {
        interval: duration_min(
            raw.reaper.interval,
            "30s",
            MIN_REAPER_INTERVAL,
            "reaper.interval",
        )?,
        stale_after: duration_min(
            raw.reaper.stale_after,
            "2m",
            MIN_STALE_AFTER,
            "reaper.stale_after",
        )?,
        max_rescues: int_in(raw.reaper.max_rescues, 3, 1, 1000, "reaper.max_rescues")? as u32,
    };

    let r = raw.retention;
    let retention = Retention {
        done: age(r.done, "7d", "retention.done")?,
        failed: age(r.failed, "30d", "retention.failed")?,
        cancelled: age(r.cancelled, "30d", "retention.cancelled")?,
    };

    let mut names = HashSet::new();
    let mut queues = Vec::new();
    for (i, q) in raw.queue.into_iter().enumerate() {
        let key = |k: &str| format!("queue[{i}].{k}");
        check_queue_name(&q.name).map_err(|m| (key("name"), m))?;
        if !names.insert(q.name.clone()) {
            return Err((key("name"), format!("queue {:?} is defined twice", q.name)));
        }
        if q.command.first().is_none_or(|c| c.is_empty()) {
            return Err((
                key("command"),
                "must name a program: [\"/path/to/handler\", \"arg\", …]".into(),
            ));
        }
        for name in &q.pass_env {
            check_pass_env(name).map_err(|m| (key("pass_env"), m))?;
        }
        let backoff = duration_min(q.backoff, "10s", MIN_BACKOFF, &key("backoff"))?;
        let backoff_max = duration_min(q.backoff_max, "1h", MIN_BACKOFF, &key("backoff_max"))?;
        if backoff_max < backoff {
            return Err((
                key("backoff_max"),
                "must not be shorter than backoff".into(),
            ));
        }
        let persistent = if q.persistent {
            Some(Persistent {
                max_jobs_per_process: match q.max_jobs_per_process {
                    None => None,
                    Some(n) => {
                        Some(int_in(Some(n), 0, 1, i64::MAX, &key("max_jobs_per_process"))? as u64)
                    }
                },
                idle_timeout: duration_min(
                    q.idle_timeout,
                    "10m",
                    MIN_IDLE_TIMEOUT,
                    &key("idle_timeout"),
                )?,
            })
        } else {
            for (set, k) in [
                (q.max_jobs_per_process.is_some(), "max_jobs_per_process"),
                (q.idle_timeout.is_some(), "idle_timeout"),
            ] {
                if set {
                    return Err((
                        key(k),
                        "applies only to a queue with persistent = true".into(),
                    ));
                }
            }
            None
        };
        let rate = match q.rate_limit.as_deref() {
            None => {
                if q.rate_burst.is_some() {
                    return Err((key("rate_burst"), "applies only with a rate_limit".into()));
                }
                None
            }
            Some(text) => {
                let (count, interval_us) = parse_rate(text).map_err(|m| (key("rate_limit"), m))?;
                let burst = int_in(q.rate_burst, count.into(), 1, 1_000_000, &key("rate_burst"))?;
                Some(RateLimit {
                    interval_us,
                    burst: burst as u32,
                })
            }
        };
        queues.push(Arc::new(QueueSettings {
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
        }));
    }

    let metrics = MetricsSettings {
        // On unless turned off: every production queue is watched, and loopback exposes
        // nothing beyond the host.
        explicit: raw.metrics.listen.is_some(),
        listen: match raw.metrics.listen.as_deref().unwrap_or(DEFAULT_METRICS_LISTEN) {
            "" => None,
            text => Some(text.parse().map_err(|_| {
                (
                    "metrics.listen".to_owned(),
                    format!("{text:?} is not ADDRESS:PORT (say \"{DEFAULT_METRICS_LISTEN}\", or \"\" for off)"),
                )
            })?),
        },
    };

    let schedules = crate::schedule::validate(raw.schedule)?
        .into_iter()
        .map(Arc::new)
        .collect();
    Ok(Settings {
        path: PathBuf::new(), // set by `load`, which knows the file
        database,
        worker,
        reaper,
        retention,
        metrics,
        queues,
        schedules,
    })
}

fn validate_database(
    raw: RawDatabase,
    url_override: Option<String>,
) -> Result<DatabaseSettings, Invalid> {
    let key = if url_override.is_some() {
        DATABASE_URL_ENV
    } else {
        "database.url"
    };
    let url = url_override.or(raw.url).ok_or_else(|| {
        (
            "database.url".to_owned(),
            format!("missing (set it here, or in {DATABASE_URL_ENV})"),
        )
    })?;
    check_url_host(&url).map_err(|m| (key.to_owned(), m))?;
    check_url_at(&url).map_err(|m| (key.to_owned(), m))?;
    let opts = mysql_async::Opts::from_url(&url)
        .map_err(|e| (key.to_owned(), format!("not a valid mysql:// url: {e}")))?;
    check_url_parts(&url, &opts).map_err(|m| (key.to_owned(), m))?;
    let mut builder = mysql_async::OptsBuilder::from_opts(opts.clone());
    // mysql_async would otherwise switch a 127.0.0.1 connection over to the server's unix
    // socket, whose path may not exist where myjob runs (a container, a chroot).
    if !url.contains("prefer_socket") {
        builder = builder.prefer_socket(false);
    }
    let url_has_password = key == "database.url" && opts.pass().is_some();
    let password_file = raw.password_file;
    if let Some(file) = &password_file {
        if opts.pass().is_some() {
            return Err((
                "database.password_file".into(),
                "the url has a password already; keep it in one place".into(),
            ));
        }
        let text = std::fs::read_to_string(file).map_err(|e| {
            (
                "database.password_file".to_owned(),
                format!("cannot read {}: {e}", file.display()),
            )
        })?;
        let password = text.trim_end_matches(['\n', '\r']).to_owned();
        builder = builder.pass(Some(password));
    }
    if let Some(ca) = raw.tls_ca {
        let pem = read_ca(&ca).map_err(|m| ("database.tls_ca".to_owned(), m))?;
        // The CA turns TLS on, verified against it, unless the url already set TLS options
        // (`verify_identity=false` for a certificate that does not name the host, say).
        let ssl = opts.ssl_opts().cloned().unwrap_or_default();
        builder = builder.ssl_opts(Some(ssl.with_root_certs(vec![pem.into()])));
    }
    let opts = mysql_async::Opts::from(builder);
    let tls = opts.ssl_opts().is_some();
    if let Some(ssl) = opts.ssl_opts() {
        // mysql_async 0.37.1 recognises a name mismatch by an error text that rustls no longer
        // prints, so it would fail every connection however the flag is set: say so now.
        if ssl.skip_domain_validation() && !ssl.accept_invalid_certs() {
            return Err((
                key.to_owned(),
                "verify_identity=false with a verified CA is not supported by this build's TLS \
                 driver (it would reject every certificate that does not name the host): use a \
                 certificate that names the host, or verify_ca=false"
                    .into(),
            ));
        }
    }
    let display = format!(
        "mysql://{}@{}:{}/{}",
        opts.user().unwrap_or(""),
        opts.ip_or_hostname(),
        opts.tcp_port(),
        opts.db_name().unwrap_or("")
    );
    let wait = duration(raw.lock_wait_timeout, "15s", "database.lock_wait_timeout")?;
    if wait.subsec_nanos() != 0 || wait > Duration::from_secs(3600) {
        return Err((
            "database.lock_wait_timeout".into(),
            "must be whole seconds, from 1s to 1h (the servers count it in seconds)".into(),
        ));
    }
    Ok(DatabaseSettings {
        url_has_password,
        password_file,
        opts,
        display,
        tls,
        lock_wait_timeout: wait.as_secs(),
    })
}

/// Reads a CA file: PEM with at least one certificate. Read here, at load, so that a wrong
/// path is a config error naming the key rather than a failure at every connection.
fn read_ca(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&pem);
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(pem)
}

/// mysql_async quietly falls back to localhost for a url with no host; a config that names
/// no host is more likely a mistake, so it is refused.
fn check_url_host(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("mysql://")
        .ok_or_else(|| "must start with mysql://".to_owned())?;
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.split(':').next().unwrap_or("");
    if host.is_empty() {
        return Err("has no host: mysql://user@host:3306/database".into());
    }
    Ok(())
}

/// What to do with a password or user name a url cannot hold as it is.
const PERCENT_ENCODE: &str = "percent-encode `/` `?` `#` `@` `:` `%` in the user name and \
     password (`/` is %2F, `@` is %40), or move the password to database.password_file";

/// A `@` after the first `/`, `?` or `#` past the scheme while the part before has none: a
/// password (or user name) with one of those in it, which the parse would cut there, taking
/// what follows for the host, the port or the database, and the password for none: it would
/// then be logged as the database's name and sent to the server as one. Refused without
/// echoing the url. (A `@` in a query value after a whole `user:password@host` is the
/// value's own.)
fn check_url_at(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("mysql://").unwrap_or(url);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    if !authority.contains('@') && after.contains('@') {
        return Err(format!(
            "has a `@` after its host: the password or user name holds a character that ends \
             the host part, and would be cut there; {PERCENT_ENCODE}"
        ));
    }
    Ok(())
}

/// The parse kept the password the url's text has (`user:password@`), and left no `@` in the
/// host or the database's name. Never echoes the url.
fn check_url_parts(url: &str, opts: &mysql_async::Opts) -> Result<(), String> {
    let rest = url.strip_prefix("mysql://").unwrap_or(url);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    // `user:@host` is an empty password, which the parse gives as none.
    let has_password = authority
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty());
    if has_password && opts.pass().is_none() {
        return Err(format!(
            "its password was lost in parsing; {PERCENT_ENCODE}"
        ));
    }
    if opts.ip_or_hostname().contains('@') || opts.db_name().is_some_and(|d| d.contains('@')) {
        return Err(format!(
            "leaves a `@` in the host or the database's name: {PERCENT_ENCODE}"
        ));
    }
    Ok(())
}

/// Queue names appear in logs, in the environment and in SQL parameters: keep them plain.
pub fn check_queue_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "queue name {name:?} must be 1 to 64 letters, digits or _ - . :"
        ))
    }
}

fn check_pass_env(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!("{name:?} is not a variable name"));
    }
    // The database url may carry the password, and MYJOB_* is what myjob sets itself.
    if name.starts_with("MYJOB_") {
        return Err(format!("{name} is myjob's own and is never passed on"));
    }
    Ok(())
}

/// The PATH a handler gets: myjob's own, or [`HANDLER_PATH`] when myjob has none.
pub fn handler_path() -> OsString {
    std::env::var_os("PATH").unwrap_or_else(|| OsString::from(HANDLER_PATH))
}

/// Where a program named without a slash is found on `search`, as `execvp` would find it: the
/// first directory that holds an executable file of that name (an empty entry is the
/// working directory, as for `execvp`). Handlers are started from the path found: when the
/// child's environment sets PATH, the standard library forks the whole worker (its page
/// tables, its threads' stacks) to search PATH in the child, but it starts a path directly
/// with `posix_spawn`, which costs the worker a third of the CPU (per `cat` job, 200 µs
/// against 650).
///
/// A file counts when this user may run it (`access`), as `execvp` goes on past one it may
/// not; an empty entry is the working directory, as a `./` path so that the start stays a
/// spawn.
pub fn find_on_path(program: &str, search: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(search)
        .map(|dir| match dir.as_os_str().is_empty() {
            true => Path::new(".").join(program),
            false => dir.join(program),
        })
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file())
                && nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok()
        })
}

/// The handler must be a file that myjob can execute: named by path, or found on PATH.
fn check_executable(program: &str) -> Result<(), String> {
    #[cfg(feature = "bench")]
    if program == NOOP_HANDLER {
        return Ok(());
    }
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        find_on_path(program, &handler_path())
            .ok_or_else(|| format!("{program} is not found on PATH"))?
    };
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    if meta.permissions().mode() & 0o111 == 0
        || nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK).is_err()
    {
        return Err(format!("{} is not executable", path.display()));
    }
    Ok(())
}

/// The largest `key_limit`: each running job of a key holds a numbered slot (a SMALLINT).
const MAX_KEY_LIMIT: i64 = 10_000;

/// `max_payload_bytes` when the config gives none: [`PAYLOADS_HELD`] shared among the most
/// jobs an instance holds at once, at least [`MIN_DEFAULT_PAYLOAD_BYTES`] and at most the
/// column's limit (the limit for the defaults, 8 slots and claims of 100; about 1.9 MiB for
/// 64 slots and claims of 1000).
pub fn default_max_payload(concurrency: i64, batch_size: i64) -> i64 {
    (PAYLOADS_HELD / (concurrency + batch_size).max(1))
        .clamp(MIN_DEFAULT_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES)
}

fn int_in(value: Option<i64>, default: i64, min: i64, max: i64, key: &str) -> Result<i64, Invalid> {
    let v = value.unwrap_or(default);
    if v < min || v > max {
        return Err((
            key.to_owned(),
            format!("{v} is out of range: {min} to {max}"),
        ));
    }
    Ok(v)
}

fn duration(value: Option<String>, default: &str, key: &str) -> Result<Duration, Invalid> {
    let text = value.as_deref().unwrap_or(default);
    parse_duration(text).map_err(|m| (key.to_owned(), m))
}

/// A duration of at least `min`, zero only when `min` is: below it, the message names the
/// floor (`"1us" is shorter than the minimum of 10ms`).
fn duration_min(
    value: Option<String>,
    default: &str,
    min: Duration,
    key: &str,
) -> Result<Duration, Invalid> {
    let text = value.as_deref().unwrap_or(default);
    let min_text = humantime::format_duration(min);
    let zero = humantime::parse_duration(text.trim()).is_ok_and(|d| d.is_zero());
    let d = match (zero, min.is_zero()) {
        (true, true) => Duration::ZERO,
        (true, false) => {
            return Err((
                key.to_owned(),
                format!("{text:?} must be longer than zero (the minimum is {min_text})"),
            ))
        }
        (false, _) => parse_duration(text).map_err(|m| (key.to_owned(), m))?,
    };
    if d < min {
        return Err((
            key.to_owned(),
            format!("{text:?} is shorter than the minimum of {min_text}"),
        ));
    }
    Ok(d)
}

/// `"N/PERIOD"` (`"10/1s"`, `"600/1m"`): N from 1 to 1,000,000 starts per PERIOD of at
/// least 1ms. Returns N and PERIOD / N in microseconds.
pub fn parse_rate(text: &str) -> Result<(u32, i64), String> {
    let form = || format!("{text:?} is not N/PERIOD, such as \"10/1s\" or \"600/1m\"");
    let (count, period) = text.split_once('/').ok_or_else(form)?;
    let count: u32 = count.trim().parse().map_err(|_| form())?;
    if !(1..=1_000_000).contains(&count) {
        return Err(format!("{text:?}: N must be 1 to 1000000"));
    }
    let period = parse_duration(period.trim()).map_err(|_| form())?;
    if period < Duration::from_millis(1) {
        return Err(format!("{text:?}: PERIOD must be at least 1ms"));
    }
    // Rounded up: "3/1s" must not fit a fourth start into a second.
    let interval_us = period.as_micros().div_ceil(u128::from(count)).max(1);
    // PERIOD is at most ten years (parse_duration): the interval fits.
    Ok((count, i64::try_from(interval_us).unwrap_or(i64::MAX)))
}

fn age(value: Option<String>, default: &str, key: &str) -> Result<Option<Duration>, Invalid> {
    parse_age(value.as_deref().unwrap_or(default)).map_err(|m| (key.to_owned(), m))
}

/// Parses how long finished jobs are kept: a duration such as `"7d"` (zero too: deleted as
/// soon as they finish), or `"forever"`, which is None.
pub fn parse_age(text: &str) -> Result<Option<Duration>, String> {
    if text.trim() == "forever" {
        return Ok(None);
    }
    if humantime::parse_duration(text.trim()).is_ok_and(|d| d.is_zero()) {
        return Ok(Some(Duration::ZERO));
    }
    parse_duration(text)
        .map(Some)
        .map_err(|_| format!("{text:?} is not an age like \"12h\", \"7d\" or \"forever\""))
}

/// Parses a positive duration such as `"500ms"`, `"30s"` or `"5m"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|_| format!("{text:?} is not a duration like \"500ms\", \"30s\" or \"5m\""))?;
    if d.is_zero() {
        return Err(format!("{text:?} must be longer than zero"));
    }
    // Durations end up as microseconds in SQL and as tokio timers: keep them sane.
    if d > Duration::from_secs(10 * 365 * 24 * 3600) {
        return Err(format!("{text:?} is longer than ten years"));
    }
    Ok(d)
}

/// Settings from a config's text, for the crate's unit tests.
#[cfg(test)]
pub(crate) fn from_text(text: &str) -> Result<Settings, String> {
    let raw = parse(text).map_err(|(k, m)| format!("{k:?}: {m}"))?;
    validate(raw, None).map_err(|(k, m)| format!("{k}: {m}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(text: &str) -> Result<Settings, String> {
        from_text(text)
    }

    const MINIMAL: &str = "[database]\nurl = \"mysql://root@127.0.0.1:3306/test\"\n";

    #[test]
    fn a_program_is_found_on_path_as_execvp_finds_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (plain, runnable) = (dir.path().join("plain"), dir.path().join("runnable"));
        for d in [&plain, &runnable] {
            std::fs::create_dir(d).unwrap();
        }
        let write = |path: PathBuf, mode: u32| {
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        write(plain.join("h"), 0o644);
        let found = write(runnable.join("h"), 0o755);
        std::fs::create_dir(plain.join("d")).unwrap();
        let search = std::env::join_paths([&plain, &runnable]).unwrap();
        // A file that cannot be run and a directory are passed over, as exec passes them.
        assert_eq!(find_on_path("h", &search), Some(found));
        assert_eq!(find_on_path("d", &search), None);
        assert_eq!(find_on_path("none", &search), None);
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let s = load_str(MINIMAL).unwrap();
        assert_eq!(s.worker.concurrency, 8);
        assert_eq!(s.worker.poll_interval, Duration::from_millis(500));
        assert_eq!(s.reaper.stale_after, Duration::from_secs(120));
        assert_eq!(s.database.display, "mysql://root@127.0.0.1:3306/test");
    }

    #[test]
    fn a_rate_limit_is_an_interval_and_a_burst() {
        let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n";
        let rate = |extra: &str| load_str(&format!("{MINIMAL}{q}{extra}")).unwrap().queues[0].rate;
        assert_eq!(rate(""), None);
        assert_eq!(
            rate("rate_limit = \"600/1m\"\n"),
            Some(RateLimit {
                interval_us: 100_000,
                burst: 600
            })
        );
        assert_eq!(
            rate("rate_limit = \"10 / 1s\"\nrate_burst = 1\n"),
            Some(RateLimit {
                interval_us: 100_000,
                burst: 1
            })
        );
        // Faster than one a microsecond: one a microsecond.
        assert_eq!(
            rate("rate_limit = \"1000000/1ms\"\n").unwrap().interval_us,
            1
        );
    }

    #[test]
    fn unknown_keys_name_their_table() {
        let e = load_str(&format!("{MINIMAL}[worker]\nconcurency = 3\n")).unwrap_err();
        assert!(
            e.contains("worker") && e.contains("unknown field `concurency`"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n";
        for (text, key) in [
            (
                format!("{MINIMAL}[worker]\nconcurrency = 0\n"),
                "worker.concurrency",
            ),
            (
                format!("{MINIMAL}[worker]\nconcurrency = 1000000\n"),
                "worker.concurrency",
            ),
            (
                format!("{MINIMAL}[worker]\npoll_interval = \"0s\"\n"),
                "worker.poll_interval",
            ),
            (
                format!("{MINIMAL}[reaper]\nstale_after = \"-5s\"\n"),
                "reaper.stale_after",
            ),
            (
                format!("{MINIMAL}{q}timeout = \"soon\"\n"),
                "queue[0].timeout",
            ),
            (format!("{MINIMAL}{q}{q}"), "queue[1].name"),
            (
                format!("{MINIMAL}[[queue]]\nname = \"a b\"\ncommand = [\"x\"]\n"),
                "queue[0].name",
            ),
            (
                format!("{MINIMAL}[[queue]]\nname = \"a\"\ncommand = []\n"),
                "queue[0].command",
            ),
            (
                format!("{MINIMAL}{q}pass_env = [\"MYJOB_DATABASE_URL\"]\n"),
                "queue[0].pass_env",
            ),
            (
                "[database]\nurl = \"mysql:///test\"\n".to_owned(),
                "database.url",
            ),
            (
                format!("{MINIMAL}{q}max_jobs_per_process = 5\n"),
                "queue[0].max_jobs_per_process",
            ),
            (
                format!("{MINIMAL}{q}persistent = true\nmax_jobs_per_process = 0\n"),
                "queue[0].max_jobs_per_process",
            ),
            (
                format!("{MINIMAL}{q}rate_limit = \"10\"\n"),
                "queue[0].rate_limit",
            ),
            (
                format!("{MINIMAL}{q}rate_limit = \"0/1s\"\n"),
                "queue[0].rate_limit",
            ),
            (
                format!("{MINIMAL}{q}rate_limit = \"10/0s\"\n"),
                "queue[0].rate_limit",
            ),
            (
                format!("{MINIMAL}{q}rate_limit = \"10/500us\"\n"),
                "queue[0].rate_limit",
            ),
            (
                format!("{MINIMAL}{q}rate_burst = 5\n"),
                "queue[0].rate_burst",
            ),
            (
                format!("{MINIMAL}{q}rate_limit = \"10/1s\"\nrate_burst = 0\n"),
                "queue[0].rate_burst",
            ),
            (
                format!("{MINIMAL}{q}persistent = true\nidle_timeout = \"0s\"\n"),
                "queue[0].idle_timeout",
            ),
            ("[worker]\n".to_owned(), "database.url"),
        ] {
            let e = load_str(&text).unwrap_err();
            assert!(e.starts_with(key), "{key}: {e}");
        }
    }

    #[test]
    fn the_shipped_configs_are_valid() {
        for text in [
            include_str!("../config/myjob.toml"),
            include_str!("../config/local.toml"),
            include_str!("../examples/sms/myjob.toml"),
            include_str!("../examples/flash-sale/myjob.toml"),
        ] {
            // The password file exists only where the example is installed.
            load_str(&text.replace("password_file", "# password_file")).unwrap();
        }
        let s = load_str(include_str!("../config/myjob.toml")).unwrap();
        // The reference file documents the defaults: it must not drift from them.
        let d = load_str(MINIMAL).unwrap();
        // Commented out, as it is computed: the figure it shows is the default's.
        let shown = format!("# max_payload_bytes = {}\n", d.worker.max_payload_bytes);
        assert_eq!(
            (s.worker, s.reaper, s.retention),
            (d.worker, d.reaper, d.retention)
        );
        assert!(
            include_str!("../config/myjob.toml").contains(&shown),
            "{shown}"
        );
    }

    #[test]
    fn a_url_that_would_lose_its_password_is_refused_without_echoing_it() {
        let url = |u: &str| load_str(&format!("[database]\nurl = \"{u}\"\n"));
        for good in [
            "mysql://app@127.0.0.1:3306/app",
            "mysql://app:@127.0.0.1:3306/app",
            "mysql://app:p@ss@127.0.0.1:3306/app",
            "mysql://app:%2Fs3cr3t@127.0.0.1:3306/app",
            "mysql://app:a:b@127.0.0.1:3306/app?prefer_socket=false",
            "mysql://app:pw@127.0.0.1:3306/app?socket=/run/a@b/mysqld.sock",
        ] {
            assert!(url(good).is_ok(), "{good}: {:?}", url(good).err());
        }
        for bad in [
            "mysql://app:/s3cr3t@127.0.0.1:3306/app",
            "mysql://app:12/s3cr3t@127.0.0.1:3306/app",
            "mysql://app:a/b@c@127.0.0.1:3306/app",
            "mysql://app:q?x@127.0.0.1:3306/app",
            "mysql://app:h#x@127.0.0.1:3306/app",
        ] {
            let e = url(bad).unwrap_err();
            assert!(
                e.contains("database.url: ") && e.contains("percent-encode"),
                "{e}"
            );
            assert!(
                !e.contains("s3cr3t") && !e.contains("q?x") && !e.contains("h#x"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_default_payload_limit_shares_two_gibibytes_among_the_jobs_held() {
        let d = load_str(MINIMAL).unwrap();
        assert_eq!(d.worker.max_payload_bytes, 16_777_215);
        assert_eq!(default_max_payload(1, 1), MAX_PAYLOAD_BYTES);
        assert_eq!(default_max_payload(64, 1000), 2_018_311);
        assert_eq!(default_max_payload(1024, 1000), 1_061_009);
        assert_eq!(
            default_max_payload(1024, 1000 * 1000),
            MIN_DEFAULT_PAYLOAD_BYTES
        );
        for (c, b) in [(8, 100), (64, 100), (1024, 1000)] {
            assert!(default_max_payload(c, b) * (c + b) <= PAYLOADS_HELD);
        }
        // As the reference file says it.
        let gib = PAYLOADS_HELD >> 30;
        let example = include_str!("../config/myjob.toml").replace("\n# ", " ");
        assert!(
            example.contains(&format!("By default {gib} GiB shared among them")),
            "config/myjob.toml should give {gib} GiB"
        );
        let e = load_str(&format!(
            "{MINIMAL}[worker]\nmax_payload_bytes = 16777216\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("worker.max_payload_bytes: 16777216 is out of range"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_name_their_key() {
        let e = load_str(&format!("{MINIMAL}[worker]\nconcurrency = \"eight\"\n")).unwrap_err();
        assert!(e.contains("worker.concurrency"), "{e}");
        let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\npersistent = \"yes\"\n";
        let e = load_str(&format!("{MINIMAL}{q}")).unwrap_err();
        assert!(e.contains("queue[0].persistent"), "{e}");
    }

    #[test]
    fn retention_keeps_finished_jobs_for_an_age_or_for_ever() {
        let d = load_str(MINIMAL).unwrap().retention;
        let day = Duration::from_secs(86_400);
        assert_eq!(
            (d.done, d.failed, d.cancelled),
            (Some(7 * day), Some(30 * day), Some(30 * day))
        );
        let s = load_str(&format!(
            "{MINIMAL}[retention]\ndone = \"0s\"\nfailed = \"forever\"\n"
        ))
        .unwrap()
        .retention;
        assert_eq!(
            s.ages(),
            [("done", Duration::ZERO), ("cancelled", 30 * day)]
        );
        for bad in ["\"soon\"", "\"-1d\"", "\"\"", "7"] {
            let e = load_str(&format!("{MINIMAL}[retention]\nfailed = {bad}\n")).unwrap_err();
            assert!(e.contains("retention.failed"), "{bad}: {e}");
        }
    }

    #[test]
    fn metrics_listen_gives_each_numbered_instance_its_port() {
        let on = MetricsSettings {
            listen: Some("127.0.0.1:17100".parse().unwrap()),
            explicit: true,
        };
        assert_eq!(
            on.address_for("3").unwrap(),
            Some("127.0.0.1:17103".parse().unwrap())
        );
        assert!(on
            .address_for("web")
            .unwrap_err()
            .contains("\"web\" has no number"));
        let high = MetricsSettings {
            listen: Some("127.0.0.1:65535".parse().unwrap()),
            explicit: true,
        };
        assert!(high.address_for("1").unwrap_err().contains("past 65535"));
        let off = MetricsSettings {
            listen: None,
            explicit: true,
        };
        assert_eq!(off.address_for("web"), Ok(None));
        let queue = "[[queue]]\nname = \"q\"\ncommand = [\"true\"]\n";
        // On by default, on 17100 + N; an instance without a number then serves nothing.
        let default = load_str(&format!("{MINIMAL}{queue}")).unwrap();
        assert_eq!(
            default.metrics.address_for("2"),
            Ok(Some("127.0.0.1:17102".parse().unwrap()))
        );
        assert_eq!(default.metrics.address_for("web"), Ok(None));
        let off = load_str(&format!("{MINIMAL}[metrics]\nlisten = \"\"\n{queue}")).unwrap();
        assert_eq!(off.metrics.listen, None);
        let bad = load_str(&format!("{MINIMAL}[metrics]\nlisten = \"here\"\n{queue}")).unwrap_err();
        assert!(
            bad.contains("metrics.listen") && bad.contains("is not ADDRESS:PORT"),
            "{bad}"
        );
    }

    #[test]
    fn intervals_have_a_floor_named_with_their_key() {
        let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n";
        let p = format!("{q}persistent = true\n");
        let b = format!("{q}backoff = \"100ms\"\n");
        // (the table the key is in, the key, a value below its floor, the floor)
        for (table, key, below, floor) in [
            ("[worker]\n", "worker.poll_interval", "1us", "10ms"),
            ("[worker]\n", "worker.poll_interval", "9ms", "10ms"),
            ("[worker]\n", "worker.kill_grace", "1ms", "100ms"),
            ("[worker]\n", "worker.kill_grace", "0s", "100ms"),
            ("[reaper]\n", "reaper.interval", "99ms", "100ms"),
            ("[reaper]\n", "reaper.stale_after", "999ms", "1s"),
            ("[reaper]\n", "reaper.stale_after", "0s", "1s"),
            (q, "queue[0].timeout", "10ms", "100ms"),
            (q, "queue[0].backoff", "1ns", "100ms"),
            (&b, "queue[0].backoff_max", "50ms", "100ms"),
            (&p, "queue[0].idle_timeout", "500ms", "1s"),
        ] {
            let name = key.rsplit('.').next().unwrap();
            let with = |v: &str| load_str(&format!("{MINIMAL}{table}{name} = \"{v}\"\n"));
            let e = with(below).unwrap_err();
            assert!(e.starts_with(&format!("{key}: ")), "{key}: {e}");
            assert!(
                e.contains(&format!("the minimum is {floor}"))
                    || e.contains(&format!("the minimum of {floor}")),
                "{key}: {e}"
            );
            assert!(!e.contains('\n'), "{e}");
            // The floor itself is accepted.
            with(floor).unwrap_or_else(|e| panic!("{key} = {floor}: {e}"));
        }
        let e = load_str(&format!("{MINIMAL}[worker]\npoll_interval = \"1us\"\n")).unwrap_err();
        assert_eq!(
            e,
            "worker.poll_interval: \"1us\" is shorter than the minimum of 10ms"
        );
        // A zero shutdown_timeout means something: on SIGTERM the handlers are killed at once
        // and their jobs released.
        let s = load_str(&format!("{MINIMAL}[worker]\nshutdown_timeout = \"0s\"\n")).unwrap();
        assert_eq!(s.worker.shutdown_timeout, Duration::ZERO);
    }

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
