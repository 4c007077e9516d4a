//! The guard: a small process beside `myjob run` that kills the handlers when the worker dies
//! without stopping them (`kill -9`, a crash, the OOM killer). Under systemd the unit's
//! cgroup does this; in a container, under supervisord or in a terminal nothing else would,
//! and a handler that outlives its worker finishes a job that the reaper has meanwhile
//! handed to another instance: the job runs twice at once.
//!
//! Why a process and not `PR_SET_PDEATHSIG`: the kernel's parent-death signal reaches only
//! the handler itself, not what it forks (the flag is cleared in a fork's child), and setting
//! it needs code in the child before `exec`, which costs every per-job spawn the `fork` that
//! `posix_spawn` avoids.
//!
//! How: every handler, per-job or persistent, gets this worker's random run id in
//! `MYJOB_RUN_ID`, and its children inherit it. The guard holds the read end of a pipe whose
//! write end only the worker has: the pipe closes when the worker ends, however it ends. The
//! guard then sends SIGKILL to every process whose environment carries the run id, and to its
//! process group (which reaches a child that cleared its environment), scanning `/proc` until
//! a scan finds none, so that a handler being started at that moment is found too.

use std::collections::HashSet;
use std::io::Read;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, SigHandler, Signal};
use nix::unistd::{getpgid, getpgrp, Pid};
use tokio::process::{Child, Command};
use tracing::{info, warn};

/// The variable that carries the run id to handlers.
pub const RUN_ID_VAR: &str = "MYJOB_RUN_ID";

/// This process's run id: random, made once, never reused by another worker.
pub fn run_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

/// The worker's side: the guard process, and the pipe's write end (its stdin), which is never
/// written to; closing it is the message.
pub struct Guard {
    child: Child,
}

impl Guard {
    /// Starts the guard: this same binary (through `/proc/self/exe`, which still works while
    /// an upgrade replaces the file), in a process group of its own so that a terminal's
    /// Ctrl-C reaches the worker only.
    pub fn start() -> std::io::Result<Guard> {
        let child = Command::new("/proc/self/exe")
            .args(["guard", run_id()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .env_remove("NOTIFY_SOCKET")
            .process_group(0)
            .spawn()?;
        Ok(Guard { child })
    }

    /// At the end of a clean stop: closes the pipe and waits a moment for the guard, which
    /// finds no handler left and exits, so that nothing of the instance outlives it.
    pub async fn stop(mut self) {
        drop(self.child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
    }
}

/// The guard process (`myjob guard RUN_ID`, not for people): waits for the worker to end,
/// then kills what it left. SIGTERM, SIGINT and SIGHUP are ignored: `pkill myjob` or a
/// terminal must not take the guard away while the worker drains.
pub fn serve(run_id: &str) {
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: ignoring a signal installs no handler code.
        unsafe {
            let _ = nix::sys::signal::signal(signal, SigHandler::SigIgn);
        }
    }
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    // Nothing is ever written: read returns at EOF, or fails if stdin was never a pipe.
    while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}

    let needle = format!("{RUN_ID_VAR}={run_id}");
    let mut killed = HashSet::new();
    // Until a scan finds nothing, and at least twice: a handler that was being started as the
    // worker died has the variable once its exec is done.
    for round in 0..20 {
        let found = scan(needle.as_bytes());
        if found.is_empty() && round >= 1 {
            break;
        }
        for pid in found {
            kill_with_group(pid);
            killed.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if killed.is_empty() {
        info!("guard: the worker ended and left no handler running");
    } else {
        warn!(
            processes = killed.len(),
            "guard: the worker ended without stopping its handlers; killed them and their process groups"
        );
    }
}

/// The processes whose environment holds `needle` as one whole entry.
fn scan(needle: &[u8]) -> Vec<Pid> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            // Gone meanwhile, or not ours to read: not a handler of this worker.
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|entry| entry == needle))
        })
        .map(|pid| Pid::from_raw(pid as i32))
        .collect()
}

/// SIGKILL to `pid`'s process group (a handler leads its own) and to `pid` itself (in case
/// it moved to another group). Never the guard's own group.
fn kill_with_group(pid: Pid) {
    if let Ok(group) = getpgid(Some(pid)) {
        if group != getpgrp() && group.as_raw() > 1 {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
    let _ = kill(pid, Signal::SIGKILL);
}
