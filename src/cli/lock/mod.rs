//! `myjob lock NAME -- COMMAND`: runs a command while holding a lock, so that one such command
//! runs at a time across every host that uses the same server or cluster.
//!
//! The lock is the server's named lock (`GET_LOCK`), or on a Galera cluster a lease row (see
//! [`held`]). The command must never outlive it:
//! - the lock is checked (a lease renewed) once a second; lost (a network failure, a `KILL
//!   CONNECTION`, a server restart, a lease not renewed in time), the command is stopped and
//!   myjob exits 75;
//! - `--timeout` stops the command the same way: a lease that cannot expire under a holder
//!   that is still running;
//! - if myjob itself dies, the command gets SIGKILL from the kernel (`PR_SET_PDEATHSIG`), as
//!   the server frees the lock (or the lease runs out).
//!
//! "Stopped" is SIGTERM to the command's process group, then SIGKILL `--kill-grace` later.

mod held;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use futures_util::StreamExt as _;
use mysql_async::Conn;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio::process::{Child, Command};
use tokio::time::{sleep, Instant};
use tracing::{info, warn};

use crate::config::Settings;
use crate::db;
use crate::error::{Error, ExitCode, OrExit};
use crate::store::schema;

use held::Held;

/// The longest lock name, in characters: MySQL's limit, applied on every server so that a
/// name works wherever myjob runs.
const MAX_NAME: usize = 64;
/// How often the lock is checked (a lease renewed).
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The session `wait_timeout` of a holder's connection: many checks long.
const HOLDER_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct LockArgs {
    /// The lock's name, 1 to 64 characters; the same name on every host means the same lock.
    #[arg(value_parser = lock_name)]
    name: String,
    /// How long to wait for the lock; not acquired by then, exit 75 without running COMMAND.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = duration)]
    wait: Duration,
    /// The longest COMMAND may hold the lock; past it, it is stopped and myjob lock exits 75.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    timeout: Option<Duration>,
    /// After SIGTERM, how long COMMAND gets before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    kill_grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn lock_name(s: &str) -> Result<String, String> {
    match s.chars().count() {
        0 => Err("must not be empty".into()),
        n if n > MAX_NAME => Err(format!(
            "is {n} characters long; at most {MAX_NAME} are allowed"
        )),
        _ => Ok(s.to_owned()),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 0s, 30s, 5m)"))
}

/// Why the command was stopped, or how it ended.
enum End {
    Exited(ExitStatus),
    Lost(String),
    TimedOut,
}

/// Runs the command under the lock; returns the exit code for myjob lock: the command's own,
/// or 128 + the signal that ended it, as a shell reports it.
pub async fn run(config: &Path, args: LockArgs) -> Result<u8, Error> {
    let settings = Settings::load(config).or_exit(ExitCode::Config)?;
    let mut conn = db::connect(&settings.database)
        .await
        .map_err(|e| Error::new(e.exit_code(), e))?;
    let name = &args.name;
    // The lock (or the lease) lives as long as this connection, which is checked every
    // second: a holder's host gone without a reset must not keep it for the server's default
    // of 8 hours. A new holder then waits out the old one's command (see `held`).
    db::set_wait_timeout(&mut conn, HOLDER_WAIT_TIMEOUT)
        .await
        .map_err(|e| anyhow!("lock {name}: {}", db::describe(&e)))
        .or_exit(ExitCode::Unavailable)?;
    let server = db::ServerId::of(&mut conn)
        .await
        .or_exit(ExitCode::Unavailable)?;
    let galera = server.galera.is_some();
    if galera {
        // The lease is judged by the time of its last renewal, which may have been written
        // through another node a moment ago.
        db::causal(&mut conn, db::Causal::Everything)
            .await
            .or_exit(ExitCode::Unavailable)?;
        // The lease table comes with the schema; a named lock needs no table at all.
        schema::check(&mut conn)
            .await
            .or_exit(ExitCode::Unavailable)?
            .map_err(|e| {
                anyhow!(
                    "lock {name}: on a Galera cluster the lock is a row of myjob_locks, and {e}"
                )
            })
            .or_exit(ExitCode::Config)?;
    }
    let held = Held::take(&mut conn, name, galera, args.wait, args.kill_grace)
        .await
        .map_err(|e| anyhow!("lock {name}: {e}"))
        .or_exit(ExitCode::Unavailable)?;
    let Some(mut held) = held else {
        let _ = conn.disconnect().await;
        return Err(Error::new(
            ExitCode::TempFail,
            anyhow!(
                "lock {name}: held by another {}; not acquired within {}, so the command did not run",
                if galera { "holder" } else { "connection" },
                humantime::format_duration(args.wait)
            ),
        ));
    };
    info!(lock = %name, connection = conn.id(), "lock acquired");
    let mut child = match spawn(&args.command) {
        Ok(child) => child,
        Err(e) => {
            held.release(conn, name).await;
            return Err(Error::new(
                ExitCode::Unavailable,
                anyhow!("{}: cannot start: {e}", args.command[0].to_string_lossy()),
            ));
        }
    };
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    let end = watch(&mut child, group, &mut conn, &mut held, &args).await;
    let code = match end {
        End::Exited(status) => {
            held.release(conn, name).await;
            return Ok(exit_code(status));
        }
        End::Lost(why) => {
            warn!(lock = %name, "lock lost ({why}): stopping the command");
            format!("{why}, so the command was stopped")
        }
        End::TimedOut => {
            warn!(lock = %name, "--timeout passed: stopping the command");
            let limit = args.timeout.unwrap_or_default();
            format!(
                "the command held it past --timeout {}, so it was stopped",
                humantime::format_duration(limit)
            )
        }
    };
    stop(&mut child, group, args.kill_grace).await;
    held.release(conn, name).await;
    Err(Error::new(
        ExitCode::TempFail,
        anyhow!("lock {name}: {code}"),
    ))
}

