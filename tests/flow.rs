//! Flow control: a queue's rate limit holds across instances (and, on a Galera cluster,
//! across nodes), and the jobs it holds back start as soon as its budget allows.

use std::time::Duration;

use crate::common;
use crate::common::{edited, TestDb, Worker};
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

/// A claim of a rate-limited queue that loses a lock wait (as one loses Galera's certification
/// to another node's claim) rolled back: the start it took from the budget goes back, and
/// the next claim gets it. With one start an hour, a start lost with it would hold the job
/// back for the hour.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_that_lost_a_lock_wait_gives_its_start_back() {
    let db = TestDb::new("rate_refund").await;
    let config = db.config("concurrency = 1", "rate_limit = \"1/1h\"\nrate_burst = 1");
    let url_line = format!("url = \"{}\"", db.url);
    let with_wait = format!("{url_line}\nlock_wait_timeout = \"1s\"");
    edited(&config, &config, &[(url_line.as_str(), with_wait.as_str())]);
    let id = db.insert("q", &["quick"]).await[0];
    let mut locker = db.lock_job(id).await;
    let worker = Worker::start(&config, "1");
    // Two claims wait out the lock and fail: the second could take the budget's one start
    // only if the first gave it back (without, the instance waits the hour and never
    // claims again).
    let start = std::time::Instant::now();
    while worker
        .log_text()
        .matches("Lock wait timeout exceeded")
        .count()
        < 2
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no second claim:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(db.job(id).await.0, "pending");
    locker.query_drop("COMMIT").await.unwrap();
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
}

/// A refund gives back only the part of a reservation still ahead of the database's clock:
/// a claim that waited out a lock (up to `lock_wait_timeout`) while its interval passed and
/// another instance took the next start gives nothing back, so no start comes early; one
/// whose intervals are still ahead gives them back.
#[tokio::test(flavor = "multi_thread")]
async fn a_refund_gives_back_only_the_intervals_still_ahead() {
    use myjob::store::queues::{refund, reserve, Reservation};
    let db = TestDb::new("rate_refund_late").await;
    let (mut a, mut b) = (db.conn().await, db.conn().await);
    // One start an hour: nothing refills while the test runs, however slow the machine.
    let rate = myjob::config::RateLimit {
        interval_us: 3_600_000_000,
        burst: 1,
    };
    let next = reserve(&mut b, "q", &rate, 1).await.unwrap();
    assert_eq!(next.granted, 1);
    // A reservation whose hour ended a moment ago, its claim failed only now.
    let now = myjob::store::schedules::now_us(&mut a).await.unwrap();
    let late = Reservation {
        granted: 1,
        wait_us: 0,
        tat_us: now - 1,
    };
    refund(&mut a, "q", &rate, &late, 1).await.unwrap();
    let early = reserve(&mut b, "q", &rate, 1).await.unwrap();
    assert_eq!(
        early.granted, 0,
        "a start right after another, one an hour allowed"
    );
    // The start of `next`, its hour still ahead, given back: the next claim gets it.
    refund(&mut b, "q", &rate, &next, 1).await.unwrap();
    let again = reserve(&mut a, "q", &rate, 1).await.unwrap();
    assert_eq!(again.granted, 1, "the start given back");
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

/// A handler that records, by this host's clock, when each job of a key starts and ends:
/// `s|e <key> <job id> <nanoseconds>`, one line per event (an append of a short line is
/// atomic). The payload is the key; it runs `SLEEP` seconds.
const KEYED: &str = "#!/bin/sh\n\
    key=$(cat)\n\
    echo \"s $key $MYJOB_JOB_ID $(date +%s%N)\" >> DIR/trace\n\
    sleep SLEEP\n\
    echo \"e $key $MYJOB_JOB_ID $(date +%s%N)\" >> DIR/trace\n";

/// One event of [`KEYED`]'s trace.
#[derive(Debug, Clone)]
struct Event {
    start: bool,
    key: String,
    job: u64,
    at: i128,
}

fn trace(db: &TestDb) -> Vec<Event> {
    let text = std::fs::read_to_string(db.path("trace")).unwrap_or_default();
    let mut events: Vec<Event> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Event {
                start: f[0] == "s",
                key: f[1].to_owned(),
                job: f[2].parse().unwrap(),
                at: f[3].parse().unwrap(),
            }
        })
        .collect();
    // Ends before starts at the same instant: a handoff cannot start before the end.
    events.sort_by_key(|e| (e.at, e.start));
    events
}

