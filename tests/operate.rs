//! The operator commands against a real server: `stats`, `list`, `show`, `retry`, `cancel`,
//! `pause`, `resume` and `purge`, and the reaper's retention. Tables are compared whole with goldens (the rows' times are set to
//! fixed values first), JSON is parsed, and every change is checked in the rows and, where a
//! worker is involved, in what the worker did.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{myjob, TestDb, Worker};
use mysql_async::prelude::*;
use serde_json::Value;

fn run(config: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    myjob(&all, b"")
}

/// Runs a command that must succeed and returns its stdout.
fn ok(config: &Path, args: &[&str]) -> String {
    let out = run(config, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "myjob {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail with `code`, and returns its one error line: myjob's, with
/// the log's time and level cut off, or clap's.
fn fails(config: &Path, args: &[&str], code: i32) -> String {
    let out = run(config, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "myjob {args:?}: {err}");
    assert!(
        out.stdout.is_empty(),
        "myjob {args:?} printed {:?}",
        out.stdout
    );
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.starts_with("error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{err}");
    errors[0]
        .split_once(" ERROR ")
        .map_or(errors[0], |(_, m)| m)
        .to_owned()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// One job per state in queue `q` and a few in `other`, ids 1 to 8 (given, for the same
/// goldens on a Galera node, whose ids step by the cluster's size), with fixed times: created
/// at 2026-01-02 03:04:05 UTC, the due ones an hour (and half a second, so that the age reads
/// at least 3600 s) before now.
async fn states(db: &TestDb) -> Vec<u64> {
    let mut ids = Vec::new();
    for (id, row) in (1..).zip([
        // pending, due an hour ago, priority 5
        "('q', 'a', 'pending', 5, 0, NULL, NOW(6) - INTERVAL 3600500000 MICROSECOND, NULL, NULL, NULL)",
        // pending, due now, priority 0
        "('q', 'bb', 'pending', 0, 0, NULL, NOW(6), NULL, NULL, NULL)",
        // scheduled for 2037
        "('q', 'ccc', 'scheduled', 0, 1, 5, '2037-01-01 00:00:00', NULL, NULL, 'attempt 1 of 5: exit status 1\nmore')",
        // claimed
        "('q', '', 'claimed', 0, 1, NULL, '2026-01-02 03:04:05', NULL, 'host:1:1', NULL)",
        // done
        "('q', 'done', 'done', 0, 1, NULL, '2026-01-02 03:04:05', '2026-01-02 03:04:06', 'host:1:1', NULL)",
        // failed
        "('q', 'bad', 'failed', 0, 3, NULL, '2026-01-02 03:04:05', '2026-01-02 03:04:07', 'host:1:1', 'attempt 3 of 3: exit status 1; stderr: boom')",
        // cancelled
        "('other', 'x', 'cancelled', 0, 0, NULL, '2026-01-02 03:04:05', '2026-01-02 03:04:08', NULL, NULL)",
        "('other', 'y', 'failed', 0, 1, 1, '2026-01-02 03:04:05', '2026-01-02 03:04:09', 'host:2:1', 'attempt 1 of 1: killed by signal 9 (SIGKILL)')",
    ]) {
        let row = row.replacen('(', &format!("({id}, "), 1);
        ids.push(
            db.insert_sql(&format!(
                "INSERT INTO myjob_jobs (id, queue, payload, status, priority, attempts, \
                     max_attempts, run_at, finished_at, worker, last_error) VALUES {row}"
            ))
            .await,
        );
    }
    assert_eq!(ids, (1..=8).collect::<Vec<u64>>());
    let mut conn = db.conn().await;
    conn.query_drop("UPDATE myjob_jobs SET created_at = '2026-01-02 03:04:05'")
        .await
        .unwrap();
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_counts_each_queue_and_state() {
    let db = TestDb::new("op_stats").await;
    let config = db.config("", "");
    states(&db).await;
    ok(&config, &["pause", "idle"]);

    let mut table = ok(&config, &["stats"]);
    // The age is an hour and the seconds since the rows went in ("1h 1s" on a loaded cluster),
    // in a column the header makes wide enough for either.
    for s in (1..30).rev() {
        table = table.replace(
            &format!("1h {s}s "),
            &format!("{:<width$}", "1h", width = 5 + s.to_string().len()),
        );
    }
    assert_eq!(
        table,
        "\
QUEUE  PENDING  BLOCKED  SUSPECT  SCHEDULED  CLAIMED  DONE  FAILED  CANCELLED  OLDEST PENDING  PAUSED
idle   0        0        0        0          0        0     0       0          -               yes
other  0        0        0        0          0        0     1       1          -               no
q      2        0        0        1          1        1     1       0          1h              no
"
    );
    let doc = json(&ok(&config, &["stats", "--json"]));
    let queues = doc["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 3);
    let q = queues.iter().find(|q| q["queue"] == "q").unwrap();
    for (field, want) in [
        ("pending", 2),
        ("suspect", 0),
        ("scheduled", 1),
        ("claimed", 1),
        ("done", 1),
        ("failed", 1),
        ("cancelled", 0),
    ] {
        assert_eq!(q[field], want, "{field} in {q}");
    }
    // An hour, and the seconds since the rows went in: a loaded cluster took more than one.
    let age = q["oldest_pending_age_s"].as_u64().unwrap();
    assert!((3600..3630).contains(&age), "oldest_pending_age_s in {q}");
    assert_eq!(q["paused"], false);
    assert_eq!(queues[0]["queue"], "idle");
    assert_eq!(queues[0]["paused"], true);

    // A producer's INSERT with a future run_at that the stager has not moved yet is
    // scheduled, and a scheduled job whose time has come is due.
    let mut conn = db.conn().await;
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, status, run_at) VALUES \
         ('q', 'pending', NOW(6) + INTERVAL 1 HOUR), ('q', 'scheduled', NOW(6) - INTERVAL 1 SECOND)",
    )
    .await
    .unwrap();
    let doc = json(&ok(&config, &["stats", "--json"]));
    let q = doc["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "q")
        .unwrap()
        .clone();
    assert_eq!(
        (q["pending"].as_u64(), q["scheduled"].as_u64()),
        (Some(3), Some(2))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_the_run_order_and_filters() {
    let db = TestDb::new("op_list").await;
    let config = db.config("", "");
    let ids = states(&db).await;

    // Pending: priority first, then id. The scheduled job's run time is fixed; the pending
    // ones' are now, so their column is checked apart.
    let pending = ok(&config, &["list", "--status", "pending"]);
    let lines: Vec<&str> = pending.lines().collect();
    assert_eq!(lines.len(), 3, "{pending}");
    assert!(
        lines[0].starts_with("ID  QUEUE  STATUS   PRI  ATTEMPTS  RUN AT"),
        "{pending}"
    );
    assert!(
        lines[1].starts_with(&format!("{}   q      pending  5    0/3", ids[0])),
        "{pending}"
    );
    assert!(
        lines[2].starts_with(&format!("{}   q      pending  0    0/3", ids[1])),
        "{pending}"
    );

    let failed = ok(&config, &["list", "--status", "failed"]);
    assert_eq!(
        failed,
        format!(
            "\
ID  QUEUE  STATUS  PRI  ATTEMPTS  RUN AT               CREATED              FINISHED             WORKER    BYTES  ERROR
{}   other  failed  0    1/1       2026-01-02 03:04:05  2026-01-02 03:04:05  2026-01-02 03:04:09  host:2:1  1      attempt 1 of 1: killed by signal 9 (SIGKILL)
{}   q      failed  0    3/3       2026-01-02 03:04:05  2026-01-02 03:04:05  2026-01-02 03:04:07  host:1:1  3      attempt 3 of 3: exit status 1; stderr: boom
",
            ids[7], ids[5]
        )
    );
    let scheduled = ok(&config, &["list", "--queue", "q", "--status", "scheduled"]);
    assert_eq!(
        scheduled,
        format!(
            "\
ID  QUEUE  STATUS     PRI  ATTEMPTS  RUN AT               CREATED              FINISHED  WORKER  BYTES  ERROR
{}   q      scheduled  0    1/5       2037-01-01 00:00:00  2026-01-02 03:04:05  -         -       3      attempt 1 of 5: exit status 1
",
            ids[2]
        )
    );

    // Newest first, and --limit.
    let doc = json(&ok(&config, &["list", "--limit", "3", "--json"]));
    let jobs = doc["jobs"].as_array().unwrap();
    let got: Vec<u64> = jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(got, [ids[7], ids[6], ids[5]]);
    let failed = &jobs[2];
    assert_eq!(failed["queue"], "q");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["attempts"], 3);
    assert_eq!(failed["max_attempts"], Value::Null);
    assert_eq!(failed["finished_at"], "2026-01-02T03:04:07.000000Z");
    assert_eq!(failed["payload_bytes"], 3);
    assert_eq!(
        failed["error"],
        "attempt 3 of 3: exit status 1; stderr: boom"
    );

    // Nothing matches: the header alone.
    let none = ok(&config, &["list", "--queue", "nosuch"]);
    assert_eq!(none.lines().count(), 1, "{none}");
    assert_eq!(
        json(&ok(&config, &["list", "--queue", "nosuch", "--json"]))["jobs"],
        json("[]")
    );
    let err = fails(&config, &["list", "--status", "lost"], 64);
    assert!(err.contains("lost"), "{err}");
    fails(&config, &["list", "--limit", "0"], 64);
}

/// `myjob list | head`: the reader closes the pipe before the list is written. That is the
/// reader's choice, not a failure: no error, exit 0, for the table and the JSON alike.
#[tokio::test(flavor = "multi_thread")]
async fn list_into_a_pipe_closed_early_ends_quietly() {
    let db = TestDb::new("op_list_pipe").await;
    let config = db.config("", "");
    db.insert_rows("(queue, payload)", "('q', 'x')", 2000).await;
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec![
            "--config",
            config.to_str().unwrap(),
            "list",
            "--limit",
            "2000",
        ];
        args.extend_from_slice(extra);
        let mut child = std::process::Command::new(common::bin())
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes before the first byte.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {err}");
        assert!(err.is_empty(), "{extra:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn show_prints_every_column_and_the_raw_payload() {
    let db = TestDb::new("op_show").await;
    let config = db.config("", "");
    let ids = states(&db).await;
    let id = ids[2];
    assert_eq!(
        ok(&config, &["show", &id.to_string()]),
        format!(
            "\
id:               {id}
queue:            q
status:           scheduled
priority:         0
attempts:         1
max_attempts:     5
rescues:          0
suspicion:        0
run_at:           2037-01-01T00:00:00.000000Z
unique_key:       -
concurrency_key:  -
slot:             -
batch_id:         -
owner_conn:       -
owner_server:     -
worker:           -
claimed_at:       -
finished_at:      -
created_at:       2026-01-02T03:04:05.000000Z
last_error:       attempt 1 of 5: exit status 1 more
payload:          3 bytes
"
        )
    );
    let doc = json(&ok(&config, &["show", &id.to_string(), "--json"]));
    assert_eq!(doc["id"], id);
    assert_eq!(doc["max_attempts"], 5);
    assert_eq!(doc["batch_id"], Value::Null);
    assert_eq!(doc["last_error"], "attempt 1 of 5: exit status 1\nmore");
    assert_eq!(doc["payload"], "ccc");
    assert_eq!(doc["payload_bytes"], 3);

    // Any bytes, as they are.
    let binary: Vec<u8> = (0..=255u8).collect();
    let mut conn = db.conn().await;
    conn.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload) VALUES ('q', ?)",
        (&binary,),
    )
    .await
    .unwrap();
    let bin_id = conn.last_insert_id().unwrap().to_string();
    let out = run(&config, &["show", &bin_id, "--payload"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, binary);
    assert_eq!(
        json(&ok(&config, &["show", &bin_id, "--json"]))["payload"],
        Value::Null
    );

    assert_eq!(
        fails(&config, &["show", "999999"], 65),
        "job 999999: no such job"
    );
    fails(&config, &["show", "x"], 64);
    fails(&config, &["show"], 64);
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_makes_failed_jobs_due_with_all_their_attempts() {
    let db = TestDb::new("op_retry").await;
    let config = db.config("", "");
    let ids = states(&db).await;
    let (failed_q, failed_other, done) = (ids[5], ids[7], ids[4]);

    // A done job among them: exit 65, and neither job changes.
    let err = fails(
        &config,
        &["retry", &failed_q.to_string(), &done.to_string()],
        65,
    );
    assert!(err.ends_with(&format!("job {done}: is done, not failed; only a failed job can be retried; nothing was retried")), "{err}");
    assert_eq!(db.job(failed_q).await.0, "failed");
    let err = fails(&config, &["retry", "999999"], 65);
    assert!(
        err.ends_with("job 999999: no such job; nothing was retried"),
        "{err}"
    );

    assert_eq!(
        ok(&config, &["retry", &failed_q.to_string()]),
        "retried 1 job(s)\n"
    );
    let (status, attempts, batch, worker, error) = db.job(failed_q).await;
    assert_eq!(
        (status.as_str(), attempts, batch, worker),
        ("pending", 0, None, None)
    );
    assert_eq!(
        error.as_deref(),
        Some("attempt 3 of 3: exit status 1; stderr: boom"),
        "kept until the next attempt"
    );
    let due = format!("id = {failed_q} AND finished_at IS NULL AND run_at <= NOW(6)");
    assert_eq!(db.count(&due).await, 1);

    // A whole queue's failed jobs; the other queue's stay.
    db.insert_rows("(queue, status, attempts)", "('bulk', 'failed', 3)", 1500)
        .await;
    assert_eq!(
        ok(&config, &["retry", "--queue", "bulk", "--failed"]),
        "retried 1500 failed job(s) of queue bulk\n"
    );
    assert_eq!(
        db.count("queue = 'bulk' AND status = 'pending' AND attempts = 0")
            .await,
        1500
    );
    assert_eq!(db.job(failed_other).await.0, "failed");

    // A failed job whose unique key a newer job holds stays failed.
    let mut conn = db.conn().await;
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, status, unique_key) VALUES ('u', 'failed', 'k'), ('u', 'pending', 'k')",
    )
    .await
    .unwrap();
    let key_failed: u64 = conn
        .query_first("SELECT id FROM myjob_jobs WHERE queue = 'u' AND status = 'failed'")
        .await
        .unwrap()
        .unwrap();
    let err = fails(&config, &["retry", &key_failed.to_string()], 65);
    assert!(
        err.contains(&format!(
            "job {key_failed}: its unique key \"k\" is held by job"
        )),
        "{err}"
    );
    assert_eq!(
        ok(&config, &["retry", "--queue", "u", "--failed"]),
        "retried 0 failed job(s) of queue u\n1 stayed failed: a job that is not finished holds their unique key\n"
    );
    assert_eq!(db.job(key_failed).await.0, "failed");

    // The retried job runs again, from attempt 1.
    conn.exec_drop(
        "UPDATE myjob_jobs SET payload = 'ok' WHERE id = ?",
        (failed_q,),
    )
    .await
    .unwrap();
    conn.exec_drop(
        "DELETE FROM myjob_jobs WHERE queue = 'q' AND id <> ?",
        (failed_q,),
    )
    .await
    .unwrap();
    let _w = Worker::start(&config, "1");
    db.wait_count(&format!("id = {failed_q} AND status = 'done'"), 1, 30)
        .await;
    assert_eq!(
        db.runs().iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        [(failed_q, 1)]
    );

    // Usage: ids or --queue with --failed, not both, not neither.
    fails(&config, &["retry"], 64);
    fails(&config, &["retry", "--queue", "q"], 64);
    fails(&config, &["retry", "--failed"], 64);
    fails(&config, &["retry", "1", "--queue", "q", "--failed"], 64);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_ends_waiting_jobs_and_frees_their_unique_key() {
    let db = TestDb::new("op_cancel").await;
    let config = db.config("", "");
    let ids = states(&db).await;
    let (pending, scheduled, done) = (ids[0], ids[2], ids[4]);

    let err = fails(
        &config,
        &["cancel", &pending.to_string(), &done.to_string()],
        65,
    );
    assert!(
        err.ends_with(&format!(
            "job {done}: is done, finished already; nothing was cancelled"
        )),
        "{err}"
    );
    assert_eq!(db.job(pending).await.0, "pending");

    assert_eq!(
        ok(
            &config,
            &["cancel", &pending.to_string(), &scheduled.to_string()]
        ),
        format!(
            "job {pending}: cancelled (was pending)\njob {scheduled}: cancelled (was scheduled)\n"
        )
    );
    assert_eq!(
        db.count(&format!(
            "id IN ({pending}, {scheduled}) AND status = 'cancelled' AND finished_at IS NOT NULL AND run_at <= NOW(6)"
        ))
        .await,
        2
    );
    fails(&config, &["cancel", &pending.to_string()], 65);
    fails(&config, &["cancel"], 64);

    // The unique key is free again: the same key makes a new job.
    let enqueue = |key: &str| {
        ok(
            &config,
            &["enqueue", "--queue", "q", "--unique-key", key, "x"],
        )
    };
    let first: u64 = enqueue("k").trim().parse().unwrap();
    ok(&config, &["cancel", &first.to_string()]);
    let second: u64 = enqueue("k").trim().parse().unwrap();
    assert_ne!(first, second);
}

/// A running handler that ignores SIGTERM: the cancel reaches it through the worker's
/// keepalive, SIGTERM then SIGKILL end its whole group, and the job ends cancelled, not
/// retried.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_a_running_handler_that_ignores_sigterm() {
    let db = TestDb::new("op_cancel_running").await;
    let config = db.config("kill_grace = \"1s\"", "");
    let id = db.insert("q", &["ignore-term:300"]).await[0];
    let w = Worker::start(&config, "1");
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 30)
        .await;
    while !db.path("child").exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let handler = db.runs()[0].3 as i32;
    let child: i32 = std::fs::read_to_string(db.path("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let asked = Instant::now();
    assert_eq!(
        ok(&config, &["cancel", &id.to_string()]),
        format!("job {id}: cancelled while running; its worker stops the handler within 2 s\n")
    );
    w.wait_log("job cancelled: SIGTERM", 10).await;
    let noticed = asked.elapsed();
    w.wait_log("job cancelled: its handler was stopped", 10)
        .await;
    for pid in [handler, child] {
        let gone = !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z");
        assert!(gone, "process {pid} outlived the cancel");
    }
    let log = w.log_text();
    assert!(log.contains("handler ignored SIGTERM: SIGKILL"), "{log}");
    assert!(
        noticed < Duration::from_secs(3),
        "the cancel took {noticed:?} to reach the handler"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, attempts, ..) = db.job(id).await;
    assert_eq!((status.as_str(), attempts), ("cancelled", 1));
    assert_eq!(db.runs().len(), 1, "never run again");
    assert!(!log.contains("lost its claim"), "{log}");
}

/// A purge right after a cancel of a running job: the row is what tells the worker to stop
/// the handler, so it stays until the worker has done so, and goes at the purge after.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_running_job_outlives_a_purge_until_its_handler_is_stopped() {
    let db = TestDb::new("op_cancel_purge").await;
    let config = db.config("", "");
    let id = db.insert("q", &["sleep:30"]).await[0];
    let w = Worker::start(&config, "1");
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 30)
        .await;
    while db.runs().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ok(&config, &["cancel", &id.to_string()]);
    let purged = ok(
        &config,
        &["purge", "--cancelled-older-than", "0s", "--json"],
    );
    assert!(purged.contains("\"cancelled\":0"), "{purged}");
    w.wait_log("job cancelled: its handler was stopped", 10)
        .await;
    // The worker says so in the row; the next purge takes it.
    let start = Instant::now();
    loop {
        let purged = ok(
            &config,
            &["purge", "--cancelled-older-than", "0s", "--json"],
        );
        if purged.contains("\"cancelled\":1") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{purged}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(db.count("TRUE").await, 0);
    assert!(!w.log_text().contains("job done"), "{}", w.log_text());
}

/// A paused queue is not claimed, by a running worker or a restarted one, while another
/// queue's jobs run; once resumed, its jobs run.
#[tokio::test(flavor = "multi_thread")]
async fn pause_holds_across_a_restart_and_resume_lets_jobs_run() {
    let db = TestDb::new("op_pause").await;
    let handler = db.handler();
    let config = db.config(
        "",
        &format!(
            "\n[[queue]]\nname = \"other\"\ncommand = [\"{}\"]\n",
            handler.display()
        ),
    );
    assert_eq!(
        ok(&config, &["pause", "q"]),
        "queue q: paused; running jobs finish, no new ones are claimed\n"
    );
    assert_eq!(ok(&config, &["pause", "q"]), "queue q: paused already\n");
    let log = db.path("worker.log");
    let mut w = Worker::start_appending(&config, "1", &log);
    let held = db.insert("q", &["a", "b"]).await;
    db.insert("other", &["c"]).await;
    db.wait_count("queue = 'other' AND status = 'done'", 1, 30)
        .await;
    // Several polls later, still nothing of q claimed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.count("queue = 'q' AND status = 'pending'").await, 2);

    w.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(w.wait(30), Some(0));
    let _w = Worker::start_appending(&config, "1", &log);
    db.insert("other", &["d"]).await;
    db.wait_count("queue = 'other' AND status = 'done'", 2, 30)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.count("queue = 'q' AND status = 'pending'").await, 2);
    let stats = json(&ok(&config, &["stats", "--json"]));
    assert_eq!(stats["queues"][1]["queue"], "q");
    assert_eq!(stats["queues"][1]["paused"], true);

    assert_eq!(ok(&config, &["resume", "q"]), "queue q: resumed\n");
    assert_eq!(ok(&config, &["resume", "q"]), "queue q: not paused\n");
    db.wait_count("queue = 'q' AND status = 'done'", 2, 30)
        .await;
    let ran: Vec<u64> = db
        .runs()
        .iter()
        .map(|r| r.0)
        .filter(|id| held.contains(id))
        .collect();
    assert_eq!(ran.len(), 2);

    fails(&config, &["pause"], 64);
    let err = fails(&config, &["pause", "bad name"], 64);
    assert!(err.contains("queue name"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_commands_exit_69_when_the_database_is_away() {
    let db = TestDb::new("op_away").await;
    let config = db.config("", "");
    let away = db.path("away.toml");
    common::edited(
        &config,
        &away,
        &[(db.url.as_str(), "mysql://root@127.0.0.1:1/none")],
    );
    for args in [
        &["stats"][..],
        &["list"],
        &["show", "1"],
        &["retry", "1"],
        &["cancel", "1"],
        &["pause", "q"],
        &["resume", "q"],
        &["purge"],
    ] {
        let err = fails(&away, args, 69);
        assert!(err.contains("127.0.0.1:1"), "{args:?}: {err}");
    }
}

/// Finished rows of every kind, old and young, beside live ones as old, for the purge tests:
/// returns a query of what is left, by queue and status.
async fn finished_rows(db: &TestDb) {
    let cols = "(queue, status, run_at, finished_at)";
    let at = |days: &str| format!("NOW(6) - INTERVAL {days}");
    for (queue, status, run_at, finished_at, n) in [
        // More than two batches of old done jobs, so that the purge goes on past a batch.
        ("q", "done", at("10 DAY"), at("10 DAY"), 2500),
        ("q", "done", at("1 HOUR"), at("1 HOUR"), 3),
        // Due 20 days ago, but finished an hour ago: young, though first in the due index.
        ("q", "done", at("20 DAY"), at("1 HOUR"), 2),
        ("q", "failed", at("40 DAY"), at("40 DAY"), 2),
        ("q", "failed", at("1 DAY"), at("1 DAY"), 1),
        ("q", "cancelled", at("40 DAY"), at("40 DAY"), 1),
        ("other", "done", at("10 DAY"), at("10 DAY"), 5),
        // Live jobs are never purged, however old.
        ("q", "pending", at("40 DAY"), "NULL".into(), 1),
        ("q", "scheduled", at("40 DAY"), "NULL".into(), 1),
        ("q", "claimed", at("40 DAY"), "NULL".into(), 1),
    ] {
        db.insert_rows(
            cols,
            &format!("('{queue}', '{status}', {run_at}, {finished_at})"),
            n,
        )
        .await;
    }
}

/// `(queue, status, count)` of every row left, sorted by name.
async fn left(db: &TestDb) -> Vec<(String, String, u64)> {
    let mut conn = db.conn().await;
    let mut rows: Vec<(String, String, u64)> = conn
        .query(
            "SELECT CAST(queue AS CHAR), CAST(status AS CHAR), COUNT(*) FROM myjob_jobs \
             GROUP BY queue, status",
        )
        .await
        .unwrap();
    rows.sort();
    rows
}

fn rows(list: &[(&str, &str, u64)]) -> Vec<(String, String, u64)> {
    list.iter()
        .map(|(q, s, n)| (q.to_string(), s.to_string(), *n))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_deletes_finished_jobs_by_age_and_queue() {
    let db = TestDb::new("op_purge").await;
    let config = db.config("", "");
    finished_rows(&db).await;

    // One state, one queue.
    assert_eq!(
        ok(
            &config,
            &["purge", "--done-older-than", "7d", "--queue", "q"]
        ),
        "deleted 2500 job(s): 2500 done, 0 failed, 0 cancelled\n"
    );
    // No age given: the config's [retention], here the defaults (done 7d, failed and
    // cancelled 30d).
    let doc = json(&ok(&config, &["purge", "--json"]));
    assert_eq!(
        doc,
        json(r#"{"done": 5, "failed": 2, "cancelled": 1, "total": 8}"#)
    );
    assert_eq!(
        left(&db).await,
        rows(&[
            ("q", "claimed", 1),
            ("q", "done", 5),
            ("q", "failed", 1),
            ("q", "pending", 1),
            ("q", "scheduled", 1),
        ])
    );

    // "forever" purges nothing; 0s every finished job of its state.
    assert_eq!(
        ok(&config, &["purge", "--failed-older-than", "forever"]),
        "deleted 0 job(s): 0 done, 0 failed, 0 cancelled\n"
    );
    assert_eq!(
        ok(
            &config,
            &[
                "purge",
                "--done-older-than",
                "0s",
                "--failed-older-than",
                "2h"
            ]
        ),
        "deleted 6 job(s): 5 done, 1 failed, 0 cancelled\n"
    );
    assert_eq!(
        db.count("status IN ('pending', 'scheduled', 'claimed')")
            .await,
        3
    );
    assert_eq!(db.count("1").await, 3);

    let err = fails(&config, &["purge", "--done-older-than", "soon"], 64);
    assert!(
        err.contains("--done-older-than") && err.contains("\"soon\""),
        "{err}"
    );
    let err = fails(&config, &["purge", "--queue", "bad name"], 64);
    assert!(err.contains("queue name"), "{err}");
}

/// The reaper deletes finished jobs past `[retention]`: a job done by the worker goes a
/// second after it finished, an old cancelled one by the default age, and failed ones stay
/// for ever when told to.
#[tokio::test(flavor = "multi_thread")]
async fn the_reaper_applies_retention() {
    let db = TestDb::new("op_retention").await;
    let config = db.config("", "\n[retention]\ndone = \"1s\"\nfailed = \"forever\"\n");
    let cols = "(queue, status, run_at, finished_at)";
    for (status, age, n) in [
        ("done", "10 DAY", 3),
        ("failed", "400 DAY", 2),
        ("cancelled", "40 DAY", 4),
        ("cancelled", "1 HOUR", 1),
    ] {
        let at = format!("NOW(6) - INTERVAL {age}");
        db.insert_rows(cols, &format!("('q', '{status}', {at}, {at})"), n)
            .await;
    }
    let w = Worker::start(&config, "1");
    let ran = db.insert("q", &["a", "b"]).await;
    // Run, then deleted: none is left pending, running or done.
    db.wait_count("status IN ('pending', 'claimed', 'done')", 0, 30)
        .await;
    let mut runs: Vec<u64> = db.runs().iter().map(|r| r.0).collect();
    runs.sort();
    assert_eq!(runs, ran);
    assert_eq!(
        left(&db).await,
        rows(&[("q", "cancelled", 1), ("q", "failed", 2)])
    );
    w.wait_log("reaper: deleted finished jobs past their retention", 10)
        .await;
}

/// Jobs with a concurrency key, enqueued from the command line with no worker running: they
/// wait as blocked, counted by `stats` and shown with their key by `list`; one can be
/// cancelled while it waits; a failed one is retried into the line again (blocked), not
/// past it; and a key over 191 bytes is refused with exit 65.
#[tokio::test(flavor = "multi_thread")]
async fn blocked_jobs_are_counted_listed_cancelled_and_retried_into_the_line() {
    let db = TestDb::new("op_blocked").await;
    let config = db.config("", "");
    let keyed = |payload: &str| {
        let args = [
            "enqueue",
            "--queue",
            "q",
            "--concurrency-key",
            "sku-42",
            payload,
        ];
        ok(&config, &args)
    };
    let a = keyed("a");
    let b = keyed("b");
    let plain = ok(&config, &["enqueue", "--queue", "q", "c"]);
    let (a, b, plain) = (a.trim(), b.trim(), plain.trim());
    assert_eq!(db.count("status = 'blocked'").await, 2);
    let doc = json(&ok(&config, &["stats", "--json"]));
    let q = &doc["queues"][0];
    assert_eq!(
        (q["pending"].as_u64(), q["blocked"].as_u64()),
        (Some(1), Some(2))
    );

    let listed = ok(&config, &["list", "--status", "blocked"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert!(
        lines[0].starts_with("ID  QUEUE  STATUS   KEY     PRI"),
        "{listed}"
    );
    assert!(
        lines[1].starts_with(&format!("{a}   q      blocked  sku-42  0")),
        "{listed}"
    );
    assert_eq!(lines.len(), 3, "{listed}");
    let doc = json(&ok(&config, &["list", "--json"]));
    let job = doc["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"].as_u64() == b.parse().ok())
        .unwrap()
        .clone();
    assert_eq!(
        (job["concurrency_key"].as_str(), job["slot"].as_u64()),
        (Some("sku-42"), None)
    );
    // No KEY column when no job shown has a key.
    let unkeyed = ok(&config, &["list", "--status", "pending"]);
    assert!(!unkeyed.contains("KEY"), "{unkeyed}");
    assert!(unkeyed.contains(plain), "{unkeyed}");

    ok(&config, &["cancel", a]);
    assert_eq!(db.job(a.parse().unwrap()).await.0, "cancelled");
    // A failed keyed job goes back into its key's line.
    let mut conn = db.conn().await;
    conn.query_drop(format!(
        "UPDATE myjob_jobs SET status = 'failed' WHERE id = {b}"
    ))
    .await
    .unwrap();
    ok(&config, &["retry", b]);
    assert_eq!(db.job(b.parse().unwrap()).await.0, "blocked");

    // Enqueued again with its unique key, a pending (admitted) job keeps its slot; with
    // another key it waits for a slot of that one.
    let unique = |key: &str, payload: &str| {
        let args = [
            "enqueue",
            "--queue",
            "q",
            "--unique-key",
            "u1",
            "--concurrency-key",
            key,
            payload,
        ];
        ok(&config, &args).trim().to_owned()
    };
    let u = unique("sku-7", "x");
    conn.query_drop(format!(
        "UPDATE myjob_jobs SET status = 'pending', slot = 1 WHERE id = {u}"
    ))
    .await
    .unwrap();
    assert_eq!(unique("sku-7", "y"), u);
    let row: Option<(String, Option<u16>, Vec<u8>)> = conn
        .query_first(format!(
            "SELECT status, slot_live, payload FROM myjob_jobs WHERE id = {u}"
        ))
        .await
        .unwrap();
    assert_eq!(row, Some(("pending".into(), Some(1), b"y".to_vec())));
    assert_eq!(unique("sku-8", "z"), u);
    assert_eq!(db.job(u.parse().unwrap()).await.0, "blocked");

    let long = "k".repeat(192);
    let err = fails(
        &config,
        &["enqueue", "--queue", "q", "--concurrency-key", &long, "x"],
        65,
    );
    assert!(
        err.starts_with("--concurrency-key: must be 1 to 191 bytes"),
        "{err}"
    );
}
