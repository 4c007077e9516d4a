//! The metrics endpoint: `[metrics] listen`, instance N on the base port plus N, `GET
//! /metrics` in the format the scraper asks for, 404 elsewhere, and the errors of a port in
//! use or an instance without a number.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::scrape::{free_port, get, sample};
use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;

/// The test's config with the endpoint on, instance 1 on `port`.
fn with_metrics(db: &TestDb, port: u16, name: &str) -> std::path::PathBuf {
    let base = db.config("concurrency = 2", "");
    let path = db.path(name);
    let text = std::fs::read_to_string(base).unwrap();
    let listen = format!("listen = \"127.0.0.1:{}\"", port - 1);
    std::fs::write(&path, text.replace("listen = \"\"", &listen)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_serves_its_counts_on_its_own_port() {
    let db = TestDb::new("metrics_serve").await;
    let port = free_port();
    let config = with_metrics(&db, port, "metrics.toml");
    db.insert("q", &vec!["ok"; 20]).await;
    // A due job of a queue the config does not name, an hour late: the queue gauges are the
    // database's, and name it all the same.
    db.conn()
        .await
        .query_drop(
            "INSERT INTO myjob_jobs (queue, payload, run_at) \
             VALUES ('elsewhere', 'x', NOW(6) - INTERVAL 1 HOUR)",
        )
        .await
        .unwrap();
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 20, 30).await;
    worker.wait_log("metrics: serving GET /metrics", 10).await;

    // Outcomes are counted when the handler ends; the scrape may come a moment later.
    let start = Instant::now();
    let text = loop {
        let (status, head, text) = get(port, "/metrics", None);
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        let done = sample(
            &text,
            r#"myjob_jobs_finished_total{queue="q",outcome="done"}"#,
        );
        if done == Some(20.0) {
            break text;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        sample(&text, r#"myjob_jobs_started_total{queue="q"}"#),
        Some(20.0)
    );
    assert_eq!(
        sample(&text, r#"myjob_job_duration_seconds_count{queue="q"}"#),
        Some(20.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"myjob_jobs_finished_total{queue="q",outcome="failed"}"#
        ),
        Some(0.0)
    );
    // The wait from due to start, one per attempt; the statements, timed by op.
    assert_eq!(
        sample(&text, r#"myjob_job_wait_seconds_count{queue="q"}"#),
        Some(20.0)
    );
    assert!(
        sample(
            &text,
            r#"myjob_db_statement_duration_seconds_count{op="claim"}"#
        )
        .unwrap()
            >= 1.0,
        "{text}"
    );
    // The only instance leads: it serves the queue gauges, read from the table.
    assert_eq!(
        sample(&text, "myjob_queue_gauges_leader"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"myjob_queue_jobs{queue="q",state="pending"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"myjob_queue_jobs{queue="elsewhere",state="pending"}"#
        ),
        Some(1.0),
        "{text}"
    );
    let age = sample(
        &text,
        r#"myjob_queue_oldest_due_age_seconds{queue="elsewhere"}"#,
    )
    .unwrap();
    assert!((3600.0..3700.0).contains(&age), "{text}");
    assert_eq!(
        sample(&text, r#"myjob_rescued_jobs_total{outcome="failed"}"#),
        Some(0.0)
    );
    assert_eq!(sample(&text, "myjob_handler_slots"), Some(2.0));
    assert_eq!(sample(&text, "myjob_db_up"), Some(1.0));
    assert!(text.contains("# HELP myjob_jobs_started_total"), "{text}");
    assert!(text.contains("myjob_build_info{version="), "{text}");
    assert!(
        sample(&text, r#"myjob_claims_total{queue="q",result="jobs"}"#).unwrap() >= 1.0,
        "{text}"
    );

    // OpenMetrics for a scraper that asks for it, as Prometheus does.
    let (status, head, text) = get(
        port,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(status, 200);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(text.ends_with("# EOF\n"), "{text}");

    let (status, ..) = get(port, "/", None);
    assert_eq!(status, 404);
    let (status, ..) = get(port, "/metricsx", None);
    assert_eq!(status, 404);
}

/// The config's error line, from the worker's log.
fn error_of(worker: &Worker) -> String {
    let log = worker.log_text();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{log}");
    errors[0].to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_port_in_use_or_an_instance_without_a_number_exits_78() {
    let db = TestDb::new("metrics_errors").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let config = with_metrics(&db, port, "taken.toml");
    let mut worker = Worker::start(&config, "1");
    assert_eq!(worker.wait(20), Some(78), "{}", worker.log_text());
    let line = error_of(&worker);
    assert!(
        line.contains("taken.toml: metrics.listen: cannot listen on 127.0.0.1:"),
        "{line}"
    );
    drop(taken);

    let config = with_metrics(&db, free_port(), "named.toml");
    let mut worker = Worker::start(&config, "web");
    assert_eq!(worker.wait(20), Some(78), "{}", worker.log_text());
    let line = error_of(&worker);
    assert!(
        line.contains("metrics.listen: instance \"web\" has no number"),
        "{line}"
    );

    // Under the default, an instance without a number runs, without metrics, and says so.
    let default = db.path("default.toml");
    let text = std::fs::read_to_string(db.config("", "")).unwrap();
    std::fs::write(&default, text.replace("[metrics]\nlisten = \"\"\n", "")).unwrap();
    let worker = Worker::start(&default, "web");
    worker.wait_log("ready", 20).await;
    worker
        .wait_log(
            "metrics: this instance serves no metrics: its name is not a number",
            5,
        )
        .await;

    let bad = db.path("bad.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("listen = \"127.0.0.1:", "listen = \"nowhere:");
    std::fs::write(&bad, text).unwrap();
    let out = common::myjob(&["--config", bad.to_str().unwrap(), "run"], b"");
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("metrics.listen") && err.contains("is not ADDRESS:PORT"),
        "{err}"
    );
}