/// The most jobs of one key that ran at once, by key; and the most jobs that ran at once.
fn most_at_once(events: &[Event]) -> (std::collections::BTreeMap<String, usize>, usize) {
    let mut running: std::collections::BTreeMap<String, usize> = Default::default();
    let mut most: std::collections::BTreeMap<String, usize> = Default::default();
    let (mut all, mut most_all) = (0usize, 0usize);
    for e in events {
        let n = running.entry(e.key.clone()).or_default();
        if e.start {
            *n += 1;
            all += 1;
        } else {
            *n = n.saturating_sub(1);
            all = all.saturating_sub(1);
        }
        let m = most.entry(e.key.clone()).or_default();
        *m = (*m).max(*n);
        most_all = most_all.max(all);
    }
    (most, most_all)
}

/// A config of the test queue `q` and a queue `keyed` run by [`KEYED`] sleeping `sleep`
/// seconds, with `extra` TOML in `keyed`, and `worker_extra` in `[worker]`.
fn keyed_config(db: &TestDb, worker_extra: &str, sleep: &str, extra: &str) -> std::path::PathBuf {
    let handler = db.script("keyed.sh", &KEYED.replace("SLEEP", sleep));
    db.config(
        worker_extra,
        &format!(
            "\n[[queue]]\nname = \"keyed\"\ncommand = [\"{}\"]\n{extra}",
            handler.display()
        ),
    )
}

/// Jobs of four keys, inserted by plain SQL, interleaved, beside jobs without a key, on two
/// instances: a key's jobs run one at a time (key_limit's default, 1), in arrival order,
/// while keys run beside each other and the jobs without a key are not held up; each job
/// starts soon after the one before it of its key ended (the hand-off, not the gate's poll);
/// and no attempt is spent waiting.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_runs_one_job_at_a_time_in_order_and_keys_side_by_side() {
    let db = TestDb::new("key_limit").await;
    let config = keyed_config(&db, "concurrency = 8", "0.05", "");
    db.insert_keyed(40, 4).await;
    db.insert_rows("(queue, payload)", "('q', 'x')", 20).await;
    assert_eq!(db.count("status = 'blocked'").await, 40);
    let _w1 = Worker::start(&config, "1");
    let _w2 = Worker::start(&config, "2");
    // Blocked jobs wait: no attempt is spent on them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(db.count("status = 'blocked' AND attempts > 0").await, 0);
    db.wait_count("status = 'done'", 60, 60).await;

    let events = trace(&db);
    assert_eq!(events.len(), 80, "{events:?}");
    let (most, most_all) = most_at_once(&events);
    eprintln!("most at once by key {most:?}, in all {most_all}");
    assert!(most.values().all(|&n| n == 1), "{most:?}");
    assert!(most_all >= 3, "keys did not run side by side: {most_all}");
    // Arrival order within each key.
    for k in 0..4 {
        let key = format!("k{k}");
        let order: Vec<u64> = events
            .iter()
            .filter(|e| e.start && e.key == key)
            .map(|e| e.job)
            .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "key {key} ran out of order");
    }
    // From one job's end to the next start of its key: the median is well under the poll
    // (100 ms): the slot is handed on at the outcome's write, not found by the next poll.
    let mut gaps: Vec<i128> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e.start {
            continue;
        }
        if let Some(next) = events[i..].iter().find(|n| n.start && n.key == e.key) {
            gaps.push(next.at - e.at);
        }
    }
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    eprintln!("end to next start of the key: median {} us", median / 1000);
    assert!(median < 100_000_000, "median hand-off {} us", median / 1000);
    // Every key's slot is free at the end.
    assert_eq!(db.count("slot_live IS NOT NULL").await, 0);
}

/// key_limit = 2 on three instances (each through another node of a cluster): two jobs of a
/// key run at once, never three, and every job is done.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_limit_of_two_holds_across_instances() {
    let db = TestDb::new("key_limit_two").await;
    let config = keyed_config(&db, "concurrency = 6", "0.1", "key_limit = 2\n");
    let mut workers = Vec::new();
    for i in 0..3 {
        let own = db.path(&format!("myjob{i}.toml"));
        edited(&config, &own, &[(&db.url, &db.node_url(i))]);
        workers.push(Worker::start(&own, &format!("n{i}")));
    }
    db.insert_keyed(60, 3).await;
    db.wait_count("status = 'done'", 60, 90).await;
    let (most, _) = most_at_once(&trace(&db));
    eprintln!("most at once by key {most:?}");
    assert!(most.values().all(|&n| n == 2), "{most:?}");
}

