//! Flow control: a queue's rate limit holds across instances (and, on a Galera cluster,
//! across nodes), and the jobs it holds back start as soon as its budget allows.

mod common;

use std::time::Duration;

use common::{edited, TestDb, Worker};
use mysql_async::prelude::*;

/// `rate_limit = "50/1s"` served by three instances (each through another node of a
/// cluster): over 30 s with jobs always waiting, no second-long window holds more starts
/// than the limit plus the burst, and the starts keep up with the limit: at least 95% of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limit_holds_across_instances_and_keeps_up() {
    const RATE: u64 = 50;
    const SECS: u64 = 30;
    let db = TestDb::new("rate_limit").await;
    let config = db.config("concurrency = 8", "rate_limit = \"50/1s\"");
    // More jobs than 30 s of the limit, so that some always wait.
    db.insert_rows(
        "(queue, payload)",
        "('q', 'x')",
        (RATE * (SECS + 10)) as usize,
    )
    .await;
    let mut workers = Vec::new();
    for i in 0..3 {
        let own = db.path(&format!("myjob{i}.toml"));
        edited(&config, &own, &[(&db.url, &db.node_url(i))]);
        workers.push(Worker::start(&own, &format!("r{i}")));
    }
    let mut conn = db.conn().await;
    // Measured from the first start: the instances' own start-up is not the limit's.
    db.wait_at_least("status <> 'pending'", 1, 30).await;
    tokio::time::sleep(Duration::from_secs(SECS + 1)).await;
    drop(workers);

    let starts: Vec<i64> = conn
        .query(
            "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', claimed_at) FROM myjob_jobs \
             WHERE claimed_at IS NOT NULL ORDER BY claimed_at",
        )
        .await
        .unwrap();
    let first = starts[0];
    let within: Vec<i64> = starts
        .iter()
        .copied()
        .filter(|t| *t < first + (SECS * 1_000_000) as i64)
        .collect();
    // Any window of one second: at most the limit plus the burst (50 + 50).
    let busiest = within
        .iter()
        .enumerate()
        .map(|(i, t)| {
            within[i..]
                .iter()
                .take_while(|u| **u < t + 1_000_000)
                .count()
        })
        .max()
        .unwrap();
    let by_instance: Vec<u64> = {
        let runs = db.runs();
        (0..3)
            .map(|i| runs.iter().filter(|r| r.2 == format!("r{i}")).count() as u64)
            .collect()
    };
    eprintln!(
        "{} starts in {SECS} s (limit {}), busiest second {busiest}, by instance {by_instance:?}",
        within.len(),
        RATE * SECS
    );
    // The budget allows at most burst + 1 s x 50 = 99 starts in a second and 50 + 1,499 in
    // 30 s, by the database's clock when each claim took its starts. claimed_at is stamped
    // by the claim a little later, by an amount that varies with the load: 100 ms of that
    // could let up to five more into a window.
    let jitter = 5;
    assert!(
        busiest as u64 <= 2 * RATE + jitter,
        "{busiest} starts in one second"
    );
    assert!(
        within.len() as u64 <= RATE * SECS + RATE + jitter,
        "{} starts in {SECS} s",
        within.len()
    );
    assert!(
        by_instance.iter().filter(|n| **n > 0).count() >= 2,
        "one instance took every start: {by_instance:?}"
    );
    assert!(
        within.len() as u64 * 100 >= RATE * SECS * 95,
        "{} starts in {SECS} s: below 95% of the limit",
        within.len()
    );
}

/// An instance serving a limited queue and a free one: the free queue's jobs are not held up
/// behind the limited queue's waits (all 1,000 done while the limited one has hardly begun),
/// and the limited queue keeps to its limit beside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_limited_queue_holds_back_only_its_own_jobs() {
    let db = TestDb::new("rate_beside").await;
    let config = db.config(
        "concurrency = 8",
        "rate_limit = \"5/1s\"\nrate_burst = 1\n\n[[queue]]\nname = \"free\"\ncommand = [\"/bin/true\"]\n",
    );
    db.insert_rows("(queue, payload)", "('q', 'x')", 100).await;
    db.insert_rows("(queue, payload)", "('free', 'x')", 1000)
        .await;
    let _w = Worker::start(&config, "1");
    // 1,000 jobs of /bin/true take a few seconds on 8 slots; the limited queue's 100 would
    // take 20 s.
    db.wait_count("queue = 'free' AND status = 'done'", 1000, 60)
        .await;
    let mut conn = db.conn().await;
    let (limited, span): (u64, Option<i64>) = conn
        .query_first(
            "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), MAX(claimed_at)) \
             FROM myjob_jobs WHERE queue = 'q' AND claimed_at IS NOT NULL",
        )
        .await
        .unwrap()
        .unwrap();
    // rate_burst = 1: one start per 200 ms, the first at once, with a little jitter.
    let allowed = span.unwrap_or(0) as u64 / 200_000 + 1 + 2;
    eprintln!("the limited queue: {limited} starts over {span:?} us (allowed {allowed})");
    assert!(limited >= 1, "the limited queue never started");
    assert!(limited <= allowed, "{limited} starts, {allowed} allowed");
    // And it goes on: the next start comes within its interval.
    db.wait_at_least("queue = 'q' AND status = 'done'", limited + 2, 5)
        .await;
}
