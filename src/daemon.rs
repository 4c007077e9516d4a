//! `myjob run`: starts an instance's tasks, reloads on request, and stops them in order.
//!
//! The stop order, written down once:
//! 1. SIGTERM or SIGINT cancels the shutdown token (see `cli`).
//! 2. This function sends STOPPING=1; the consumer stops claiming at once.
//! 3. The consumer gives running handlers `shutdown_timeout` to finish, then kills them and
//!    releases their jobs without using up an attempt, and writes every outcome.
//! 4. The reaper, which watches the same token, ends its current pass and disconnects.
//! 5. The status task sends its last STATUS=, and `run` returns: exit 0.
//!
//! A task (the consumer, the reaper, the stager or the scheduler) that ends before the
//! shutdown (a panic: a bug) starts the same order at step 2, and `run` then fails with exit
//! 70, so that systemd restarts the instance.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Settings;
use crate::db;
use crate::error::{Error, ExitCode, OrExit};
use crate::metrics::{self, Metrics};
use crate::notify;
use crate::reaper::Reaper;
use crate::stager::Stager;
use crate::stats::Stats;
use crate::store::schema;
use crate::tasks::Tasks;
use crate::worker::guard::Guard;
use crate::worker::name::WorkerName;
use crate::worker::Consumer;

/// What `myjob run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: PathBuf,
    /// The instance name (`myjob@N`'s N): in logs, in `worker`, and in `MYJOB_INSTANCE`.
    pub instance: String,
}

/// Runs an instance until `shutdown` fires; each notification on `reload` re-reads the config.
/// One named step per concern: the settings, the metrics' port, the database and its schema,
/// the guard, the tasks, READY=1, the supervision, and the stop in order.
pub async fn run(
    opts: RunOptions,
    shutdown: CancellationToken,
    reload: Arc<Notify>,
) -> Result<(), Error> {
    let settings = load_settings(&opts)?;
    // The metrics endpoint first: a port that is taken is a config error before anything
    // connects.
    let endpoint = bind_metrics(&opts, &settings).await?;
    let queues: Vec<&str> = settings.queues.iter().map(|q| q.name.as_str()).collect();
    let gauges = endpoint
        .is_some()
        .then(|| metrics::queues::QueueGauges::new(settings.database.clone()));
    let metrics = Arc::new(Metrics::new(&queues, gauges));
    crate::logging::set_database(settings.database.opts.db_name().unwrap_or(""));
    info!(
        instance = %opts.instance,
        config = %opts.config.display(),
        database = %settings.database.display,
        concurrency = settings.worker.concurrency,
        "myjob starting; queues: {}",
        queues.join(", ")
    );
    if let Startup::Stopped = wait_for_schema(&settings, &shutdown).await? {
        return Ok(());
    }
    let guard = start_guard();

    let (settings_tx, settings_rx) = watch::channel(Arc::new(settings));
    let stats = Arc::new(Stats::default());
    let (connected_tx, connected) = tokio::sync::oneshot::channel();
    let mut tasks = spawn_tasks(
        &opts,
        settings_rx,
        &stats,
        &metrics,
        connected_tx,
        &shutdown,
    );
    let status_stop = CancellationToken::new();
    // Served until the very end, so that a scrape during the drain still answers.
    let metrics_server = endpoint.map(|(at, listener)| {
        info!(listen = %at, "metrics: serving GET /metrics");
        tokio::spawn(metrics::server::serve(
            listener,
            metrics.clone(),
            status_stop.clone(),
        ))
    });
    let status = tokio::spawn(status_loop(stats.clone(), status_stop.clone()));
    // READY=1 once the consumer holds its own connection and knows the server's identity:
    // the startup check's connection says only that the database answered then. A consumer
    // that died first drops its sender, and the loop below finds it ended.
    tokio::select! {
        up = connected => if up.is_ok() {
            notify::notify_ready();
            info!(target: "myjob::msg::started", "ready");
        },
        _ = shutdown.cancelled() => {}
    }

    let died = supervise(
        &mut tasks,
        &shutdown,
        &reload,
        &opts,
        &settings_tx,
        &metrics,
    )
    .await;
    if let Some(ended) = &died {
        error!("{ended}; stopping");
        shutdown.cancel();
    }

    notify::notify_stopping();
    info!("stopping: no new claims");
    let joined = tasks.join().await;
    status_stop.cancel();
    let _ = status.await;
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    if let Some(guard) = guard {
        guard.stop().await;
    }
    if let Some(ended) = died.or(joined.err()) {
        return Err(Error::new(ExitCode::Software, anyhow::anyhow!("{ended}")));
    }
    info!(target: "myjob::msg::stopped", "stopped");
    Ok(())
}

