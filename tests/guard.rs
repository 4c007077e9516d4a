//! Handlers die with their worker, without systemd: `kill -9` of `myjob run` takes every
//! handler it started with it, per-job and persistent, with what they forked (into their
//! process group or out of it with setsid), while another worker's handlers run on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{TestDb, Worker};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Ignores SIGTERM, forks a child into its group and one out of it, records the three pids
/// and its instance, and sleeps.
const PER_JOB: &str = r#"#!/bin/sh
trap '' TERM
cat > /dev/null
sleep 300 & child=$!
setsid sleep 300 & escaped=$!
echo "$$ $child $escaped $MYJOB_INSTANCE" >> DIR/procs
sleep 300
"#;

/// The same as a persistent handler, for its first job.
const PERSISTENT: &str = r#"#!/bin/bash
trap '' TERM
echo READY
while read -r word id attempt max batch len; do
  head -c "$len" > /dev/null
  sleep 300 & child=$!
  setsid sleep 300 & escaped=$!
  echo "$$ $child $escaped $MYJOB_INSTANCE" >> DIR/procs
  sleep 300
  echo OK
done
"#;

fn config(db: &TestDb, persistent: bool) -> PathBuf {
    let handler = match persistent {
        true => db.script("handler-p.sh", PERSISTENT),
        false => db.script("handler-j.sh", PER_JOB),
    };
    let text = format!(
        "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{url}\"\n\n[worker]\nconcurrency = 1\npoll_interval = \"100ms\"\n\n\
         [[queue]]\nname = \"q\"\ncommand = [\"{h}\"]\npersistent = {persistent}\ntimeout = \"10m\"\n",
        url = db.url,
        h = handler.display()
    );
    let path = db.path("myjob.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Each handler's (pid, child, escaped child, instance).
fn procs(db: &TestDb) -> Vec<(i32, i32, i32, String)> {
    std::fs::read_to_string(db.path("procs"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].to_owned(),
            )
        })
        .collect()
}

/// Whether `pid` is a process that has not ended (a zombie has ended).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

async fn handlers_die_with_their_worker(persistent: bool) {
    let kind = if persistent { "persistent" } else { "per_job" };
    let db = TestDb::new(&format!("guard_{kind}")).await;
    let config = config(&db, persistent);
    db.insert("q", &["a", "b"]).await;
    let a = Worker::start(&config, "1");
    let b = Worker::start(&config, "2");
    let start = Instant::now();
    while procs(&db).len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "two handlers never started:\n{}\n{}",
            a.log_text(),
            b.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = procs(&db);
    let (mine, others): (Vec<_>, Vec<_>) = all.iter().partition(|p| p.3 == "1");
    assert_eq!((mine.len(), others.len()), (1, 1), "{all:?}");

    a.signal(Signal::SIGKILL);
    let (handler, child, escaped, _) = mine[0].clone();
    let start = Instant::now();
    while [handler, child, escaped].into_iter().any(alive) {
        if start.elapsed() > Duration::from_secs(5) {
            let left: Vec<i32> = [handler, child, escaped]
                .into_iter()
                .filter(|&p| alive(p))
                .collect();
            for p in [handler, child, escaped] {
                let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
            }
            panic!(
                "5 s after kill -9 of its worker, {left:?} of the handler {handler}, its child \
                 {child} and its escaped child {escaped} still run\n{}",
                a.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.wait_log("guard: the worker ended without stopping its handlers", 5)
        .await;
    // The other worker's handler and children run on.
    let (h2, c2, e2, _) = others[0].clone();
    assert!(
        [h2, c2, e2].into_iter().all(alive),
        "another worker's handler was killed"
    );
    drop(b);
    // Worker 2 was stopped the hard way too (Drop sends SIGKILL): its guard cleans up.
    let start = Instant::now();
    while [h2, c2, e2].into_iter().any(alive) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "worker 2's handler outlived it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn per_job_handlers_die_with_their_worker() {
    handlers_die_with_their_worker(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn persistent_handlers_die_with_their_worker() {
    handlers_die_with_their_worker(true).await;
}

/// A clean stop leaves the guard nothing to kill, and it exits with the worker.
#[tokio::test(flavor = "multi_thread")]
async fn the_guard_leaves_with_a_clean_stop() {
    let db = TestDb::new("guard_clean").await;
    let config = db.config("", "");
    let mut w = Worker::start(&config, "1");
    w.wait_log("ready", 20).await;
    let guards = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(7).any(|w| w == b"\0guard\0") && alive(*pid))
            })
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.split(' ').nth(3) == Some(&w.pid().to_string()))
            })
            .collect()
    };
    assert_eq!(guards().len(), 1, "one guard, a child of the worker");
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(20), Some(0));
    w.wait_log("guard: the worker ended and left no handler running", 5)
        .await;
}
