//! Runs one job's handler: a subprocess in its own process group, with a cleared environment,
//! the payload on stdin, its output logged line by line, and a timeout that ends the group.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tracing::{warn, Span};

use crate::config::{self, QueueSettings};
use crate::store::jobs::{BatchId, JobId};
use crate::worker::guard;
use output::Tag;
/// After the handler exits, how long its output pipes may stay open (held by a child that
/// escaped the process group) before myjob stops reading them.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

pub(crate) mod exit;
pub(crate) mod output;
pub(crate) mod pool;
pub(crate) mod process;
pub(crate) mod protocol;

/// The job as the handler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: JobId,
    pub queue: String,
    pub payload: Arc<[u8]>,
    pub attempt: u32,
    pub max_attempts: u32,
    pub batch_id: BatchId,
    pub instance: String,
}

/// How the handler ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Exit status 0.
    Success,
    /// Anything else: a non-zero exit, a signal, a timeout, or a handler that would not start.
    /// `code` is the exit code when there was one.
    Failed { reason: String, code: Option<i32> },
    /// A persistent handler answered `FAIL <reason>`: the job can never succeed.
    Refused { reason: String },
    /// Killed because myjob is shutting down and the handler outlived `shutdown_timeout`.
    Aborted,
    /// Stopped because an operator cancelled the job (`myjob cancel`).
    Cancelled,
}

/// Runs `queue`'s command for `job` and waits for it, at most `queue.timeout`; then SIGTERM to
/// its process group, and SIGKILL `kill_grace` later. `cancel` (the job was cancelled) stops
/// it the same way; `abort` (fired when a shutdown runs out of time) kills the group at once.
pub async fn run(
    job: &Job,
    queue: &QueueSettings,
    kill_grace: Duration,
    cancel: &CancellationToken,
    abort: &CancellationToken,
) -> Exit {
    #[cfg(feature = "bench")]
    if queue.command[0] == crate::config::NOOP_HANDLER {
        return Exit::Success;
    }
    let mut child = match spawn(queue, &job.instance, |cmd| job_env(cmd, job)) {
        Ok(child) => child,
        Err(e) => {
            return Exit::Failed {
                reason: format!("cannot start {}: {e}", queue.command[0]),
                code: None,
            }
        }
    };
    // The child leads its own group (process_group(0)), so its pid is the group id, and
    // killpg reaches whatever it forked too.
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));

    let stdin = child.stdin.take();
    let payload = job.payload.clone();
    let writer = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A handler may exit, or close stdin, without reading it all: a broken pipe here
            // is its business, not an error of ours.
            let _ = stdin.write_all(&payload).await;
        }
    });
    let pid = child.id().unwrap_or(0);
    // Run inside the job's span (see `Slots::start`): its output lines carry it too.
    let out_tag = Tag::new(Some(job.id), Span::current(), pid, "stdout");
    let err_tag = Tag::new(Some(job.id), Span::current(), pid, "stderr");
    let stdout = child
        .stdout
        .take()
        .map(|s| tokio::spawn(output::pump(s, out_tag.clone())));
    let stderr = child
        .stderr
        .take()
        .map(|s| tokio::spawn(output::pump(s, err_tag.clone())));

    let ended = tokio::select! {
        status = child.wait() => Ended::Status(status),
        _ = tokio::time::sleep(queue.timeout) => Ended::TimedOut,
        _ = cancel.cancelled() => Ended::Cancelled,
        _ = abort.cancelled() => Ended::Aborted,
    };
    // A timed-out, cancelled or aborted handler is still running: end it before looking at
    // its output.
    stop(
        &mut child,
        group,
        &ended,
        job,
        queue.timeout,
        kill_grace,
        abort,
    )
    .await;
    // Whatever the handler left behind in its group dies with it.
    signal_group(group, Signal::SIGKILL);

    writer.abort();
    for reader in [stdout, stderr].into_iter().flatten() {
        finish(reader).await;
    }
    out_tag.finish();
    let tail = err_tag.finish();
    exit_of(ended, &tail, queue.timeout)
}

