//! A persistent handler process: started once, fed one job at a time on its stdin (see
//! [`protocol`](crate::worker::handler::protocol)), and kept between jobs.
//!
//! Whatever goes wrong during a job (an exit, a protocol error, a timeout) ends the process
//! before the job's outcome is reported: a job is never run again while its first run may
//! still be alive. Only a process that answered cleanly is kept for the next job.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Span};

use crate::config::QueueSettings;
use crate::worker::handler::output::{self, Tag};
use crate::worker::handler::protocol::{self, Answer};
use crate::worker::handler::{self, describe, signal_group, Exit, Job};

/// The largest payload sent in the same write as its header: a pipe's default capacity, so
/// that the write seldom waits on the reader; a larger one is not copied.
const ONE_WRITE: usize = 64 * 1024;

pub struct Process {
    /// The settings it was started with: a reload that changes them replaces it.
    pub queue: Arc<QueueSettings>,
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: Arc<Tag>,
    stderr_reader: Option<JoinHandle<()>>,
    /// Jobs answered so far.
    pub jobs: u64,
    /// When it last became idle.
    pub idle_since: Instant,
}

/// What [`serve`] did: the job's exit, the process if it may take another job, and how a
/// start went when the job needed one.
pub struct Served {
    pub exit: Exit,
    pub process: Option<Process>,
    pub start: Option<Result<(), String>>,
}

/// Runs `job` on `process`, or on a new process of `queue` when there is none, started no
/// sooner than `not_before` (a growing delay after failed starts). The wait and the start do
/// not count against the job's timeout. A start that fails fails the attempt.
pub async fn serve(
    job: Job,
    queue: Arc<QueueSettings>,
    process: Option<Process>,
    not_before: Option<Instant>,
    kill_grace: Duration,
    cancel: CancellationToken,
    abort: CancellationToken,
) -> Served {
    let (mut process, start) = match process {
        Some(p) => (p, None),
        None => {
            if let Some(t) = not_before {
                tokio::select! {
                    _ = sleep_until(t) => {}
                    _ = cancel.cancelled() => return Served { exit: Exit::Cancelled, process: None, start: None },
                    _ = abort.cancelled() => return Served { exit: Exit::Aborted, process: None, start: None },
                }
            }
            match Process::start(queue, &job.instance, kill_grace, &abort).await {
                Ok(p) => (p, Some(Ok(()))),
                Err(_) if abort.is_cancelled() => {
                    return Served {
                        exit: Exit::Aborted,
                        process: None,
                        start: None,
                    };
                }
                Err(reason) => {
                    return Served {
                        exit: Exit::Failed {
                            reason: format!("the handler process did not start: {reason}"),
                            code: None,
                        },
                        process: None,
                        start: Some(Err(reason)),
                    }
                }
            }
        }
    };
    // Cancelled while the process started: it never saw the job, and may take the next.
    if cancel.is_cancelled() {
        return Served {
            exit: Exit::Cancelled,
            process: Some(process),
            start,
        };
    }
    let (exit, fit) = process.run(&job, kill_grace, &cancel, &abort).await;
    Served {
        exit,
        process: fit.then_some(process),
        start,
    }
}

/// How a job's exchange ended.
enum Ended {
    /// A line on stdout, or `None` at the end of stdout.
    Line(Result<Option<Vec<u8>>, String>),
    TimedOut,
    Cancelled,
    Aborted,
}

