//! `[retention]`: how long finished jobs stay in the table.

use std::time::Duration;

use super::raw::RawRetention;
use super::values::age;
use super::KeyError;

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

/// Checks `[retention]` into settings.
pub(super) fn validate(r: RawRetention) -> Result<Retention, KeyError> {
    Ok(Retention {
        done: age(r.done, "7d", "retention.done")?,
        failed: age(r.failed, "30d", "retention.failed")?,
        cancelled: age(r.cancelled, "30d", "retention.cancelled")?,
    })
}
