//! Persistent handlers, point by point of their contract, against a real worker and real
//! long-lived handler processes: framing (binary and 16 MiB payloads), the three answers,
//! protocol errors, deaths before READY and during a job, slow starts, timeouts, recycling,
//! the idle timeout, the drain and the reload.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{edited, TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

/// A persistent handler in bash. Its first argument picks how it starts: `never-ready`,
/// `die-at-start`, `slow-start`, `garbage-at-start`, or anything else (ready at once). Each
/// start, each job and each exit is recorded. The payload picks what a job does: `sleep:N`,
/// `retry`, `long-retry` (a reason of 65,000 control bytes), `fail`, `garbage` (an answer outside the protocol), `exit` (dies mid-job),
/// `ignore-term:N`, `stderr`, `env`; anything else answers OK. Every payload is kept, byte for
/// byte, in `payload.<id>`.
const PERSISTENT: &str = r#"#!/bin/bash
echo "$$ $1" >> DIR/starts
env > DIR/env.start.$$
case "$1" in
  never-ready) sleep 300 ;;
  die-at-start) echo "cannot load the framework" >&2; exit 3 ;;
  slow-start) sleep 2 ;;
  garbage-at-start) echo "hello" ;;
esac
echo READY
jobs=0
while read -r word id attempt max batch len; do
  [ "$word" = JOB ] || { echo "bad header: $word" >&2; exit 9; }
  head -c "$len" > DIR/payload.$id
  p=$(head -c 64 DIR/payload.$id | tr -d '\0')
  echo "$id $attempt $MYJOB_INSTANCE $$ $max $batch" >> DIR/runs
  jobs=$((jobs + 1))
  case "$p" in
    sleep:*) sleep "${p#sleep:}"; echo OK ;;
    retry) echo "RETRY the gateway said 503" ;;
    long-retry) printf 'RETRY the gateway said: '; head -c 65000 /dev/zero | tr '\0' '\001'; echo ;;
    fail) echo "FAIL no such phone number" ;;
    garbage) echo "DONE" ;;
    exit) echo "dying mid-job" >&2; exit 3 ;;
    ignore-term:*) trap '' TERM; sleep "${p#ignore-term:}"; echo OK ;;
    stderr) echo "a line on stderr for $id" >&2; echo OK ;;
    *) echo OK ;;
  esac
done
echo "$$ $jobs" >> DIR/exits
"#;

fn handler(db: &TestDb) -> PathBuf {
    db.script("persistent.sh", PERSISTENT)
}