/// The config file, read and checked, its warnings (a password readable by all) logged.
fn load_settings(opts: &RunOptions) -> Result<Settings, Error> {
    let settings = Settings::load(&opts.config).or_exit(ExitCode::Config)?;
    settings.check_runnable().or_exit(ExitCode::Config)?;
    for warning in settings.file_warnings() {
        warn!("{warning}");
    }
    Ok(settings)
}

/// The metrics endpoint's address and socket, bound now, when this instance serves one.
async fn bind_metrics(
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
enum Startup {
    /// It answers and the schema fits.
    Ready,
    /// The shutdown came first.
    Stopped,
}

/// Waits for the database as long as it takes: READY=1 only once it answers and the schema
/// fits. A missing or newer schema is a configuration error, not worth retrying; a server
/// that goes away between the connect and the check (a restart) is.
async fn wait_for_schema(
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
fn start_guard() -> Option<Guard> {
    match Guard::start() {
        Ok(guard) => Some(guard),
        Err(e) => {
            warn!("cannot start the guard process, so handlers would outlive a kill -9 of this worker: {e}");
            None
        }
    }
}

/// The instance's four long-lived tasks, each watching `shutdown`.
fn spawn_tasks(
    opts: &RunOptions,
    settings: watch::Receiver<Arc<Settings>>,
    stats: &Arc<Stats>,
    metrics: &Arc<Metrics>,
    connected: tokio::sync::oneshot::Sender<()>,
    shutdown: &CancellationToken,
) -> Tasks {
    let database = settings.borrow().database.clone();
    let name = WorkerName::this_process(&opts.instance);
    // The gate tells the consumer when it admitted blocked jobs: it probes at once rather
    // than at its next poll; the consumer tells the gate when its probe saw blocked jobs.
    let wakes = Arc::new(crate::gate::Wakes::default());
    let consumer = Consumer::new(
        database.clone(),
        settings.clone(),
        &name,
        stats.clone(),
        metrics.clone(),
        connected,
        wakes.clone(),
    );
    let stager = Stager::new(database.clone(), settings.clone(), metrics.clone(), wakes);
    let scheduler = crate::scheduler::Scheduler::new(database.clone(), settings.clone());
    let reaper = Reaper::new(database, settings, name, metrics.clone());
    let mut tasks = Tasks::default();
    tasks.spawn("consumer", consumer.run(shutdown.clone()));
    tasks.spawn("reaper", reaper.run(shutdown.clone()));
    tasks.spawn("stager", stager.run(shutdown.clone()));
    tasks.spawn("scheduler", scheduler.run(shutdown.clone()));
    tasks
}

/// Reloads on request until the shutdown, or until a task ends before it (a bug): that task,
/// which stops the others the same way and then fails the process, so that systemd restarts
/// it. One exit either way.
async fn supervise(
    tasks: &mut Tasks,
    shutdown: &CancellationToken,
    reload: &Notify,
    opts: &RunOptions,
    settings: &watch::Sender<Arc<Settings>>,
    metrics: &Metrics,
) -> Option<crate::tasks::Ended> {
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
fn reload_settings(opts: &RunOptions, tx: &watch::Sender<Arc<Settings>>, metrics: &Metrics) {
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

/// Reports STATUS= to systemd, and pets the watchdog while the consumer loop keeps turning.
/// The loop turns at least once a second when healthy; one that has not turned for a whole
/// watchdog period (stuck in a query, say) gets no more pings, and systemd restarts the unit.
async fn status_loop(stats: Arc<Stats>, stop: CancellationToken) {
    let watchdog = notify::watchdog_timeout();
    let period = watchdog.map_or(Duration::from_secs(2), |w| {
        (w / 2).min(Duration::from_secs(2))
    });
    let mut last = String::new();
    loop {
        if let Some(w) = watchdog {
            if stats.since_beat() < w {
                notify::notify_watchdog();
            }
        }
        let line = stats.summary();
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
