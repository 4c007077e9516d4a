//! Counters one instance keeps about itself, shared by the consumer (which counts) and the
//! status task (which reports them to systemd and decides whether to pet the watchdog).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Stats {
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

impl Default for Stats {
    fn default() -> Self {
        Stats {
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

impl Stats {
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
