//! The command line: parses arguments with clap, sets up logging and the runtime, dispatches
//! to the command (one file each), and turns its result into an exit code.

use std::path::{Path, PathBuf};
use std::process::ExitCode as ProcessExit;

use clap::{Args, Parser, Subcommand};
use mysql_async::Conn;

use crate::config::{check_queue_name, Settings, DEFAULT_PATH};
use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::JobId;
use crate::store::schema;
use crate::{db, logging};

mod cancel;
mod config_page;
mod enqueue;
mod generate;
mod list;
mod lock;
mod pause;
mod purge;
mod retry;
mod run;
mod schedules;
mod show;
mod show_log;
mod stats;
mod table;

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
    Migrate {
        /// Change nothing: exit 0 if the schema is the one this myjob needs, 78 if it is
        /// not (saying why), 69 if the database cannot be reached. The package's upgrade
        /// restarts the running instances only after this passes.
        #[arg(long)]
        check: bool,
    },
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
    /// Each [[schedule]] of the config: the last tick it enqueued, that tick's job, and its next tick.
    Schedules {
        /// One JSON document: {"schedules": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// One row per queue: jobs due, blocked, suspect, scheduled, running, done, failed and cancelled, the wait of
    /// the oldest due job, and whether the queue is paused.
    Stats {
        /// One JSON document: {"queues": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Jobs: pending ones in the order they will run, scheduled ones by run time, the rest
    /// newest first.
    List(list::ListArgs),
    /// Every column of one job.
    Show {
        /// The job's id.
        id: u64,
        /// One JSON document.
        #[arg(long, conflicts_with = "payload")]
        json: bool,
        /// Write only the payload's raw bytes to stdout.
        #[arg(long)]
        payload: bool,
        /// Its lines in this host's journal instead, from every instance, in order (read with
        /// journalctl MYJOB_JOB_ID=ID MYJOB_DATABASE=<the config's>; exit 69 when the host has
        /// no journal).
        #[arg(long, conflicts_with_all = ["json", "payload"])]
        log: bool,
    },
    /// Make failed jobs due now, with all their attempts again (exit 65, changing nothing, if a
    /// job is not failed).
    Retry(retry::RetryArgs),
    /// Cancel jobs that have not finished; a running job's handler is stopped within 2 s
    /// (exit 65, changing nothing, if a job has finished).
    Cancel {
        /// The jobs' ids.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<u64>,
    },
    /// Stop claiming a queue's jobs, on every instance and across restarts; jobs running in it
    /// finish.
    Pause {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
    /// Claim a paused queue's jobs again.
    Resume {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
    /// Delete finished jobs, a thousand rows at a time with a pause after each so that workers
    /// and producers are not held up; with no --*-older-than, by the config's [retention].
    Purge(purge::PurgeArgs),
    /// Run COMMAND while holding the server's named lock NAME (on a Galera cluster, a lease row
    /// in myjob_locks), so that one such command runs at a time across all hosts; exits with
    /// COMMAND's status, or 75 when the lock was not acquired within --wait, or was lost (the
    /// command is then stopped).
    Lock(lock::LockArgs),
    /// Started by `myjob run`: kills the worker's handlers if the worker dies without stopping
    /// them.
    #[command(hide = true)]
    Guard {
        /// The worker's MYJOB_RUN_ID.
        run_id: String,
    },
    /// Write the man pages or a shell's completions (for packagers).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: generate::What,
    },
}

fn queue_name(s: &str) -> Result<String, String> {
    check_queue_name(s).map(|()| s.to_owned())
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
    /// If a job of this queue waiting to run (pending, scheduled or blocked) has this key,
    /// replace its payload and run time and print its id; exit 75 if one is running.
    #[arg(long, value_name = "KEY")]
    unique_key: Option<String>,
    /// At most the queue's key_limit jobs with this key run at once, across every instance;
    /// the job waits as blocked until one of its key's slots is free.
    #[arg(long, value_name = "KEY")]
    concurrency_key: Option<String>,
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
    // Before any thread starts: descriptors inherited without FD_CLOEXEC must not reach the
    // handlers or the guard. `myjob lock` is a wrapper like flock(1): its COMMAND gets what
    // myjob was given.
    if !matches!(cli.command, Command::Lock(_)) {
        crate::daemon::fds::close_on_exec_inherited();
    }
    logging::init(match &cli.command {
        Command::Run { instance } => Some(instance),
        _ => None,
    });
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
    let exit = match runtime.block_on(dispatch(cli)) {
        Ok(code) => ProcessExit::from(code),
        Err(e) => {
            // The whole cause chain, once, on one line.
            tracing::error!("{e}");
            ProcessExit::from(e.code as u8)
        }
    };
    // The tasks' last lines first, then what of them waits for stderr.
    drop(runtime);
    logging::flush();
    exit
}

/// Runs the command; returns the exit code: 0, or the status `lock` passes on.
async fn dispatch(cli: Cli) -> Result<u8, Error> {
    let done = match cli.command {
        Command::Lock(args) => return lock::run(&cli.config, args).await,
        Command::CheckConfig => {
            let settings = Settings::load(&cli.config).or_exit(ExitCode::Config)?;
            settings.check_runnable().or_exit(ExitCode::Config)?;
            for warning in settings.file_warnings() {
                tracing::warn!("{warning}");
            }
            println!(
                "{}: ok, {} queue(s)",
                cli.config.display(),
                settings.queues.len()
            );
            Ok(())
        }
        Command::Migrate { check: true } => {
            let (_, conn) = open(&cli.config).await?;
            let _ = conn.disconnect().await;
            println!(
                "schema is at version {}, as this myjob needs",
                schema::latest()
            );
            Ok(())
        }
        Command::Migrate { check: false } => {
            let settings = Settings::load(&cli.config).or_exit(ExitCode::Config)?;
            let mut conn = db::connect(&settings.database)
                .await
                .map_err(|e| Error::new(e.exit_code(), e))?;
            // Which migrations are applied, as the whole cluster knows it: a migrate through
            // another Galera node a moment ago must not be applied twice.
            db::causal(&mut conn, db::Causal::Everything)
                .await
                .or_exit(ExitCode::Unavailable)?;
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
                concurrency_key: a.concurrency_key,
                payload: a.payload,
            };
            let job = enqueue::check(request, std::io::stdin().lock())?;
            let id = enqueue::enqueue(&settings, &job).await?;
            println!("{id}");
            Ok(())
        }
        Command::Run { instance } => run::run(cli.config, instance).await,
        Command::Stats { json } => stats::run(&cli.config, json).await,
        Command::Schedules { json } => schedules::run(&cli.config, json).await,
        Command::List(args) => list::run(&cli.config, args).await,
        Command::Show { id, log: true, .. } => show_log::run(&cli.config, id),
        Command::Show {
            id, json, payload, ..
        } => show::run(&cli.config, id, json, payload).await,
        Command::Retry(args) => retry::run(&cli.config, args).await,
        Command::Cancel { ids } => cancel::run(&cli.config, &ids).await,
        Command::Pause { queue } => pause::pause(&cli.config, &queue).await,
        Command::Resume { queue } => pause::resume(&cli.config, &queue).await,
        Command::Purge(args) => purge::run(&cli.config, args).await,
        Command::Generate { what } => generate::run(what),
        Command::Guard { run_id } => {
            crate::worker::guard::serve(&run_id);
            Ok(())
        }
    };
    done.map(|()| 0)
}

/// What an operator command starts with: the settings (exit 78 if they are wrong), and a
/// connection to a database whose schema fits this binary (exit 69 if it cannot be reached).
async fn open(config: &Path) -> Result<(Settings, Conn), Error> {
    let settings = Settings::load(config).or_exit(ExitCode::Config)?;
    let conn = schema::connect_checked(&settings.database).await?;
    Ok((settings, conn))
}

/// The job ids an operator typed, as the store takes them.
fn job_ids(ids: &[u64]) -> Vec<JobId> {
    ids.iter().copied().map(JobId::new).collect()
}