impl Process {
    /// Starts a process of `queue` and waits for its `READY`, at most the queue's `timeout`.
    /// An error says why it is not ready; the process is gone by then.
    pub async fn start(
        queue: Arc<QueueSettings>,
        instance: &str,
        kill_grace: Duration,
        abort: &CancellationToken,
    ) -> Result<Process, String> {
        let began = Instant::now();
        let mut child = handler::spawn(&queue, instance, |cmd| {
            cmd.env("MYJOB_PROTOCOL", protocol::VERSION);
        })
        .map_err(|e| format!("cannot start {}: {e}", queue.command[0]))?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("its pipes were not set up".into());
        };
        let tag = Tag::new(None, Span::none(), pid, "stderr");
        let stderr_reader = tokio::spawn(output::pump(stderr, tag.clone()));
        let mut p = Process {
            queue,
            child,
            pid,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            stderr: tag,
            stderr_reader: Some(stderr_reader),
            jobs: 0,
            idle_since: Instant::now(),
        };
        let timeout = p.queue.timeout;
        let mut line = Vec::new();
        let ended = tokio::select! {
            read = read_line(&mut p.stdout, &mut line) => Ended::Line(read),
            _ = sleep(timeout) => Ended::TimedOut,
            _ = abort.cancelled() => Ended::Aborted,
        };
        let why = match ended {
            Ended::Line(Ok(Some(line))) if line == protocol::READY => {
                info!(queue = %p.queue.name, pid, ms = began.elapsed().as_millis() as u64, "handler process ready");
                p.idle_since = Instant::now();
                return Ok(p);
            }
            Ended::Line(Ok(Some(line))) => {
                p.kill().await;
                format!("it wrote {} before READY", protocol::quote(&line))
            }
            Ended::Line(Err(e)) => {
                p.kill().await;
                format!("{e} before READY")
            }
            Ended::Line(Ok(None)) => {
                let status = p.exit_within(kill_grace).await;
                format!("it exited before READY: {status}")
            }
            Ended::TimedOut => {
                p.terminate(kill_grace, abort).await;
                format!("not ready within {}", humantime::format_duration(timeout))
            }
            Ended::Cancelled | Ended::Aborted => {
                p.kill().await;
                "stopped by the shutdown before READY".into()
            }
        };
        Err(with_tail(why, &p.finish_stderr().await))
    }

    /// Sends `job` and waits for its answer, at most the queue's `timeout` (then SIGTERM to
    /// the process group, SIGKILL `kill_grace` later). Returns the job's exit, and whether the
    /// process may take another job; when it may not, it is dead already.
    pub async fn run(
        &mut self,
        job: &Job,
        kill_grace: Duration,
        cancel: &CancellationToken,
        abort: &CancellationToken,
    ) -> (Exit, bool) {
        // Run inside the job's span (see `Slots::start`): the lines of this job carry it.
        self.stderr.start(job.id, Span::current());
        let mut header = protocol::header(
            job.id,
            job.attempt,
            job.max_attempts,
            job.batch_id,
            job.payload.len(),
        );
        // A job that fits the pipe goes in one write: each write wakes the process, and
        // waking it is most of what a small job costs myjob (a quarter of its CPU went to
        // the two writes of header and payload, by perf).
        let rest: &[u8] = if job.payload.len() <= ONE_WRITE {
            header.extend_from_slice(&job.payload);
            &[]
        } else {
            &job.payload
        };
        let Some((ended, written)) = self.exchange(&header, rest, cancel, abort).await else {
            return (self.lost("its stdin is closed").await, false);
        };
        let answer = match ended {
            Ended::Line(Ok(Some(line))) => protocol::answer(&line),
            Ended::Line(Err(e)) => Err(format!("protocol error: {e}")),
            Ended::Line(Ok(None)) => {
                let status = self.exit_within(kill_grace).await;
                let why = format!("the handler process exited during the job: {status}");
                return (self.lost(&why).await, false);
            }
            Ended::TimedOut => {
                warn!(job_id = job.id.get(), timeout = ?self.queue.timeout, "handler timed out: SIGTERM to its process group");
                self.terminate(kill_grace, abort).await;
                let why = format!(
                    "timed out after {}",
                    humantime::format_duration(self.queue.timeout)
                );
                return (self.lost(&why).await, false);
            }
            Ended::Cancelled => {
                warn!(
                    job_id = job.id.get(),
                    pid = self.pid,
                    "job cancelled: SIGTERM to its handler process's group"
                );
                self.terminate(kill_grace, abort).await;
                self.finish_stderr().await;
                return (Exit::Cancelled, false);
            }
            Ended::Aborted => {
                self.kill().await;
                self.finish_stderr().await;
                return (Exit::Aborted, false);
            }
        };
        self.jobs += 1;
        self.answered(job, answer, written).await
    }

    /// Writes `header` and `rest` to the process while its answer is awaited: a 16 MiB
    /// payload fills the pipe long before it is all written, and a process may answer
    /// (wrongly) without reading it all. Returns what ended the wait, and whether the write
    /// was done by then; None when stdin is closed already.
    async fn exchange(
        &mut self,
        header: &[u8],
        rest: &[u8],
        cancel: &CancellationToken,
        abort: &CancellationToken,
    ) -> Option<(Ended, bool)> {
        let stdin = self.stdin.as_mut()?;
        let write = async {
            stdin.write_all(header).await?;
            if !rest.is_empty() {
                stdin.write_all(rest).await?;
            }
            stdin.flush().await
        };
        tokio::pin!(write);
        let deadline = sleep(self.queue.timeout);
        tokio::pin!(deadline);
        let mut written = false;
        // Outside the loop: a read cut short when the write finishes first leaves the bytes
        // it had (an answer's first part) here, for the next read to go on from.
        let mut line = Vec::new();
        let ended = loop {
            tokio::select! {
                // A failed write (the process closed stdin, or died) shows as the end of its
                // stdout next.
                _ = &mut write, if !written => written = true,
                read = read_line(&mut self.stdout, &mut line) => break Ended::Line(read),
                _ = &mut deadline => break Ended::TimedOut,
                _ = cancel.cancelled() => break Ended::Cancelled,
                _ = abort.cancelled() => break Ended::Aborted,
            }
        };
        Some((ended, written))
    }

    /// The process answered for `job` (`written`: after reading its whole payload). Returns
    /// the job's exit, and whether the process may take another job.
    async fn answered(
        &mut self,
        job: &Job,
        answer: Result<Answer, String>,
        written: bool,
    ) -> (Exit, bool) {
        match answer {
            Err(e) => {
                // It may still be working on the job: it must be gone before the job's
                // outcome is written and the job can run again.
                warn!(
                    job_id = job.id.get(),
                    pid = self.pid,
                    "{e}: killing the handler process"
                );
                self.kill().await;
                (self.lost(&e).await, false)
            }
            Ok(answer) => {
                // A clean answer carries its own reason: the stderr tail is not needed, and
                // lines that follow it stay with this job until the next one starts.
                let exit = match answer {
                    Answer::Ok => Exit::Success,
                    Answer::Retry(reason) => Exit::Failed { reason, code: None },
                    Answer::Fail(reason) => Exit::Refused { reason },
                };
                if !written {
                    // Its stdin still holds part of this payload: the next header would be
                    // read out of step.
                    warn!(job_id = job.id.get(), pid = self.pid, "the handler process answered before reading its whole payload: replacing it");
                    self.kill().await;
                    self.finish_stderr().await;
                    return (exit, false);
                }
                self.idle_since = Instant::now();
                (exit, true)
            }
        }
    }

    /// Whether an idle process is still fit for a job: alive, and silent on stdout.
    pub fn check_idle(&mut self) -> Result<(), String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(format!("exited while idle: {}", describe(status)));
        }
        match self.stdout.fill_buf().now_or_never() {
            None => Ok(()),
            Some(Ok([])) => Err("closed its stdout while idle".into()),
            Some(Ok(bytes)) => Err(format!(
                "protocol error: the handler wrote {} on stdout between jobs",
                protocol::quote(bytes.split(|&b| b == b'\n').next().unwrap_or_default())
            )),
            Some(Err(e)) => Err(format!("cannot read its stdout: {e}")),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Stops an idle process: EOF on its stdin, on which it exits. One that is still there
    /// `kill_grace` later gets SIGTERM, and SIGKILL `kill_grace` after that; `abort` (the end
    /// of a shutdown's time) kills it at once.
    pub async fn close(mut self, kill_grace: Duration, abort: CancellationToken) {
        self.stdin = None;
        let exited = tokio::select! {
            status = self.child.wait() => status.is_ok(),
            _ = sleep(kill_grace) => false,
            _ = abort.cancelled() => false,
        };
        if !exited {
            warn!(pid = self.pid, queue = %self.queue.name, "handler process still running after EOF on its stdin: SIGTERM");
            self.terminate(kill_grace, &abort).await;
        }
        self.end_group();
        self.finish_stderr().await;
    }

    /// Ends a process at once (SIGKILL to its group) and waits for it.
    pub async fn kill(&mut self) {
        signal_group(self.group(), Signal::SIGKILL);
        let _ = self.child.wait().await;
    }

    /// SIGTERM to the group; SIGKILL `kill_grace` later, or at once when `abort` fires.
    async fn terminate(&mut self, kill_grace: Duration, abort: &CancellationToken) {
        signal_group(self.group(), Signal::SIGTERM);
        tokio::select! {
            _ = self.child.wait() => {}
            _ = sleep(kill_grace) => {
                warn!(pid = self.pid, "handler process ignored SIGTERM: SIGKILL to its process group");
            }
            _ = abort.cancelled() => {}
        }
        self.kill().await;
    }

    /// Waits for a process whose stdout ended to exit, at most `grace`, then kills it;
    /// returns its exit status in words.
    async fn exit_within(&mut self, grace: Duration) -> String {
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => describe(status),
            Ok(Err(e)) => format!("cannot wait for it: {e}"),
            Err(_) => {
                self.kill().await;
                "it closed its stdout and was killed".into()
            }
        }
    }

    /// The job's attempt failed with `why` and the process is gone: whatever it forked dies
    /// too, and the job's stderr tail joins the reason.
    async fn lost(&mut self, why: &str) -> Exit {
        self.kill().await;
        let tail = self.finish_stderr().await;
        Exit::Failed {
            reason: with_tail(why.to_owned(), &tail),
            code: None,
        }
    }

    /// After the process exited: its group's leftovers die, its stderr is read to the end,
    /// and its last bytes returned.
    async fn finish_stderr(&mut self) -> String {
        self.end_group();
        if let Some(reader) = self.stderr_reader.take() {
            handler::finish(reader).await;
        }
        self.stderr.finish()
    }

    fn end_group(&self) {
        // Whatever the process left behind in its group dies with it.
        signal_group(self.group(), Signal::SIGKILL);
    }

    fn group(&self) -> Option<Pid> {
        // The process leads its own group (process_group(0)), so its pid is the group id.
        (self.pid != 0).then(|| Pid::from_raw(self.pid as i32))
    }
}

