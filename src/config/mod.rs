//! The configuration file. It is parsed first (serde, unknown keys rejected) into raw structs,
//! then validated into typed [`Settings`]; every error names the file and the key at fault.
//!
//! The file is read again on SIGHUP, so nothing here keeps state: [`Settings::load`] is the
//! whole story, and a bad new file is reported without touching the settings in use.
//!
//! One file per section, each with its raw struct's validation into its typed settings
//! (zincati's way): `database`, `worker`, `reaper`, `retention`, `metrics`, `queue` (with
//! `handler`, where a handler is found) and `schedule`; `raw` is the file as serde reads it,
//! `values` the shared readers of numbers, durations and ages.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod database;
mod handler;
mod metrics;
mod queue;
mod raw;
mod reaper;
mod retention;
mod schedule;
mod values;
mod worker;

pub use database::{DatabaseSettings, DATABASE_URL_ENV};
#[cfg(feature = "bench")]
pub use handler::NOOP_HANDLER;
pub use handler::{find_on_path, handler_path, HANDLER_PATH};
pub use metrics::{MetricsSettings, DEFAULT_METRICS_LISTEN};
pub use queue::{
    check_queue_name, Persistent, QueueSettings, RateLimit, MIN_BACKOFF, MIN_IDLE_TIMEOUT,
    MIN_TIMEOUT,
};

pub use reaper::{ReaperSettings, MIN_REAPER_INTERVAL, MIN_STALE_AFTER};
pub use retention::Retention;
pub use schedule::{CatchUp, ScheduleSettings, When, MAX_CATCH_UP};
pub use values::{parse_age, parse_duration, parse_rate};
pub use worker::{
    default_max_payload, WorkerSettings, MAX_PAYLOAD_BYTES, MIN_KILL_GRACE, MIN_POLL_INTERVAL,
    MIN_SHUTDOWN_TIMEOUT, PAYLOADS_HELD,
};

use handler::check_executable;
use raw::RawConfig;

/// Where `--config` points when it is not given.
pub const DEFAULT_PATH: &str = "/etc/myjob/myjob.toml";

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
/// What is wrong with one key: its path in the file (`queue[1].timeout`) and why. Each
/// section's validation returns it; [`Settings::load`] adds the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub key: String,
    pub message: String,
}

impl KeyError {
    pub fn new(key: impl Into<String>, message: String) -> KeyError {
        KeyError {
            key: key.into(),
            message,
        }
    }

    /// The error of `key` for a message, as `map_err` takes it: `.map_err(KeyError::at(key))`.
    pub fn at(key: impl Into<String>) -> impl FnOnce(String) -> KeyError {
        let key = key.into();
        move |message| KeyError { key, message }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

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
    pub schedules: Vec<Arc<ScheduleSettings>>,
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
        let raw = raw::parse(&text).map_err(|(key, message)| err(key.as_deref(), message))?;
        let url_override = std::env::var(DATABASE_URL_ENV).ok();
        let mut settings = validate(raw, url_override).map_err(|e| err(Some(&e.key), e.message))?;
        settings.path = path.to_owned();
        Ok(settings)
    }

    /// What is wrong with who may read or write the files myjob trusts, one line each: the
    /// config file or `password_file` writable by its group or by every user (who could then
    /// choose the commands myjob runs, or the database it trusts), and the database password
    /// readable by every user (the config file when its url has it, and `password_file`).
    pub fn file_warnings(&self) -> Vec<String> {
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

/// Each section checked into its settings, in the file's order of importance: the database
/// first, as a config without a url is of no use.
fn validate(raw: RawConfig, url_override: Option<String>) -> Result<Settings, KeyError> {
    Ok(Settings {
        path: PathBuf::new(), // set by `load`, which knows the file
        database: database::validate(raw.database, url_override)?,
        worker: worker::validate(raw.worker)?,
        reaper: reaper::validate(raw.reaper)?,
        retention: retention::validate(raw.retention)?,
        queues: queue::validate(raw.queue)?,
        metrics: metrics::validate(raw.metrics)?,
        schedules: schedule::validate(raw.schedule)?
            .into_iter()
            .map(Arc::new)
            .collect(),
    })
}

/// Settings from a config's text, for the crate's unit tests.
#[cfg(test)]
pub(crate) fn from_text(text: &str) -> Result<Settings, String> {
    let raw = raw::parse(text).map_err(|(k, m)| format!("{k:?}: {m}"))?;
    validate(raw, None).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
