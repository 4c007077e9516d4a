//! The status line: counters one instance keeps about itself, shared by the consumer (which
//! counts) and the status task ([`status_loop`], which reports them to systemd as STATUS= and
//! decides whether to pet the watchdog).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::notify;

#[derive(Debug)]
pub struct Counters {
    started: Instant,
    pub running: AtomicUsize,
    pub slots: AtomicUsize,
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub retried: AtomicU64,
    /// Milliseconds since `started` of the last claim that got jobs; 0 for never.
    last_claim_ms: AtomicU64,
    /// Milliseconds since `started` of the consumer loop's last turn.
    heartbeat_ms: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            started: Instant::now(),
            running: AtomicUsize::new(0),
            slots: AtomicUsize::new(0),
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            last_claim_ms: AtomicU64::new(0),
            heartbeat_ms: AtomicU64::new(0),
        }
    }
}

impl Counters {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn claimed(&self) {
        self.last_claim_ms.store(self.now_ms().max(1), Relaxed);
    }

    /// The consumer loop made a turn: it is not stuck.
    pub fn beat(&self) {
        self.heartbeat_ms.store(self.now_ms(), Relaxed);
    }

    /// How long since the consumer loop's last turn.
    pub fn since_beat(&self) -> Duration {
        Duration::from_millis(
            self.now_ms()
                .saturating_sub(self.heartbeat_ms.load(Relaxed)),
        )
    }

    /// One line for systemd's STATUS=: "running 3/8, done 120, failed 1, retried 4, last claim 2s ago".
    pub fn summary(&self) -> String {
        let last = match self.last_claim_ms.load(Relaxed) {
            0 => "never".to_owned(),
            ms => format!("{}s ago", self.now_ms().saturating_sub(ms) / 1000),
        };
        format!(
            "running {}/{}, done {}, failed {}, retried {}, last claim {last}",
            self.running.load(Relaxed),
            self.slots.load(Relaxed),
            self.done.load(Relaxed),
            self.failed.load(Relaxed),
            self.retried.load(Relaxed),
        )
    }
}

/// Reports STATUS= to systemd, and pets the watchdog while the consumer loop keeps turning.
/// The loop turns at least once a second when healthy; one that has not turned for a whole
/// watchdog period (stuck in a query, say) gets no more pings, and systemd restarts the unit.
pub(super) async fn status_loop(counters: Arc<Counters>, stop: CancellationToken) {
    let watchdog = notify::watchdog_timeout();
    let period = watchdog.map_or(Duration::from_secs(2), |w| {
        (w / 2).min(Duration::from_secs(2))
    });
    let mut last = String::new();
    loop {
        if let Some(w) = watchdog {
            if counters.since_beat() < w {
                notify::notify_watchdog();
            }
        }
        let line = counters.summary();
        if line != last {
            notify::notify_status(&line);
            last = line;
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(period) => {}
        }
    }
}