/// The flash sale of docs/concurrency-keys.md (examples/flash-sale): 10 products with 10 units each, 1,000
/// orders across them enqueued at once by plain SQL, 4 instances (spread over a cluster's
/// nodes), the PHP handler selling each order with the exactly-once recipe: exactly 100 sold,
/// 10 per product, no stock below zero, every other order sold out, and the orders of each
/// product handled in the order they came (the first 10 of each are the ones sold).
#[tokio::test(flavor = "multi_thread")]
async fn the_flash_sale_sells_each_unit_once_in_arrival_order() {
    let db = TestDb::new("flash_sale").await;
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut conn = db.conn().await;
    let schema = std::fs::read_to_string(examples.join("flash-sale/schema.sql")).unwrap();
    conn.query_drop(schema).await.unwrap();
    // The web requests: 1,000 orders, the products interleaved, then a job per order.
    let sale = std::fs::read_to_string(examples.join("flash-sale/sale.sql")).unwrap();
    conn.query_drop(sale).await.unwrap();
    let config = db.path("myjob.toml");
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{url}\"\n\
             [worker]\nconcurrency = 4\npoll_interval = \"100ms\"\n\
             [[queue]]\nname = \"orders\"\ncommand = [\"{h}\"]\nkey_limit = 1\n\
             pass_env = [\"SHOP_DB\"]\n",
            url = db.url,
            h = examples.join("flash-sale/order.php").display()
        ),
    )
    .unwrap();
    let mut workers = Vec::new();
    for i in 0..4 {
        let own = db.path(&format!("myjob{i}.toml"));
        let node = db.node_url(i % common::nodes().len().max(1));
        edited(&config, &own, &[(&db.url, &node)]);
        workers.push(Worker::start_with_env(
            &own,
            &format!("{}", i + 1),
            &[("SHOP_DB", node.as_str())],
        ));
    }
    db.wait_count("status = 'done'", 1000, 240).await;
    // Tries of the recipe that lost to a deadlock (on a cluster, another node's write) and ran
    // again within the job's attempt: many of them say the nodes lag.
    let lost: usize = workers
        .iter()
        .map(|w| w.log_text().matches("lost to a deadlock").count())
        .sum();
    eprintln!("tries of the recipe lost to a deadlock: {lost}");
    drop(workers);

    let sold: Vec<(i32, i64, i64, i64)> = conn
        .query(
            "SELECT p.id, p.stock, SUM(o.status = 'sold'), SUM(o.status = 'sold_out') \
             FROM products p JOIN orders o ON o.product = p.id GROUP BY p.id, p.stock ORDER BY p.id",
        )
        .await
        .unwrap();
    for (product, stock, n, out) in &sold {
        assert_eq!(
            (*stock, *n, *out),
            (0, 10, 90),
            "product {product}: stock, sold, sold out"
        );
    }
    assert_eq!(db.count("1 = 1").await, 1000);
    let unhandled: u64 = conn
        .query_first("SELECT COUNT(*) FROM orders WHERE status = 'new' OR handled_at IS NULL")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unhandled, 0);
    // The jobs that took more than one run, and why: what puts an order out of its place.
    let again: Vec<(u64, String, u32, Option<String>)> = conn
        .query(
            "SELECT id, payload, attempts, last_error FROM myjob_jobs WHERE attempts > 1 \
             ORDER BY id",
        )
        .await
        .unwrap();
    eprintln!("jobs run more than once: {again:?}");
    // Arrival order: by product, the orders in the order they were handled have rising ids,
    // and the first ten of them were sold.
    let handled: Vec<(i32, u64, String)> = conn
        .query("SELECT product, id, status FROM orders ORDER BY product, handled_at, id")
        .await
        .unwrap();
    for product in 1..=10 {
        let mine: Vec<&(i32, u64, String)> = handled.iter().filter(|h| h.0 == product).collect();
        let ids: Vec<u64> = mine.iter().map(|h| h.1).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(
            ids, sorted,
            "product {product}: orders handled out of order"
        );
        assert!(
            mine[..10].iter().all(|h| h.2 == "sold"),
            "product {product}: an early order was not sold"
        );
    }
}