/// A config with one persistent queue `p` run by [`PERSISTENT`] started as `mode`, with
/// `worker` added to `[worker]` and `queue` to the queue's table.
fn config(db: &TestDb, mode: &str, worker: &str, queue: &str) -> PathBuf {
    let text = format!(
        "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{url}\"\n\n[worker]\npoll_interval = \"100ms\"\nshutdown_timeout = \"5s\"\nkill_grace = \"1s\"\n{worker}\n\n\
         [reaper]\ninterval = \"500ms\"\nstale_after = \"2s\"\n\n\
         [[queue]]\nname = \"p\"\ncommand = [\"{h}\", \"{mode}\"]\npersistent = true\nbackoff = \"100ms\"\nbackoff_max = \"200ms\"\nmax_attempts = 3\n{queue}\n",
        url = db.url,
        h = handler(db).display()
    );
    let path = db.path("myjob.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The records of one file of the handler's: one line each, split on spaces.
fn records(db: &TestDb, file: &str) -> Vec<Vec<String>> {
    std::fs::read_to_string(db.path(file))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

/// The pid that ran job `id` (its last run).
fn pid_of(db: &TestDb, id: u64) -> i32 {
    let runs = records(db, "runs");
    let run = runs.iter().rev().find(|r| r[0] == id.to_string());
    run.unwrap_or_else(|| panic!("job {id} never ran"))[3]
        .parse()
        .unwrap()
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

async fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "waited {secs}s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn insert_with_attempts(db: &TestDb, payload: &str, max_attempts: u32) -> u64 {
    let mut conn = db.conn().await;
    conn.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload, max_attempts) VALUES ('p', ?, ?)",
        (payload, max_attempts),
    )
    .await
    .unwrap();
    conn.last_insert_id().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_run_on_one_long_lived_process_per_slot() {
    let db = TestDb::new("persist_reuse").await;
    let config = config(&db, "ready", "concurrency = 2", "");
    let payloads: Vec<String> = (0..40).map(|i| format!("job {i}")).collect();
    let mut all: Vec<&str> = payloads.iter().map(String::as_str).collect();
    all.push("stderr");
    let ids = db.insert("p", &all).await;
    let w = Worker::start(&config, "7");
    db.wait_count("status = 'done'", ids.len() as u64, 60).await;

    // Two slots, two processes, each serving many jobs.
    let runs = records(&db, "runs");
    assert_eq!(runs.len(), ids.len(), "each job ran once");
    let pids: HashSet<&str> = runs.iter().map(|r| r[3].as_str()).collect();
    assert!(pids.len() <= 2, "{pids:?}");
    assert_eq!(records(&db, "starts").len(), pids.len());
    // The header carried the attempt, the queue's max_attempts and the claim's batch_id.
    let mut conn = db.conn().await;
    for r in &runs {
        let batch: Option<u64> = conn
            .exec_first(
                "SELECT batch_id FROM myjob_jobs WHERE id = ?",
                (r[0].as_str(),),
            )
            .await
            .unwrap();
        assert_eq!((r[1].as_str(), r[4].as_str()), ("1", "3"), "{r:?}");
        assert_eq!(
            batch.map(|b| b.to_string()).as_deref(),
            Some(r[5].as_str()),
            "{r:?}"
        );
    }
    // The process's environment: the protocol's variables, none of a job's, nothing of myjob's.
    let pid = runs[0][3].clone();
    let env = std::fs::read_to_string(db.path(&format!("env.start.{pid}"))).unwrap();
    for line in ["MYJOB_PROTOCOL=1", "MYJOB_QUEUE=p", "MYJOB_INSTANCE=7"] {
        assert!(env.lines().any(|l| l == line), "{line} missing:\n{env}");
    }
    for name in [
        "MYJOB_JOB_ID",
        "MYJOB_ATTEMPT",
        "MYJOB_BATCH_ID",
        "MYJOB_DATABASE_URL",
    ] {
        assert!(!env.contains(name), "{name} leaked:\n{env}");
    }
    // stderr is logged, tagged with the job in progress.
    let last = ids[ids.len() - 1];
    w.wait_log(
        &format!("a line on stderr for {last} job_id={last} stream=\"stderr\""),
        10,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ok_retry_and_fail_answers_reach_the_table() {
    let db = TestDb::new("persist_answers").await;
    let config = config(&db, "ready", "concurrency = 1", "");
    let ids = db.insert("p", &["fine", "retry", "fail"]).await;
    let _w = Worker::start(&config, "1");
    db.wait_count("status IN ('done', 'failed')", 3, 30).await;

    assert_eq!(db.job(ids[0]).await.0, "done");
    let (status, attempts, _, _, error) = db.job(ids[1]).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("failed", 3),
        "RETRY is retried"
    );
    assert!(error
        .unwrap()
        .contains("attempt 3 of 3: the gateway said 503"));
    let (status, attempts, _, _, error) = db.job(ids[2]).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("failed", 1),
        "FAIL is not retried"
    );
    assert_eq!(
        error.as_deref(),
        Some("permanent failure on attempt 1: no such phone number")
    );
    // Answers that end a job leave the process serving: one start for all five runs.
    assert_eq!(records(&db, "starts").len(), 1);
}

/// A reason of 65,000 control bytes, each cleaned into three bytes of U+FFFD, is longer than
/// `last_error` holds: it is cut to fit, and the job is retried as its answer asks, not failed
/// by the server's refusal of the write.
#[tokio::test(flavor = "multi_thread")]
async fn a_reason_longer_than_last_error_holds_is_cut_and_the_job_retried() {
    let db = TestDb::new("persist_long_reason").await;
    let config = config(&db, "ready", "concurrency = 1", "");
    let id = db.insert("p", &["long-retry"]).await[0];
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'failed'", 1, 30).await;
    let (_, attempts, _, _, error) = db.job(id).await;
    let error = error.unwrap();
    assert_eq!(
        attempts, 3,
        "retried until its attempts ran out: {error:.300}"
    );
    assert!(
        error.starts_with("attempt 3 of 3: the gateway said: \u{FFFD}"),
        "{error:.300}"
    );
    assert!(error.len() <= 16 * 1024, "{} bytes", error.len());
    assert!(
        error.ends_with("(cut to 16 KiB)"),
        "{}",
        &error[error.len() - 100..]
    );
    assert!(!w.log_text().contains("refused"), "{:.2000}", w.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_and_16_mib_payloads_arrive_byte_for_byte() {
    let db = TestDb::new("persist_binary").await;
    let config = config(&db, "ready", "concurrency = 1", "");
    let mut binary: Vec<u8> = (0..=255u8).collect();
    binary.extend_from_slice(b"\nJOB 1 1 1 1 5\n\0\0OK\n");
    let mut conn = db.conn().await;
    conn.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload) VALUES ('p', ?), ('p', '')",
        (&binary,),
    )
    .await
    .unwrap();
    let first = conn.last_insert_id().unwrap();
    // The column's whole 16 MiB, with NULs and newlines all through it.
    let big = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload) \
             VALUES ('p', CONCAT(REPEAT(CONCAT('ab', CHAR(0), '\\n'), 4194303), 'xyz'))",
        )
        .await;
    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 3, 60).await;

    assert_eq!(
        std::fs::read(db.path(&format!("payload.{first}"))).unwrap(),
        binary
    );
    let empty = std::fs::read(db.path(&format!("payload.{}", first + 1))).unwrap();
    assert!(empty.is_empty());
    let got = std::fs::read(db.path(&format!("payload.{big}"))).unwrap();
    assert_eq!(got.len(), 16_777_215);
    assert_eq!(&got[..8], b"ab\0\nab\0\n");
    assert!(got.ends_with(b"ab\0\nxyz"));
    assert_eq!(
        records(&db, "starts").len(),
        1,
        "the framing stayed in step"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_breaks_the_protocol_or_dies_mid_job_is_replaced() {
    let db = TestDb::new("persist_broken").await;
    let config = config(&db, "ready", "concurrency = 1", "");
    let garbage = insert_with_attempts(&db, "garbage", 1).await;
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'failed'", 1, 30).await;
    let error = db.job(garbage).await.4.unwrap();
    assert!(
        error.contains("protocol error: the handler wrote \"DONE\" on stdout"),
        "{error}"
    );
    let first_pid = pid_of(&db, garbage);
    assert!(
        !alive(first_pid),
        "the process that broke the protocol was killed"
    );

    let dies = insert_with_attempts(&db, "exit", 1).await;
    db.wait_count("status = 'failed'", 2, 30).await;
    let error = db.job(dies).await.4.unwrap();
    assert!(
        error.contains("the handler process exited during the job: exit status 3")
            && error.contains("stderr: dying mid-job"),
        "{error}"
    );
    let second_pid = pid_of(&db, dies);
    assert_ne!(second_pid, first_pid);

    // A process that dies during a job has its attempt retried like a crashed handler.
    let retried = insert_with_attempts(&db, "exit", 2).await;
    db.wait_count(&format!("id = {retried} AND attempts = 2"), 1, 30)
        .await;
    let fine = db.insert("p", &["after"]).await[0];
    db.wait_count(&format!("id = {fine} AND status = 'done'"), 1, 30)
        .await;
    let pids: HashSet<i32> = [garbage, dies, fine]
        .iter()
        .map(|&id| pid_of(&db, id))
        .collect();
    assert_eq!(
        pids.len(),
        3,
        "each broken process was replaced by a new one"
    );
    assert!(w.log_text().contains("killing the handler process"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_is_never_ready_is_killed_and_restarted_with_a_growing_delay() {
    let db = TestDb::new("persist_never_ready").await;
    let config = config(&db, "never-ready", "concurrency = 1", "timeout = \"1s\"");
    let id = insert_with_attempts(&db, "x", 3).await;
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'failed'", 1, 60).await;
    let error = db.job(id).await.4.unwrap();
    assert!(
        error.contains("the handler process did not start: not ready within 1s"),
        "{error}"
    );
    let log = w.log_text();
    for delay in ["next start in 1s", "next start in 2s", "next start in 4s"] {
        assert!(log.contains(delay), "{delay} missing:\n{log}");
    }
    // Each start was killed at its timeout, none is left.
    for start in records(&db, "starts") {
        assert!(!alive(start[0].parse().unwrap()), "{start:?} still runs");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_dies_before_ready_is_not_restarted_in_a_tight_loop() {
    let db = TestDb::new("persist_die_at_start").await;
    let config = config(&db, "die-at-start", "concurrency = 4", "");
    for p in ["a", "b", "c", "d"] {
        insert_with_attempts(&db, p, 100).await;
    }
    let w = Worker::start(&config, "1");
    w.wait_log("next start in 4s", 30).await;
    let starts = records(&db, "starts").len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Four slots each tried at once, then the delay grew: 1 s, 2 s, 4 s, … apart.
    let later = records(&db, "starts").len();
    assert!(
        later - starts <= 8,
        "{starts} then {later} starts: a tight loop"
    );
    let mut conn = db.conn().await;
    let error: String = conn
        .query_first("SELECT last_error FROM myjob_jobs WHERE last_error IS NOT NULL LIMIT 1")
        .await
        .unwrap()
        .unwrap();
    assert!(
        error.contains("it exited before READY: exit status 3; stderr: cannot load the framework"),
        "{error}"
    );
    let log = w.log_text();
    assert!(log.contains("handler process did not start"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_start_does_not_count_against_the_jobs_timeout() {
    let db = TestDb::new("persist_slow_start").await;
    // Start 2 s + job 2 s > timeout 3 s, yet the job is done: its clock starts at the header.
    let config = config(&db, "slow-start", "", "timeout = \"3s\"");
    let id = db.insert("p", &["sleep:2"]).await[0];
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 1, 30).await;
    assert_eq!(db.job(id).await.1, 1);
    assert!(w.log_text().contains("handler process ready"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_ignores_sigterm_past_its_timeout_is_killed_and_replaced() {
    let db = TestDb::new("persist_timeout").await;
    let config = config(&db, "ready", "concurrency = 1", "timeout = \"1s\"");
    let slow = insert_with_attempts(&db, "ignore-term:60", 1).await;
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'failed'", 1, 30).await;
    let error = db.job(slow).await.4.unwrap();
    assert!(error.contains("timed out after 1s"), "{error}");
    let pid = pid_of(&db, slow);
    assert!(!alive(pid), "SIGKILL followed the ignored SIGTERM");
    assert!(w.log_text().contains("handler process ignored SIGTERM"));
    let next = db.insert("p", &["next"]).await[0];
    db.wait_count(&format!("id = {next} AND status = 'done'"), 1, 30)
        .await;
    assert_ne!(pid_of(&db, next), pid);
}

/// `myjob cancel` of a job running on a persistent process: the process (which ignores
/// SIGTERM here) is stopped and replaced, and the job ends cancelled, not retried.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_job_stops_its_process_which_is_replaced() {
    let db = TestDb::new("persist_cancel").await;
    let config = config(&db, "ready", "concurrency = 1", "");
    let id = insert_with_attempts(&db, "ignore-term:60", 3).await;
    let w = Worker::start(&config, "1");
    wait_for("the job to start", 30, || records(&db, "runs").len() == 1).await;
    let pid = pid_of(&db, id);
    common::cancel(&config, id);
    w.wait_log("job cancelled: its handler was stopped", 15)
        .await;
    assert!(!alive(pid), "the process outlived the cancel");
    assert!(w.log_text().contains("handler process ignored SIGTERM"));
    let next = db.insert("p", &["next"]).await[0];
    db.wait_count(&format!("id = {next} AND status = 'done'"), 1, 30)
        .await;
    assert_ne!(pid_of(&db, next), pid);
    let (status, attempts, ..) = db.job(id).await;
    assert_eq!((status.as_str(), attempts), ("cancelled", 1));
    assert_eq!(
        records(&db, "runs").len(),
        2,
        "the cancelled job never ran again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_is_recycled_after_max_jobs_per_process() {
    let db = TestDb::new("persist_recycle").await;
    let config = config(&db, "ready", "concurrency = 1", "max_jobs_per_process = 3");
    let port = metrics_on(&config);
    let payloads: Vec<String> = (0..7).map(|i| format!("job {i}")).collect();
    let ids = db
        .insert(
            "p",
            &payloads.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await;
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 7, 30).await;
    // Three jobs each on the first two processes (which then got EOF and exited), one on the third.
    let per_pid: Vec<i32> = ids.iter().map(|&id| pid_of(&db, id)).collect();
    assert_eq!(per_pid[0..3], [per_pid[0]; 3]);
    assert_eq!(per_pid[3..6], [per_pid[3]; 3]);
    assert_ne!(per_pid[0], per_pid[3]);
    assert_ne!(per_pid[3], per_pid[6]);
    wait_for("both recycled processes to exit on EOF", 10, || {
        records(&db, "exits").len() >= 2
    })
    .await;
    let exits = records(&db, "exits");
    assert_eq!(exits[0], [per_pid[0].to_string(), "3".into()]);
    assert_eq!(exits[1], [per_pid[3].to_string(), "3".into()]);
    assert!(w
        .log_text()
        .contains("handler process recycled: max_jobs_per_process reached"));
    // The metrics say it too: two exits recycled, the third process idle.
    let metric = |name: &str| common::scrape::metric(port, name);
    assert_eq!(
        metric(r#"myjob_persistent_process_exits_total{queue="p",reason="recycled"}"#),
        Some(2.0)
    );
    wait_for("the process gauges to show the idle one", 10, || {
        metric(r#"myjob_persistent_processes{queue="p",state="idle"}"#) == Some(1.0)
            && metric(r#"myjob_persistent_processes{queue="p",state="busy"}"#) == Some(0.0)
    })
    .await;
}

/// Turns the metrics on for instance 1 in `config`; returns the port.
fn metrics_on(config: &Path) -> u16 {
    let (listen, port) = common::scrape::listen_for_instance_1();
    common::edited(config, config, &[("listen = \"\"", &listen)]);
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_process_is_stopped_after_idle_timeout_and_started_on_demand() {
    let db = TestDb::new("persist_idle").await;
    let config = config(&db, "ready", "", "idle_timeout = \"1s\"");
    let port = metrics_on(&config);
    let first = db.insert("p", &["one"]).await[0];
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 1, 30).await;
    let pid = pid_of(&db, first);
    wait_for("the idle process to exit", 10, || {
        !records(&db, "exits").is_empty()
    })
    .await;
    assert_eq!(records(&db, "exits")[0], [pid.to_string(), "1".into()]);
    assert!(w
        .log_text()
        .contains("handler process stopped: idle for 1s"));
    assert_eq!(
        common::scrape::metric(
            port,
            r#"myjob_persistent_process_exits_total{queue="p",reason="idle"}"#
        ),
        Some(1.0)
    );
    let second = db.insert("p", &["two"]).await[0];
    db.wait_count("status = 'done'", 2, 30).await;
    assert_ne!(pid_of(&db, second), pid);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_jobs_finish_then_closes_every_process() {
    let db = TestDb::new("persist_drain").await;
    let config = config(&db, "ready", "concurrency = 2", "");
    let quick = db.insert("p", &["quick"]).await[0];
    let mut w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 1, 30).await;
    let idle_pid = pid_of(&db, quick);
    let slow = db.insert("p", &["sleep:2"]).await[0];
    db.wait_count(&format!("id = {slow} AND status = 'claimed'"), 1, 30)
        .await;
    wait_for("the slow job to start", 10, || {
        records(&db, "runs")
            .iter()
            .any(|r| r[0] == slow.to_string())
    })
    .await;
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(30), Some(0), "{}", w.log_text());
    assert_eq!(db.job(slow).await.0, "done", "the running job finished");
    // Both processes read EOF and exited by themselves: the idle one at once, the busy one
    // after its answer.
    let exits: HashSet<i32> = records(&db, "exits")
        .iter()
        .map(|r| r[0].parse().unwrap())
        .collect();
    assert!(
        exits.contains(&idle_pid) && exits.contains(&pid_of(&db, slow)),
        "{exits:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_replaces_the_processes_of_a_changed_queue_after_their_jobs() {
    let db = TestDb::new("persist_reload").await;
    let config = config(&db, "v1", "concurrency = 1", "");
    let slow = db.insert("p", &["sleep:2"]).await[0];
    let w = Worker::start(&config, "1");
    wait_for("the slow job to start", 30, || {
        records(&db, "runs")
            .iter()
            .any(|r| r[0] == slow.to_string())
    })
    .await;
    edited(&config, &config, &[("\"v1\"", "\"v2\"")]);
    w.signal(Signal::SIGHUP);
    w.wait_log("reload: new configuration in use", 10).await;
    db.wait_count(&format!("id = {slow} AND status = 'done'"), 1, 30)
        .await;
    assert_eq!(
        db.job(slow).await.1,
        1,
        "the job in progress finished, not cut short"
    );
    let next = db.insert("p", &["next"]).await[0];
    db.wait_count(&format!("id = {next} AND status = 'done'"), 1, 30)
        .await;
    let starts = records(&db, "starts");
    let v2 = starts
        .iter()
        .find(|s| s[1] == "v2")
        .expect("a v2 process started");
    assert_eq!(pid_of(&db, next).to_string(), v2[0]);
    let old = pid_of(&db, slow);
    wait_for("the v1 process to exit on EOF", 10, || {
        records(&db, "exits")
            .iter()
            .any(|e| e[0] == old.to_string())
    })
    .await;
    assert!(w
        .log_text()
        .contains("the reload changed its queue's settings"));
}

#[tokio::test(flavor = "multi_thread")]
async fn per_job_handlers_push_no_process_out_but_persistent_queues_share_the_slots() {
    let db = TestDb::new("persist_slots").await;
    let config = config(&db, "ready", "concurrency = 2", "");
    // A per-job queue `q` beside `p`, and a second persistent queue `p2`.
    let per_job = db.handler();
    let persistent = handler(&db);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text += &format!(
        "\n[[queue]]\nname = \"q\"\ncommand = [\"{}\"]\n\n[[queue]]\nname = \"p2\"\ncommand = [\"{}\", \"second\"]\npersistent = true\n",
        per_job.display(),
        persistent.display()
    );
    std::fs::write(&config, text).unwrap();
    let first = db.insert("p", &["first"]).await[0];
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 1, 30).await;
    // Both slots busy with per-job handlers for a while: p's idle process stays.
    db.insert("q", &["sleep:1", "sleep:1", "sleep:1", "sleep:1"])
        .await;
    db.wait_count("status = 'done'", 5, 30).await;
    let again = db.insert("p", &["again"]).await[0];
    db.wait_count("status = 'done'", 6, 30).await;
    assert_eq!(
        pid_of(&db, again),
        pid_of(&db, first),
        "p's process was kept"
    );
    assert_eq!(records(&db, "starts").len(), 1);
    // Two slots, two persistent queues each wanting both: idle processes make room.
    db.insert("p2", &["sleep:1", "sleep:1"]).await;
    db.wait_count("status = 'done'", 8, 30).await;
    w.wait_log(
        "handler process stopped: its slot is needed by another queue",
        10,
    )
    .await;
    let starts = records(&db, "starts");
    assert_eq!(
        starts.iter().filter(|s| s[1] == "second").count(),
        2,
        "{starts:?}"
    );
}

/// A process that writes the start of its answer as soon as it has the header, and the rest
/// of the line once it has read the payload: while myjob still writes a large payload, the
/// answer's first bytes arrive, and must be kept until the line is whole.
const SPLIT_WRITER: &str = r#"#!/bin/bash
echo READY
while read -r word id attempt max batch len; do
  printf OK
  head -c "$len" | wc -c > DIR/length.$id
  echo
done
"#;

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_written_in_two_parts_around_a_large_payload_is_read_whole() {
    let db = TestDb::new("persist_split").await;
    let script = db.script("split.sh", SPLIT_WRITER);
    let config = db.path("myjob.toml");
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{url}\"\n\n\
             [worker]\nconcurrency = 1\npoll_interval = \"100ms\"\n\n\
             [[queue]]\nname = \"p\"\ncommand = [\"{h}\"]\npersistent = true\nmax_attempts = 1\n",
            url = db.url,
            h = script.display()
        ),
    )
    .unwrap();
    let mut conn = db.conn().await;
    // 1 MiB, the column's whole 16 MiB, and 5 bytes.
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, payload) VALUES \
         ('p', REPEAT('x', 1048576)), ('p', REPEAT('y', 16777215)), ('p', 'small')",
    )
    .await
    .unwrap();
    let worker = Worker::start(&config, "1");
    db.wait_count("status IN ('done', 'failed')", 3, 60).await;
    let failed: Vec<(u64, Option<String>)> = conn
        .query("SELECT id, last_error FROM myjob_jobs WHERE status <> 'done'")
        .await
        .unwrap();
    assert!(failed.is_empty(), "{failed:?}\n{}", worker.log_text());
    let lengths: Vec<u64> = (1..=3)
        .map(|id| {
            std::fs::read_to_string(db.path(&format!("length.{id}")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(lengths, [1_048_576, 16_777_215, 5]);
}
