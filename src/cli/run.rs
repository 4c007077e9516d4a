//! `myjob run`: the signals a worker listens for, around [`daemon::run`].

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::StreamExt as _;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::daemon::{self, RunOptions};
use crate::error::{Error, ExitCode, OrExit};

pub async fn run(config: PathBuf, instance: String) -> Result<(), Error> {
    let shutdown = CancellationToken::new();
    let reload = Arc::new(Notify::new());
    let signals =
        listen_for_signals(shutdown.clone(), reload.clone()).or_exit(ExitCode::Software)?;
    let result = daemon::run(RunOptions { config, instance }, shutdown, reload).await;
    signals.close();
    result
}

/// SIGTERM and SIGINT start the drain; SIGHUP asks for a reload.
fn listen_for_signals(
    shutdown: CancellationToken,
    reload: Arc<Notify>,
) -> std::io::Result<signal_hook_tokio::Handle> {
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    let handle = signals.handle();
    tokio::spawn(async move {
        while let Some(signal) = signals.next().await {
            match signal {
                SIGHUP => {
                    info!("SIGHUP: reloading the configuration");
                    reload.notify_one();
                }
                _ if shutdown.is_cancelled() => {
                    warn!("already stopping; waiting for running handlers")
                }
                _ => {
                    info!(signal, "shutting down");
                    shutdown.cancel();
                }
            }
        }
    });
    Ok(handle)
}
