//! Talking to systemd: READY, STOPPING, RELOADING, STATUS and the watchdog. Each helper logs
//! a failure and carries on; nothing here can fail the daemon. Outside systemd
//! (no NOTIFY_SOCKET) they do nothing.

use std::time::Duration;

use sd_notify::NotifyState;
use tracing::warn;

fn send(what: &str, state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        warn!("systemd: cannot send {what}: {e}");
    }
}

/// The database is reachable and the schema fits: systemd may consider the unit started.
pub fn notify_ready() {
    send("READY=1", &[NotifyState::Ready]);
}

/// The drain has begun.
pub fn notify_stopping() {
    send("STOPPING=1", &[NotifyState::Stopping]);
}

/// A reload (SIGHUP) begins; `notify_reloaded` ends it.
pub fn notify_reloading() {
    send("RELOADING=1", &[NotifyState::Reloading]);
}

pub fn notify_reloaded() {
    send("READY=1", &[NotifyState::Ready]);
}

/// The one-line summary `systemctl status` shows.
pub fn notify_status(line: &str) {
    send("STATUS=", &[NotifyState::Status(line)]);
}

pub fn notify_watchdog() {
    send("WATCHDOG=1", &[NotifyState::Watchdog]);
}

/// The watchdog period systemd set for this process (WatchdogSec=), if any.
pub fn watchdog_timeout() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}