fn with_tail(reason: String, tail: &str) -> String {
    if tail.is_empty() {
        reason
    } else {
        format!("{reason}; stderr: {tail}")
    }
}

/// One line of a process's stdout, without its `\n`; `None` at the end of the stream. A line
/// longer than [`protocol::MAX_ANSWER`] is an error, so a process cannot fill myjob's memory.
///
/// The bytes read so far are kept in `line`, which the caller owns: `read_until` is not
/// cancel-safe, and a future of this dropped by a `select!` (the payload's write finished
/// first) must not take the start of the answer with it. Called again with the same `line`,
/// it goes on where the dropped one stopped.
async fn read_line(
    stdout: &mut BufReader<ChildStdout>,
    line: &mut Vec<u8>,
) -> Result<Option<Vec<u8>>, String> {
    let limit = protocol::MAX_ANSWER as u64 + 1;
    let room = limit.saturating_sub(line.len() as u64);
    (&mut *stdout)
        .take(room)
        .read_until(b'\n', line)
        .await
        .map_err(|e| format!("cannot read its stdout: {e}"))?;
    let mut whole = std::mem::take(line);
    match whole.pop() {
        Some(b'\n') => Ok(Some(whole)),
        _ if whole.len() as u64 + 1 >= limit => Err(format!(
            "a line of more than {} bytes on stdout",
            protocol::MAX_ANSWER
        )),
        // The stream ended, in the middle of a line or between lines.
        _ => Ok(None),
    }
}
