//! An instance's start, before its tasks: the config read and checked, the metrics' port
//! bound, the database waited for until its schema fits, and the guard started.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::RunOptions;
use crate::config::Settings;
use crate::db;
use crate::error::{Error, ExitCode, OrExit};
use crate::metrics;
use crate::store::schema;
use crate::worker::guard::Guard;

/// The config file, read and checked, its warnings (a password readable by all) logged.
pub(super) fn load_settings(opts: &RunOptions) -> Result<Settings, Error> {
    let settings = Settings::load(&opts.config).or_exit(ExitCode::Config)?;
    settings.check_runnable().or_exit(ExitCode::Config)?;
    for warning in settings.file_warnings() {
        warn!("{warning}");
    }
    Ok(settings)
}

/// The metrics endpoint's address and socket, bound now, when this instance serves one.
pub(super) async fn bind_metrics(
    opts: &RunOptions,
    settings: &Settings,
) -> Result<Option<(SocketAddr, TcpListener)>, Error> {
    let config_error = |e: String| {
        Error::new(
            ExitCode::Config,
            anyhow::anyhow!("{}: {e}", opts.config.display()),
        )
    };
    let Some(at) = settings
        .metrics
        .address_for(&opts.instance)
        .map_err(config_error)?
    else {
        if settings.metrics.listen.is_some() {
            warn!(
                instance = %opts.instance,
                "metrics: this instance serves no metrics: its name is not a number to add to the [metrics] listen port (name instances 1, 2, ... or set [metrics] listen)"
            );
        }
        return Ok(None);
    };
    let listener = metrics::server::bind(at).await.map_err(|e| {
        config_error(format!(
            "metrics.listen: cannot listen on {at}: {e} (another instance with the same number, or another program: set [metrics] listen to another base, or \"\" for none)"
        ))
    })?;
    Ok(Some((at, listener)))
}

/// How the wait for the database ended.
pub(super) enum Startup {
    /// It answers and the schema fits.
    Ready,
    /// The shutdown came first.
    Stopped,
}

/// Waits for the database as long as it takes: READY=1 only once it answers and the schema
/// fits. A missing or newer schema is a configuration error, not worth retrying; a server
/// that goes away between the connect and the check (a restart) is.
pub(super) async fn wait_for_schema(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> Result<Startup, Error> {
    let mut backoff = db::Backoff::default();
    loop {
        let connected = db::connect_retrying(&settings.database, "startup", shutdown).await;
        let Some(mut conn) = connected.map_err(|e| Error::new(e.exit_code(), e))? else {
            return Ok(Startup::Stopped);
        };
        // A `myjob migrate` through another node of a Galera cluster a moment ago counts.
        let checked = match db::causal(&mut conn, db::Causal::Reads).await {
            Ok(_) => schema::check(&mut conn).await,
            Err(e) => Err(e),
        };
        match checked {
            Ok(fits) => {
                fits.or_exit(ExitCode::Config)?;
                let _ = conn.disconnect().await;
                return Ok(Startup::Ready);
            }
            Err(e) => {
                let delay = backoff.failed("startup", &e);
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(Startup::Stopped),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Before the first handler: if this process dies without stopping its handlers, the guard
/// kills them. Without it the worker still runs, as it did before there was one.
pub(super) fn start_guard() -> Option<Guard> {
    match Guard::start() {
        Ok(guard) => Some(guard),
        Err(e) => {
            warn!("cannot start the guard process, so handlers would outlive a kill -9 of this worker: {e}");
            None
        }
    }
}