/// A reload that lowers key_limit from 3 to 1 while two long jobs (3 s) hold slots 2 and 3
/// and short ones (0.1 s) follow each other in slot 1: from the reload on, no job of the key
/// starts while another runs (slot 1 is not handed on while the key holds two others), and
/// the rest run one at a time once the long ones end.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_lowers_key_limit_drains_down_to_it() {
    let db = TestDb::new("key_limit_reload").await;
    // The payload says how long: `k0 <seconds>`.
    let handler = db.script(
        "timed.sh",
        &KEYED
            .replace("key=$(cat)", "read key secs")
            .replace("SLEEP", "$secs"),
    );
    let queue = |limit: u32| {
        format!(
            "\n[[queue]]\nname = \"keyed\"\ncommand = [\"{}\"]\nkey_limit = {limit}\n",
            handler.display()
        )
    };
    let config = db.config("concurrency = 4", &queue(3));
    let mut conn = db.conn().await;
    // Admitted in arrival order into slots 1, 2, 3: the second and third are the long ones.
    let secs = |i: usize| if i == 1 || i == 2 { "3" } else { "0.1" };
    let values: Vec<String> = (0..20)
        .map(|i| format!("('keyed', 'k0 {}', 'k0')", secs(i)))
        .collect();
    conn.query_drop(format!(
        "INSERT INTO myjob_jobs (queue, payload, concurrency_key) VALUES {}",
        values.join(", ")
    ))
    .await
    .unwrap();
    let w = Worker::start(&config, "1");
    db.wait_at_least("status = 'done'", 3, 30).await;
    db.config("concurrency = 4", &queue(1));
    w.signal(nix::sys::signal::Signal::SIGHUP);
    w.wait_log("reload: new configuration in use", 10).await;
    let reloaded = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    db.wait_count("status = 'done'", 20, 60).await;
    let events = trace(&db);
    let (before, _) = most_at_once(&events);
    assert_eq!(
        before.get("k0"),
        Some(&3),
        "three at once before the reload"
    );
    // Every start seen after the reload (a margin for one admitted just before it) finds no
    // other job of the key running.
    let mut running = 0usize;
    let mut starts = 0;
    for e in &events {
        if !e.start {
            running = running.saturating_sub(1);
            continue;
        }
        if e.at > reloaded + 50_000_000 {
            starts += 1;
            assert_eq!(
                running, 0,
                "job {} started beside {running} others after the reload",
                e.job
            );
        }
        running += 1;
    }
    eprintln!("{starts} starts after the reload, each alone");
    assert!(starts >= 6, "too few jobs ran after the reload");
}

/// A config whose queue `keyed` runs a handler that ignores SIGTERM, writes its pid to
/// `pid-<job id>` and sleeps 30 s; `kill_grace` as given.
fn stubborn_config(db: &TestDb, kill_grace: &str) -> std::path::PathBuf {
    let handler = db.script(
        "stubborn.sh",
        "#!/bin/sh\ntrap '' TERM\necho $$ > DIR/pid-$MYJOB_JOB_ID\nsleep 30\n",
    );
    db.config(
        &format!("concurrency = 4\nkill_grace = \"{kill_grace}\""),
        &format!(
            "\n[[queue]]\nname = \"keyed\"\ncommand = [\"{}\"]\n",
            handler.display()
        ),
    )
}

/// A running job of a key that an operator cancels keeps its slot until its handler has
/// stopped: one that ignores SIGTERM lives through `kill_grace` before its SIGKILL, and the
/// key's next job stays blocked all that time; then it runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_running_job_keeps_its_slot_until_its_handler_stops() {
    let db = TestDb::new("key_cancel").await;
    let config = stubborn_config(&db, "2s");
    db.insert_keyed(2, 1).await;
    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 1, 30).await;
    let mut conn = db.conn().await;
    let ids: Vec<u64> = conn
        .query("SELECT id FROM myjob_jobs ORDER BY id")
        .await
        .unwrap();
    let pid_file = db.path(&format!("pid-{}", ids[0]));
    while !pid_file.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    common::cancel(&config, ids[0]);
    let asked = std::time::Instant::now();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
    };
    while alive() {
        let next = db.job(ids[1]).await.0;
        // Read while the handler lived only if it still lives: it may have died (and the
        // worker freed its slot) between the check above and the read.
        if !alive() {
            break;
        }
        assert_eq!(
            next, "blocked",
            "the key's next job left the line while the cancelled one's handler lived"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "the handler lived on"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the cancelled handler lived {:?} after the cancel",
        asked.elapsed()
    );
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "killed before its grace"
    );
    db.wait_count(&format!("id = {} AND status = 'claimed'", ids[1]), 1, 10)
        .await;
}

