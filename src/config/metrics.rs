//! `[metrics]`: where the instances serve `GET /metrics`.

use std::net::SocketAddr;

use super::raw::RawMetrics;
use super::KeyError;

/// `[metrics]`: where the instances serve `GET /metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// The address and base port; instance N listens on the port plus N. None: off.
    pub listen: Option<SocketAddr>,
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
    pub fn address_for(&self, instance: &str) -> Result<Option<SocketAddr>, String> {
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
        Ok(Some(SocketAddr::new(base.ip(), port)))
    }
}

/// Checks `[metrics]` into settings.
pub(super) fn validate(raw: RawMetrics) -> Result<MetricsSettings, KeyError> {
    Ok(MetricsSettings {
        // On unless turned off: every production queue is watched, and loopback exposes
        // nothing beyond the host.
        explicit: raw.listen.is_some(),
        listen: match raw.listen.as_deref().unwrap_or(DEFAULT_METRICS_LISTEN) {
            "" => None,
            text => Some(text.parse().map_err(|_| {
                KeyError::new(
                    "metrics.listen",
                    format!("{text:?} is not ADDRESS:PORT (say \"{DEFAULT_METRICS_LISTEN}\", or \"\" for off)"),
                )
            })?),
        },
    })
}