/// Ends a handler still running after `ended`: SIGTERM to its group, then SIGKILL after
/// `kill_grace`, or at once on `abort`.
async fn stop(
    child: &mut Child,
    group: Option<Pid>,
    ended: &Ended,
    job: &Job,
    timeout: Duration,
    kill_grace: Duration,
    abort: &CancellationToken,
) {
    match ended {
        Ended::Status(_) => {}
        Ended::TimedOut | Ended::Cancelled => {
            match ended {
                Ended::Cancelled => warn!(
                    job_id = job.id.get(),
                    "job cancelled: SIGTERM to its handler's process group"
                ),
                _ => {
                    warn!(job_id = job.id.get(), timeout = ?timeout, "handler timed out: SIGTERM to its process group")
                }
            }
            signal_group(group, Signal::SIGTERM);
            tokio::select! {
                status = child.wait() => { let _ = status; }
                _ = tokio::time::sleep(kill_grace) => {
                    warn!(job_id = job.id.get(), "handler ignored SIGTERM: SIGKILL to its process group");
                    signal_group(group, Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                _ = abort.cancelled() => {
                    signal_group(group, Signal::SIGKILL);
                    let _ = child.wait().await;
                }
            }
        }
        Ended::Aborted => {
            signal_group(group, Signal::SIGKILL);
            let _ = child.wait().await;
        }
    }
}

/// What a handler's end says, with the last of its stderr (`tail`) in a failure's reason.
fn exit_of(ended: Ended, tail: &str, timeout: Duration) -> Exit {
    let with_tail = |reason: String| {
        if tail.is_empty() {
            reason
        } else {
            format!("{reason}; stderr: {tail}")
        }
    };
    match ended {
        Ended::Status(Ok(status)) if status.success() => Exit::Success,
        Ended::Status(Ok(status)) => Exit::Failed {
            reason: with_tail(describe(status)),
            code: status.code(),
        },
        Ended::Status(Err(e)) => Exit::Failed {
            reason: format!("cannot wait for the handler: {e}"),
            code: None,
        },
        Ended::TimedOut => Exit::Failed {
            reason: with_tail(format!(
                "timed out after {}",
                humantime::format_duration(timeout)
            )),
            code: None,
        },
        Ended::Aborted => Exit::Aborted,
        Ended::Cancelled => Exit::Cancelled,
    }
}

/// What ended the wait for a handler.
enum Ended {
    Status(std::io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
    Aborted,
}

/// The job's MYJOB_* variables, for a per-job handler.
fn job_env(cmd: &mut Command, job: &Job) {
    cmd.env("MYJOB_JOB_ID", job.id.to_string())
        .env("MYJOB_ATTEMPT", job.attempt.to_string())
        .env("MYJOB_MAX_ATTEMPTS", job.max_attempts.to_string())
        .env("MYJOB_BATCH_ID", job.batch_id.to_string());
}

/// How a handler's program is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// By itself: a binary, or a script with its `#!` line.
    Direct,
    /// By `/bin/sh`: a file found on PATH that the kernel would not run (ENOEXEC).
    Shell,
}

/// Starts a handler process of `queue` (see [`base_command`]), with what `set` adds for its
/// kind of process. A program found on PATH that the kernel refuses to run (a script without
/// its `#!` line) runs under `/bin/sh`, as `execvp` runs it, which started such handlers
/// before myjob searched PATH itself; a program named by its path is run as it is.
pub fn spawn(
    queue: &QueueSettings,
    instance: &str,
    set: impl Fn(&mut Command),
) -> std::io::Result<Child> {
    let mut cmd = base_command(queue, instance, Start::Direct);
    set(&mut cmd);
    match cmd.spawn() {
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOEXEC as i32) => {
            if queue.command[0].contains('/') {
                return Err(e);
            }
            let mut cmd = base_command(queue, instance, Start::Shell);
            set(&mut cmd);
            cmd.spawn()
        }
        started => started,
    }
}

/// A handler process of `queue`, per-job or persistent: argv as configured, a cleared
/// environment with only PATH, LANG, the queue's `pass_env`, MYJOB_QUEUE and MYJOB_INSTANCE,
/// three pipes, and a process group of its own.
fn base_command(queue: &QueueSettings, instance: &str, start: Start) -> Command {
    let name = &queue.command[0];
    let search = config::handler_path();
    // Found here rather than by the child (see `find_on_path`), at each start, so that a
    // program installed or moved while myjob runs is found as the child would find it; its
    // argv[0] stays the name as configured. Not found, the name goes as it is and the spawn's
    // error says so.
    let found = match name.contains('/') {
        true => None,
        false => config::find_on_path(name, &search),
    };
    let mut cmd = match (found, start) {
        (Some(path), Start::Shell) => {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg(path);
            cmd
        }
        (Some(path), Start::Direct) => {
            let mut cmd = Command::new(path);
            cmd.arg0(name);
            cmd
        }
        (None, _) => Command::new(name),
    };
    cmd.args(&queue.command[1..])
        .env_clear()
        .env("PATH", search);
    for name in std::iter::once("LANG").chain(queue.pass_env.iter().map(String::as_str)) {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.env("MYJOB_QUEUE", &queue.name)
        .env("MYJOB_INSTANCE", instance)
        // What the guard looks for if this worker dies (see `guard`).
        .env(guard::RUN_ID_VAR, guard::run_id())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: a terminal's Ctrl-C reaches myjob, not the handlers (they get the
        // drain instead), and killpg reaches the handler's children.
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Sends `signal` to a handler's process group.
pub fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(pgid) = group {
        // ESRCH (the group is gone) is the normal case after a clean exit.
        let _ = killpg(pgid, signal);
    }
}

/// Waits for an output reader, giving up shortly after the handler exited: a grandchild that
/// left the process group may hold the pipe open for ever.
pub async fn finish(task: tokio::task::JoinHandle<()>) {
    let abort = task.abort_handle();
    if tokio::time::timeout(DRAIN_AFTER_EXIT, task).await.is_err() {
        abort.abort();
    }
}

/// An exit status in words: `exit status 3`, `killed by signal 9 (SIGKILL)`.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = Signal::try_from(sig).map(|s| s.as_str()).unwrap_or("?");
            format!("killed by signal {sig} ({name})")
        }
        _ => status.to_string(),
    }
}
