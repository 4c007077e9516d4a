//! The persistent handler helpers of examples/persistent (myjob.php, myjob.py) and the plain
//! bash handler of docs/persistent-handlers.md, each run by a real worker: answers, exceptions, binary
//! payloads, output kept off the protocol's stdout, one process for every job. Needs `php`
//! and `python3` (tests/run installs php-cli when it is missing).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/persistent")
}

/// A handler on myjob.php: records each job (`id attempt pid`), keeps its payload, and does
/// what the payload says.
const PHP: &str = r#"#!/usr/bin/env php
<?php
require 'EXAMPLES/persistent/myjob.php';
myjob_serve(function (MyjobJob $job) {
    file_put_contents('DIR/runs', "{$job->id} {$job->attempt} " . getmypid() . "\n", FILE_APPEND);
    file_put_contents("DIR/payload.{$job->id}", $job->payload);
    switch ($job->payload) {
        case 'retry': throw new MyjobRetry("gateway said 503\nsecond line");
        case 'fail': throw new MyjobFail('no such number');
        case 'throw': throw new RuntimeException('database went away');
        case 'print': echo "printed by the handler\n"; print("and printed again\n"); return;
    }
});
"#;

/// The same handler on myjob.py.
const PY: &str = r#"#!/usr/bin/env python3
import os, subprocess, sys
# No __pycache__ beside the example.
sys.dont_write_bytecode = True
sys.path.insert(0, 'EXAMPLES/persistent')
import myjob

def handle(job):
    with open('DIR/runs', 'a') as f:
        f.write('%d %d %d\n' % (job.id, job.attempt, os.getpid()))
    with open('DIR/payload.%d' % job.id, 'wb') as f:
        f.write(job.payload)
    if job.payload == b'retry':
        raise myjob.Retry('gateway said 503\nsecond line')
    if job.payload == b'fail':
        raise myjob.Fail('no such number')
    if job.payload == b'throw':
        raise RuntimeError('database went away')
    if job.payload == b'print':
        print('printed by the handler')
        subprocess.run(['echo', 'and printed again'])

myjob.serve(handle)
"#;

/// A config with one persistent queue `h` run by `handler` in one slot, with `extra` added
/// to the queue's table.
fn one_queue(db: &TestDb, handler: &Path, extra: &str) -> PathBuf {
    let config = db.path("myjob.toml");
    let text = format!(
        "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{}\"\n[worker]\nconcurrency = 1\npoll_interval = \"100ms\"\n\
         [[queue]]\nname = \"h\"\ncommand = [\"{}\"]\npersistent = true\n{extra}\n",
        db.url,
        handler.display()
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// Runs the jobs of [`jobs`] through `script` as a persistent queue, one slot, and checks
/// every outcome.
async fn check_helper(tag: &str, script: &str) {
    let db = TestDb::new(tag).await;
    let handler = db.script("handler", script);
    let config = one_queue(
        &db,
        &handler,
        "backoff = \"100ms\"\nbackoff_max = \"100ms\"\nmax_attempts = 2",
    );

    let mut binary: Vec<u8> = (0..=255u8).collect();
    binary.extend_from_slice(b"\nJOB 1 1 1 1 3\nOK\n\0");
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for payload in [
        &b"fine"[..],
        &binary,
        b"",
        b"retry",
        b"fail",
        b"throw",
        b"print",
    ] {
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload) VALUES ('h', ?)",
            (payload,),
        )
        .await
        .unwrap();
        ids.push(conn.last_insert_id().unwrap());
    }
    let w = Worker::start(&config, "1");
    db.wait_count("status IN ('done', 'failed')", ids.len() as u64, 60)
        .await;

    for &i in &[0, 1, 2, 6] {
        assert_eq!(
            db.job(ids[i]).await.0,
            "done",
            "job {i}: {:?}",
            db.job(ids[i]).await
        );
    }
    let kept = std::fs::read(db.path(&format!("payload.{}", ids[1]))).unwrap();
    assert_eq!(kept, binary, "the binary payload arrived byte for byte");
    let (status, attempts, _, _, error) = db.job(ids[3]).await;
    assert_eq!((status.as_str(), attempts), ("failed", 2));
    assert_eq!(
        error.as_deref(),
        Some("attempt 2 of 2: gateway said 503 second line")
    );
    let (status, attempts, _, _, error) = db.job(ids[4]).await;
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert_eq!(
        error.as_deref(),
        Some("permanent failure on attempt 1: no such number")
    );
    let (status, attempts, _, _, error) = db.job(ids[5]).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("failed", 2),
        "an exception is retried"
    );
    assert_eq!(error.as_deref(), Some("attempt 2 of 2: database went away"));

    // What the handler printed went to the log, tagged with its job, not to the protocol.
    let print = ids[6];
    for line in ["printed by the handler", "and printed again"] {
        w.wait_log(&format!("{line} job_id={print} stream=\"stderr\""), 10)
            .await;
    }
    // One process served every job.
    let runs = std::fs::read_to_string(db.path("runs")).unwrap();
    let pids: HashSet<&str> = runs.lines().map(|l| l.split(' ').nth(2).unwrap()).collect();
    assert_eq!(runs.lines().count(), ids.len() + 2, "{runs}");
    assert_eq!(pids.len(), 1, "{runs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_php_helper_serves_jobs_under_a_real_worker() {
    check_helper("helper_php", PHP).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_helper_serves_jobs_under_a_real_worker() {
    check_helper("helper_py", PY).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_docs_plain_bash_handler_serves_jobs() {
    let db = TestDb::new("helper_bash").await;
    // docs/persistent-handlers.md shows examples/persistent/handler.sh whole; it must stay
    // the file tested here.
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/persistent-handlers.md"),
    )
    .unwrap();
    let plain = std::fs::read_to_string(examples().join("handler.sh")).unwrap();
    assert!(
        page.contains(&plain),
        "the docs' copy of handler.sh differs"
    );
    assert!(plain.lines().count() <= 15);
    // Its `send-sms`: keeps what it read, and fails on the payload "down".
    let bin = db.path("bin");
    std::fs::create_dir(&bin).unwrap();
    db.script(
        "bin/send-sms",
        "#!/bin/sh\ncat >> DIR/sent\necho >> DIR/sent\necho \"sent by $PPID\"\n! grep -q down DIR/sent\n",
    );
    let config = one_queue(&db, &examples().join("handler.sh"), "max_attempts = 1");
    let ids = db
        .insert("h", &["hello", "line one\nline two", "down"])
        .await;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let w = Worker::start_with_env(&config, "1", &[("PATH", &path)]);
    db.wait_count("status IN ('done', 'failed')", 3, 30).await;
    assert_eq!(db.job(ids[0]).await.0, "done");
    assert_eq!(db.job(ids[1]).await.0, "done");
    let (status, _, _, _, error) = db.job(ids[2]).await;
    assert_eq!(status, "failed");
    assert!(error.unwrap().contains("send-sms failed on attempt 1 of 1"));
    let sent = std::fs::read_to_string(db.path("sent")).unwrap();
    assert_eq!(sent, "hello\nline one\nline two\ndown\n");
    // send-sms's stdout reached the log, not the protocol; one bash process served all three.
    let log = w.log_text();
    let senders: HashSet<&str> = log
        .lines()
        .filter_map(|l| l.split("sent by ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap())
        .collect();
    assert_eq!(senders.len(), 1, "{log}");
}