/// Starts the command in a process group of its own, with myjob's environment, stdin and
/// output, and the kernel's promise to SIGKILL it if myjob dies. Called on the thread that
/// runs the command's future (not a spawned task), since PR_SET_PDEATHSIG follows the thread
/// that forked: that thread lives as long as myjob does.
fn spawn(command: &[OsString]) -> std::io::Result<Child> {
    let parent = nix::unistd::getpid();
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0).kill_on_drop(true);
    // SAFETY: prctl and getppid are async-signal-safe system calls, and the closure touches
    // nothing else of the parent's.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // myjob died between the fork and the prctl: nothing would kill the command later.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("myjob lock exited"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Waits for the command while checking that the lock is still held (renewing a lease), for
/// `--timeout`, and passing SIGTERM, SIGINT and SIGHUP on to the command's group. One exit:
/// the command's end, or the reason to stop it.
async fn watch(
    child: &mut Child,
    group: Option<Pid>,
    conn: &mut Conn,
    held: &mut Held,
    args: &LockArgs,
) -> End {
    let deadline = args.timeout.map(|t| Instant::now() + t);
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGHUP]).ok();
    let mut next_check = Instant::now() + CHECK_EVERY;
    loop {
        let forward = async {
            match signals.as_mut() {
                Some(s) => s.next().await,
                None => std::future::pending().await,
            }
        };
        // A lease not confirmed in time is lost, whatever a check in flight would say.
        let stop_by = held.stop_by();
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(status) => End::Exited(status),
                    Err(e) => End::Lost(format!("cannot wait for the command: {e}")),
                };
            }
            Some(sig) = forward => {
                if let (Some(pgid), Ok(sig)) = (group, Signal::try_from(sig)) {
                    let _ = killpg(pgid, sig);
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or(next_check)), if deadline.is_some() => {
                return End::TimedOut;
            }
            _ = tokio::time::sleep_until(stop_by.unwrap_or(next_check)), if stop_by.is_some() => {
                return End::Lost("its lease was not renewed in time".into());
            }
            _ = tokio::time::sleep_until(next_check) => {
                next_check = Instant::now() + CHECK_EVERY;
                if let Err(why) = held.check(conn, &args.name).await {
                    return End::Lost(why);
                }
            }
        }
    }
}

/// SIGTERM to the command's group, SIGKILL `grace` later, and whatever is left of the group
/// after that.
async fn stop(child: &mut Child, group: Option<Pid>, grace: Duration) {
    let Some(pgid) = group else {
        return;
    };
    let _ = killpg(pgid, Signal::SIGTERM);
    tokio::select! {
        _ = child.wait() => {}
        _ = sleep(grace) => warn!("the command ignored SIGTERM: SIGKILL to its process group"),
    }
    let _ = killpg(pgid, Signal::SIGKILL);
    let _ = child.wait().await;
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        _ => ExitCode::Software as u8,
    }
}