/// The worker of a job cancelled while it ran dies (kill -9) before it could say the handler
/// stopped: the reaper of another instance finds the worker gone and frees the slot, and
/// the key's next job runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_job_whose_worker_died_frees_its_slot() {
    let db = TestDb::new("key_cancel_dead").await;
    let config = stubborn_config(&db, "5s");
    db.insert_keyed(2, 1).await;
    let mut first = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 1, 30).await;
    let mut conn = db.conn().await;
    let ids: Vec<u64> = conn
        .query("SELECT id FROM myjob_jobs ORDER BY id")
        .await
        .unwrap();
    common::cancel(&config, ids[0]);
    first.signal(nix::sys::signal::Signal::SIGKILL);
    first.wait(10);
    assert_eq!(db.job(ids[1]).await.0, "blocked");
    // stale_after is 2 s, two reaper passes of 500 ms.
    let _second = Worker::start(&config, "2");
    db.wait_count(&format!("id = {} AND status = 'claimed'", ids[1]), 1, 20)
        .await;
    let owner: Option<u64> = conn
        .exec_first("SELECT owner_conn FROM myjob_jobs WHERE id = ?", (ids[0],))
        .await
        .unwrap()
        .flatten();
    assert_eq!(owner, None, "the dead worker's cancelled claim was cleared");
}

/// A keyed job cancelled while it waits claimed ahead of its start (in the prefetch, behind a
/// slow job in the instance's one slot) gives its slot up at once: the key's next job is
/// admitted while the slow job still runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_job_cancelled_in_the_prefetch_frees_its_slot() {
    let db = TestDb::new("key_cancel_prefetch").await;
    let config = db.config("concurrency = 1", "");
    std::fs::write(db.path("slow"), b"").unwrap();
    // Quick jobs first, for a completion rate that makes the instance claim ahead; then the
    // slow one; then the key's two jobs, run last.
    db.insert_rows("(queue, payload)", "('q', 'x')", 300).await;
    db.insert_sql(
        "INSERT INTO myjob_jobs (queue, payload, priority) VALUES ('q', 'slow-if-flag', -1)",
    )
    .await;
    let first = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, priority, concurrency_key) VALUES ('q', 'x', -2, 'k0')",
        )
        .await;
    let second = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, priority, concurrency_key) VALUES ('q', 'x', -2, 'k0')",
        )
        .await;
    let _w = Worker::start(&config, "1");
    db.wait_count("payload = 'slow-if-flag' AND status = 'claimed'", 1, 60)
        .await;
    db.wait_count(&format!("id = {first} AND status = 'claimed'"), 1, 10)
        .await;
    common::cancel(&config, first);
    // The worker sees the cancel within a second, and its write frees the slot.
    db.wait_count(
        &format!("id = {second} AND status IN ('pending', 'claimed')"),
        1,
        10,
    )
    .await;
    assert_eq!(
        db.count("payload = 'slow-if-flag' AND status = 'claimed'")
            .await,
        1
    );
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count(&format!("id = {second} AND status = 'done'"), 1, 30)
        .await;
}

/// While the consumer's probe sees blocked jobs at every poll (a key whose one slot a long
/// job holds), and wakes the gate each time, the stager still stages: a delayed job of
/// another queue comes due and runs.
#[tokio::test(flavor = "multi_thread")]
async fn blocked_jobs_that_wake_the_gate_do_not_hold_up_staging() {
    let db = TestDb::new("key_wakes").await;
    let config = keyed_config(&db, "concurrency = 4", "10", "");
    db.insert_keyed(2, 1).await;
    let _w = Worker::start(&config, "1");
    db.wait_count("queue = 'keyed' AND status = 'claimed'", 1, 30)
        .await;
    let delayed = db
        .insert_sql("INSERT INTO myjob_jobs (queue, payload, run_at) VALUES ('q', 'x', NOW(6) + INTERVAL 1 SECOND)")
        .await;
    assert_eq!(db.job(delayed).await.0, "scheduled");
    db.wait_count(&format!("id = {delayed} AND status = 'done'"), 1, 6)
        .await;
    assert_eq!(db.count("queue = 'keyed' AND status = 'blocked'").await, 1);
}
