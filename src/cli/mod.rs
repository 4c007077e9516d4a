//! The command line: parses arguments with clap, sets up logging, signals and the runtime,
//! dispatches to the command, and turns its result into an exit code.

use std::path::PathBuf;
use std::process::ExitCode as ProcessExit;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use futures_util::StreamExt as _;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Settings, DEFAULT_PATH};
use crate::daemon::{self, RunOptions};
use crate::error::{Error, ExitCode, OrExit};
use crate::store::schema;
use crate::{db, enqueue, logging};

/// A MySQL/MariaDB-backed job worker: claims jobs from the myjob_jobs table and runs a
/// handler subprocess for each.
#[derive(Parser, Debug)]
#[command(name = "myjob", version, about, long_about = None)]
struct Cli {
    /// The configuration file.
    #[arg(long, global = true, value_name = "FILE", default_value = DEFAULT_PATH, env = "MYJOB_CONFIG")]
    config: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the myjob tables; running it again does nothing.
    Migrate,
    /// Add a job and print its id.
    Enqueue(EnqueueArgs),
    /// Run the worker: claim jobs and run their handlers until SIGTERM or SIGINT (SIGHUP reloads the config).
    Run {
        /// The instance name, shown in logs and passed to handlers as MYJOB_INSTANCE (systemd's %i).
        #[arg(long, default_value = "1", value_parser = instance_name)]
        instance: String,
    },
    /// Check the configuration file: exit 0, or exit 78 naming the key at fault.
    CheckConfig,
}

#[derive(Args, Debug)]
struct EnqueueArgs {
    /// The queue.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Run no sooner than this from now, e.g. 30s, 5m, 2h.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    delay: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i16,
    /// Attempts before the job is failed (default: the queue's max_attempts).
    #[arg(long, value_name = "N")]
    max_attempts: Option<u32>,
    /// If a pending job in this queue has this key, replace its payload and run time and print its id.
    #[arg(long, value_name = "KEY")]
    unique_key: Option<String>,
    /// The payload, or - to read it from stdin. Without one the payload is empty.
    payload: Option<String>,
}

fn instance_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    ok.then(|| s.to_owned())
        .ok_or_else(|| "must be 1 to 32 letters, digits or _ - .".to_owned())
}

/// The whole program: what `main` calls.
pub fn main() -> ProcessExit {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return ProcessExit::from(if usage { ExitCode::Usage as u8 } else { 0 });
        }
    };
    logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("myjob: cannot start the async runtime: {e}");
            return ProcessExit::from(ExitCode::Software as u8);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ProcessExit::SUCCESS,
        Err(e) => {
            // The whole cause chain, once, on one line.
            tracing::error!("{e}");
            ProcessExit::from(e.code as u8)
        }
    }
}

async fn dispatch(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::CheckConfig => {
            let settings = Settings::load(&cli.config).or_exit(ExitCode::Config)?;
            settings.check_runnable().or_exit(ExitCode::Config)?;
            for exposed in settings.exposed_secrets() {
                tracing::warn!("{exposed}");
            }
            println!(
                "{}: ok, {} queue(s)",
                cli.config.display(),
                settings.queues.len()
            );
            Ok(())
        }
        Command::Migrate => {
            let settings = Settings::load(&cli.config).or_exit(ExitCode::Config)?;
            let mut conn = db::connect(&settings.database)
                .await
                .map_err(|e| Error::new(e.exit_code(), e))?;
            let applied = schema::migrate(&mut conn)
                .await
                .or_exit(ExitCode::Unavailable)?;
            let _ = conn.disconnect().await;
            if applied.is_empty() {
                println!("schema is up to date (version {})", schema::latest());
            } else {
                println!(
                    "applied migrations: {applied:?}; schema is at version {}",
                    schema::latest()
                );
            }
            Ok(())
        }
        Command::Enqueue(a) => {
            let settings = Settings::load(&cli.config).or_exit(ExitCode::Config)?;
            let request = enqueue::Request {
                queue: a.queue,
                delay: a.delay,
                priority: a.priority,
                max_attempts: a.max_attempts,
                unique_key: a.unique_key,
                payload: a.payload,
            };
            let job = enqueue::check(request, std::io::stdin().lock())?;
            let id = enqueue::enqueue(&settings, &job).await?;
            println!("{id}");
            Ok(())
        }
        Command::Run { instance } => {
            let shutdown = CancellationToken::new();
            let reload = Arc::new(Notify::new());
            let signals =
                listen_for_signals(shutdown.clone(), reload.clone()).or_exit(ExitCode::Software)?;
            let result = daemon::run(
                RunOptions {
                    config: cli.config,
                    instance,
                },
                shutdown,
                reload,
            )
            .await;
            signals.close();
            result
        }
    }
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
