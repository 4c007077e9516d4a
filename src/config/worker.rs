//! `[worker]`: how many handlers an instance runs at once, how much it claims and holds, and
//! how it polls and stops.

use std::time::Duration;

use super::raw::RawWorker;
use super::values::{duration_min, int_in};
use super::KeyError;

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
pub(super) const MIN_DEFAULT_PAYLOAD_BYTES: i64 = 64 * 1024;

/// `worker.poll_interval`: the probe and the stager's pass; shorter would busy-loop.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// `worker.shutdown_timeout`: 0 is meaningful (handlers killed at once, their jobs released).
pub const MIN_SHUTDOWN_TIMEOUT: Duration = Duration::ZERO;

/// `worker.kill_grace`: the time a handler has between SIGTERM and SIGKILL, and a persistent
/// process between EOF and SIGTERM. Not 0: every recycled process would be killed.
pub const MIN_KILL_GRACE: Duration = Duration::from_millis(100);

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

/// Checks `[worker]` into settings.
pub(super) fn validate(w: RawWorker) -> Result<WorkerSettings, KeyError> {
    let concurrency = int_in(w.concurrency, 8, 1, MAX_CONCURRENCY, "worker.concurrency")?;
    let batch_size = int_in(w.batch_size, 100, 1, MAX_BATCH_SIZE, "worker.batch_size")?;
    Ok(WorkerSettings {
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
    })
}

/// `max_payload_bytes` when the config gives none: [`PAYLOADS_HELD`] shared among the most
/// jobs an instance holds at once, at least [`MIN_DEFAULT_PAYLOAD_BYTES`] and at most the
/// column's limit (the limit for the defaults, 8 slots and claims of 100; about 1.9 MiB for
/// 64 slots and claims of 1000).
pub fn default_max_payload(concurrency: i64, batch_size: i64) -> i64 {
    (PAYLOADS_HELD / (concurrency + batch_size).max(1))
        .clamp(MIN_DEFAULT_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES)
}
