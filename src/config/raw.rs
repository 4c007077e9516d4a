//! The file as written: serde's structs, unknown keys rejected. Integers are read as i64 and
//! durations as text, so that a negative, huge or misspelt value reaches validation and gets a
//! message in our words rather than serde's.

use std::path::PathBuf;

use serde::Deserialize;

use super::schedule::RawSchedule;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) database: RawDatabase,
    #[serde(default)]
    pub(super) worker: RawWorker,
    #[serde(default)]
    pub(super) reaper: RawReaper,
    #[serde(default)]
    pub(super) retention: RawRetention,
    #[serde(default)]
    pub(super) metrics: RawMetrics,
    #[serde(default)]
    pub(super) queue: Vec<RawQueue>,
    #[serde(default)]
    pub(super) schedule: Vec<RawSchedule>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDatabase {
    pub(super) url: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) lock_wait_timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorker {
    pub(super) concurrency: Option<i64>,
    pub(super) batch_size: Option<i64>,
    pub(super) max_payload_bytes: Option<i64>,
    pub(super) poll_interval: Option<String>,
    pub(super) shutdown_timeout: Option<String>,
    pub(super) kill_grace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReaper {
    pub(super) interval: Option<String>,
    pub(super) stale_after: Option<String>,
    pub(super) max_rescues: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetention {
    pub(super) done: Option<String>,
    pub(super) failed: Option<String>,
    pub(super) cancelled: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQueue {
    pub(super) name: String,
    pub(super) command: Vec<String>,
    pub(super) timeout: Option<String>,
    pub(super) max_attempts: Option<i64>,
    pub(super) backoff: Option<String>,
    pub(super) backoff_max: Option<String>,
    #[serde(default)]
    pub(super) pass_env: Vec<String>,
    #[serde(default)]
    pub(super) persistent: bool,
    pub(super) max_jobs_per_process: Option<i64>,
    pub(super) idle_timeout: Option<String>,
    pub(super) rate_limit: Option<String>,
    pub(super) rate_burst: Option<i64>,
    pub(super) key_limit: Option<i64>,
}

/// Parses the TOML text; an error comes with the key path where serde knows it.
pub(super) fn parse(text: &str) -> Result<RawConfig, (Option<String>, String)> {
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
