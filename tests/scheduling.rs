//! Future jobs in bulk, against the real server: a producer's plain INSERT of 200,000 jobs for
//! tomorrow leaves the claims of due jobs alone, and of several instances one stages the
//! scheduled jobs that come due, for all of them, another taking over when it dies.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::{TestDb, Worker};
use nix::sys::signal::Signal;

/// 200,000 jobs for tomorrow by plain SQL, then 300 due ones: the future rows are scheduled
/// from their INSERT on, so the drain neither walks them nor waits for a stager to move
/// them, and none of them runs.
#[tokio::test(flavor = "multi_thread")]
async fn due_jobs_drain_behind_200k_future_plain_inserts() {
    let db = TestDb::new("sched_bulk").await;
    db.insert_rows(
        "(queue, payload, run_at)",
        "('q', 'tomorrow', NOW(6) + INTERVAL 1 DAY)",
        200_000,
    )
    .await;
    assert_eq!(
        db.count("status = 'scheduled'").await,
        200_000,
        "future rows are scheduled at their INSERT"
    );
    db.insert_rows("(queue, payload)", "('q', 'now')", 300)
        .await;
    let config = db.config("concurrency = 4", "");
    let start = Instant::now();
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 300, 60).await;
    eprintln!(
        "300 due jobs behind 200k future ones: {:?}",
        start.elapsed()
    );
    assert_eq!(db.count("status = 'scheduled'").await, 200_000);
    let ran: HashSet<u64> = db.runs().into_iter().map(|r| r.0).collect();
    assert_eq!(ran.len(), 300, "each due job ran once, no future one ran");
    assert!(
        !w.log_text()
            .contains("jobs moved between scheduled and pending"),
        "the stager moved rows: {}",
        w.log_text()
    );
}

/// Four instances: one stages for all (the others stand by), the jobs that come due run once
/// each; after a `kill -9` of that one, another takes the stager over within seconds.
#[tokio::test(flavor = "multi_thread")]
async fn one_stager_for_four_instances_and_a_takeover() {
    let db = TestDb::new("sched_four").await;
    let config = db.config("concurrency = 4", "");
    let mut workers: Vec<Worker> = (1..=4)
        .map(|i| Worker::start(&config, &i.to_string()))
        .collect();
    for w in &workers {
        w.wait_log("ready", 20).await;
    }
    let stagers = |workers: &[Worker]| -> Vec<usize> {
        (0..workers.len())
            .filter(|&i| {
                workers[i]
                    .log_text()
                    .contains("stager: this instance stages scheduled jobs")
            })
            .collect()
    };
    // Due in 2 s, inserted by plain SQL: scheduled until the stager finds them due.
    db.insert_rows(
        "(queue, payload, run_at)",
        "('q', 'x', NOW(6) + INTERVAL 2 SECOND)",
        2_000,
    )
    .await;
    db.wait_count("status = 'done'", 2_000, 60).await;
    let holders = stagers(&workers);
    assert_eq!(
        holders.len(),
        1,
        "one stager among four instances: {holders:?}"
    );

    // The stager's instance dies; the others notice its lock is free.
    let dead = holders[0];
    workers[dead].signal(Signal::SIGKILL);
    workers[dead].wait(10);
    db.insert_rows(
        "(queue, payload, run_at)",
        "('q', 'y', NOW(6) + INTERVAL 1 SECOND)",
        100,
    )
    .await;
    let start = Instant::now();
    db.wait_count("status = 'done'", 2_100, 30).await;
    eprintln!(
        "jobs staged after the stager's death in {:?}",
        start.elapsed()
    );
    let live: Vec<Worker> = workers
        .drain(..)
        .enumerate()
        .filter(|(i, _)| *i != dead)
        .map(|(_, w)| w)
        .collect();
    assert_eq!(stagers(&live).len(), 1, "one instance took the stager over");
    let runs = db.runs();
    let ids: HashSet<u64> = runs.iter().map(|r| r.0).collect();
    assert_eq!((runs.len(), ids.len()), (2_100, 2_100), "each job ran once");
    assert!(start.elapsed() < Duration::from_secs(30));
}

/// The instance that holds the stager lock is frozen (SIGSTOP): its connection, and with it
/// the lock, live on. Jobs that come due meanwhile are staged by another instance once they
/// are overdue, and run; nothing waits for the frozen one.
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_stager_holds_nothing_up() {
    let db = TestDb::new("sched_frozen").await;
    let config = db.config("concurrency = 4", "");
    let workers: Vec<Worker> = (1..=2)
        .map(|i| Worker::start(&config, &i.to_string()))
        .collect();
    let start = Instant::now();
    let holder = loop {
        if let Some(i) = (0..2).find(|&i| {
            workers[i]
                .log_text()
                .contains("stager: this instance stages scheduled jobs")
        }) {
            break i;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no stager took the lock"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let other = 1 - holder;
    workers[holder].signal(Signal::SIGSTOP);
    db.insert_rows(
        "(queue, payload, run_at)",
        "('q', 'x', NOW(6) + INTERVAL 1 SECOND)",
        50,
    )
    .await;
    // A panic here leaves it stopped: Drop's SIGKILL ends a stopped process too.
    db.wait_count("status = 'done'", 50, 30).await;
    workers[holder].signal(Signal::SIGCONT);
    workers[other]
        .wait_log(
            "stager: the instance that holds the stager lock left jobs due",
            5,
        )
        .await;
    assert!(db.runs().iter().all(|r| r.2 == (other + 1).to_string()));
}
