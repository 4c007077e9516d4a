//! An instance serving several queues, against the real server: a queue that is empty or
//! drained never makes a claim wait for the poll while another served queue has due jobs,
//! and queues that all have backlogs share the instance fairly.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;

/// A config whose queue `q` is followed by `extra` more queues `e1…`, run by the same
/// handler, with a poll of `poll`.
fn config(db: &TestDb, extra: usize, poll: &str) -> std::path::PathBuf {
    let handler = db.handler();
    let queues: String = (1..=extra)
        .map(|i| {
            format!(
                "\n[[queue]]\nname = \"e{i}\"\ncommand = [\"{}\"]\n",
                handler.display()
            )
        })
        .collect();
    let config = db.config("concurrency = 4", &queues);
    common::edited(
        &config,
        &config,
        &[(
            "poll_interval = \"100ms\"",
            &format!("poll_interval = \"{poll}\""),
        )],
    );
    config
}

/// 300 jobs in `q`, `extra` other queues empty, a poll of 10 s: the jobs are all done well
/// within the first poll, so no claim waited for one while `q` had jobs.
async fn one_busy_queue_among(extra: usize) {
    let db = TestDb::new(&format!("queues_busy_{extra}")).await;
    let config = config(&db, extra, "10s");
    db.insert_rows("(queue, payload)", "('q', 'x')", 300).await;
    let start = Instant::now();
    let w = Worker::start(&config, "1");
    let deadline = Duration::from_secs(8);
    loop {
        let done = db.count("status = 'done'").await;
        if done == 300 {
            break;
        }
        assert!(
            start.elapsed() < deadline,
            "{done} of 300 done after {deadline:?}: a claim waited for the 10 s poll while \
             queue q had jobs\n{}",
            w.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(db.runs().len(), 300, "each job ran once");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_queues_one_busy_never_wait_a_poll() {
    one_busy_queue_among(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_queues_one_busy_never_wait_a_poll() {
    one_busy_queue_among(9).await;
}

/// A queue that empties while another still has jobs: the other's jobs go on at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_queue_that_drains_first_holds_up_nothing() {
    let db = TestDb::new("queues_drain_first").await;
    let config = config(&db, 1, "10s");
    db.insert_rows("(queue, payload)", "('e1', 'x')", 20).await;
    db.insert_rows("(queue, payload)", "('q', 'x')", 300).await;
    let start = Instant::now();
    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 320, 8).await;
    assert!(start.elapsed() < Duration::from_secs(9));
}

/// Three queues with 200 jobs each: over the first half of the drain each queue gets its
/// third (within ±25 %), and within a queue the jobs run in priority, then id order.
#[tokio::test(flavor = "multi_thread")]
async fn busy_queues_share_the_instance_fairly_in_order() {
    let db = TestDb::new("queues_fair").await;
    let config = config(&db, 2, "100ms");
    for q in ["q", "e1", "e2"] {
        db.insert_rows("(queue, payload)", &format!("('{q}', 'x')"), 200)
            .await;
    }
    // One job of each queue jumps its queue's line.
    let mut conn = db.conn().await;
    conn.query_drop(
        "UPDATE myjob_jobs SET priority = 5 WHERE id IN \
         (SELECT id FROM (SELECT MAX(id) AS id FROM myjob_jobs GROUP BY queue) AS last)",
    )
    .await
    .unwrap();
    let queue_of: HashMap<u64, String> = conn
        .query::<(u64, Vec<u8>), _>("SELECT id, queue FROM myjob_jobs")
        .await
        .unwrap()
        .into_iter()
        .map(|(id, q)| (id, String::from_utf8(q).unwrap()))
        .collect();
    let priority: Vec<u64> = conn
        .query("SELECT id FROM myjob_jobs WHERE priority = 5")
        .await
        .unwrap();
    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 600, 60).await;

    let runs = db.runs();
    assert_eq!(runs.len(), 600, "each job ran once");
    let mut share: HashMap<&str, usize> = HashMap::new();
    for r in &runs[..300] {
        *share.entry(queue_of[&r.0].as_str()).or_default() += 1;
    }
    for q in ["q", "e1", "e2"] {
        let got = share.get(q).copied().unwrap_or(0);
        assert!(
            (75..=125).contains(&got),
            "queue {q} ran {got} of the first 300 jobs, not 100 ± 25: {share:?}"
        );
    }
    // In order within each queue: its priority job first, then by id. Jobs start in that
    // order; with 4 handlers at once they may be recorded up to twice that many places apart.
    for q in ["q", "e1", "e2"] {
        let order: Vec<u64> = runs
            .iter()
            .map(|r| r.0)
            .filter(|id| queue_of[id] == q)
            .collect();
        let first_p = order.iter().position(|id| priority.contains(id)).unwrap();
        assert!(first_p < 4, "queue {q}: its priority job ran {first_p}th");
        let rest: Vec<u64> = order
            .into_iter()
            .filter(|id| !priority.contains(id))
            .collect();
        let mut sorted = rest.clone();
        sorted.sort_unstable();
        let out_of_place = rest
            .iter()
            .zip(&sorted)
            .filter(|(id, want)| id.abs_diff(**want) > 8)
            .count();
        assert_eq!(
            out_of_place, 0,
            "queue {q} did not run in id order: {rest:?}"
        );
    }
}

/// With every slot busy there is nothing to probe for: the loop sleeps until a handler ends
/// or its next turn, rather than wake at once, over and over, for a probe it cannot make.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_instance_sleeps_while_its_handlers_run() {
    let db = TestDb::new("queues_full").await;
    let config = config(&db, 1, "100ms");
    common::edited(&config, &config, &[("concurrency = 4", "concurrency = 1")]);
    db.insert("q", &["sleep:10", "x"]).await;
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 1, 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", w.pid())).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        // utime and stime, the 14th and 15th fields of the whole line.
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let before = ticks();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = ticks() - before;
    // A loop that turns about once a second uses next to nothing; a busy loop, a core.
    assert!(
        used < 30,
        "{used} clock ticks of CPU in 3 s with its one slot busy: a busy loop"
    );
}
