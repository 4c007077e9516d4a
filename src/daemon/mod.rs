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

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::Settings;
use crate::error::{Error, ExitCode};
use crate::metrics::{self, Metrics};
use crate::reaper::Reaper;
use crate::stager::Stager;
use crate::worker::name::WorkerName;
use crate::worker::Consumer;

pub mod fds;
mod notify;
mod reload;
mod startup;
pub mod status;
pub mod tasks;

use reload::supervise;
use startup::{bind_metrics, load_settings, start_guard, wait_for_schema, Startup};
use status::{status_loop, Counters};
use tasks::Tasks;

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
    let counters = Arc::new(Counters::default());
    let (connected_tx, connected) = tokio::sync::oneshot::channel();
    let mut tasks = spawn_tasks(
        &opts,
        settings_rx,
        &counters,
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
    let status = tokio::spawn(status_loop(counters.clone(), status_stop.clone()));
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

/// The instance's four long-lived tasks, each watching `shutdown`.
fn spawn_tasks(
    opts: &RunOptions,
    settings: watch::Receiver<Arc<Settings>>,
    counters: &Arc<Counters>,
    metrics: &Arc<Metrics>,
    connected: tokio::sync::oneshot::Sender<()>,
    shutdown: &CancellationToken,
) -> Tasks {
    let database = settings.borrow().database.clone();
    let name = WorkerName::this_process(&opts.instance);
    // The gate tells the consumer when it admitted blocked jobs: it probes at once rather
    // than at its next poll; the consumer tells the gate when its probe saw blocked jobs.
    let wakes = Arc::new(crate::stager::gate::Wakes::default());
    let consumer = Consumer::new(
        database.clone(),
        settings.clone(),
        &name,
        counters.clone(),
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
