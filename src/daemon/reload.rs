//! While the tasks run: reloads on SIGHUP, until the shutdown or a task that ends before it.

use std::sync::Arc;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::notify;
use super::tasks::{self, Tasks};
use super::RunOptions;
use crate::config::Settings;
use crate::metrics::Metrics;

/// Reloads on request until the shutdown, or until a task ends before it (a bug): that task,
/// which stops the others the same way and then fails the process, so that systemd restarts
/// it. One exit either way.
pub(super) async fn supervise(
    tasks: &mut Tasks,
    shutdown: &CancellationToken,
    reload: &Notify,
    opts: &RunOptions,
    settings: &watch::Sender<Arc<Settings>>,
    metrics: &Metrics,
) -> Option<tasks::Ended> {
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return None,
            ended = tasks.ended() => {
                // A task that stopped because the shutdown came meanwhile ended well.
                if shutdown.is_cancelled() && ended.panic.is_none() {
                    return None;
                }
                return Some(ended);
            }
            _ = reload.notified() => reload_settings(opts, settings, metrics),
        }
    }
}

/// SIGHUP: read the file again. A bad file is logged and the settings in use are kept. The
/// database settings are read only at start.
pub(super) fn reload_settings(
    opts: &RunOptions,
    tx: &watch::Sender<Arc<Settings>>,
    metrics: &Metrics,
) {
    notify::notify_reloading();
    match Settings::load(&opts.config).and_then(|s| s.check_runnable().map(|()| s)) {
        Ok(new) => {
            let old = tx.borrow().clone();
            if new.database.display != old.database.display {
                warn!("reload: [database] changes take effect at the next restart");
            }
            let queues: Vec<&str> = new.queues.iter().map(|q| q.name.as_str()).collect();
            info!(
                target: "myjob::msg::reloaded",
                concurrency = new.worker.concurrency,
                "reload: new configuration in use; queues: {}",
                queues.join(", ")
            );
            for q in &queues {
                metrics.add_queue(q);
            }
            metrics.reloaded(true);
            tx.send_replace(Arc::new(new));
        }
        Err(e) => {
            metrics.reloaded(false);
            error!(target: "myjob::msg::reload_refused", "reload: keeping the configuration in use: {e}")
        }
    }
    notify::notify_reloaded();
}
