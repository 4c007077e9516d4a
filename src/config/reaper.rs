//! `[reaper]`: when the claims of dead workers are put back.

use std::time::Duration;

use super::raw::RawReaper;
use super::values::{duration_min, int_in};
use super::KeyError;

/// `reaper.interval`: one reaper pass (several statements) per interval.
pub const MIN_REAPER_INTERVAL: Duration = Duration::from_millis(100);

/// `reaper.stale_after`: a claim younger than this is never put back.
pub const MIN_STALE_AFTER: Duration = Duration::from_secs(1);

/// `[reaper]`: when claims of dead workers are put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaperSettings {
    pub interval: Duration,
    pub stale_after: Duration,
    /// How many times a suspect may be rescued from a worker that died while running it in
    /// quarantine; the rescue that reaches it fails the job.
    pub max_rescues: u32,
}

/// Checks `[reaper]` into settings.
pub(super) fn validate(raw: RawReaper) -> Result<ReaperSettings, KeyError> {
    Ok(ReaperSettings {
        interval: duration_min(raw.interval, "30s", MIN_REAPER_INTERVAL, "reaper.interval")?,
        stale_after: duration_min(raw.stale_after, "2m", MIN_STALE_AFTER, "reaper.stale_after")?,
        max_rescues: int_in(raw.max_rescues, 3, 1, 1000, "reaper.max_rescues")? as u32,
    })
}
