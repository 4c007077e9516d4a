//! The exactly-once recipe (examples/exactly-once/complete.php) under kill -9: a PHP handler
//! inserts an order and completes its job in one transaction fenced by the batch id. Workers
//! are killed while slow orders are in flight; their orphaned handlers run on, their claims
//! are reaped and the jobs run again elsewhere. Every order must exist exactly once, though
//! some jobs ran twice, and myjob must not take a job its handler completed for a lost claim.
//! Per-job and persistent. Needs `php` with PDO MySQL (tests/run installs php-mysql).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

/// Every 10th order is slow (4 s, more than `stale_after` and two reaper passes), so that a
/// kill -9 leaves it running as an orphan long enough for its claim to be reaped and the job
/// to run again; the others take up to 20 ms.
const HANDLER: &str = r#"#!/usr/bin/env php
<?php
require 'EXAMPLES/exactly-once/complete.php';
$u = parse_url(getenv('ORDERS_DB'));
$db = new PDO(
    sprintf('mysql:host=%s;port=%d;dbname=%s', $u['host'], $u['port'], ltrim($u['path'], '/')),
    urldecode($u['user']),
    urldecode($u['pass'] ?? '')
);
function place(PDO $db, int $id, string $batch, string $item): void
{
    file_put_contents('DIR/runs', "$id " . getenv('MYJOB_INSTANCE') . "\n", FILE_APPEND | LOCK_EX);
    myjob_complete_in($db, $id, $batch, function (PDO $db) use ($id, $item) {
        $db->prepare('INSERT INTO orders (job_id, item) VALUES (?, ?)')->execute([$id, $item]);
        usleep($id % 10 === 0 ? 4000000 : random_int(0, 20000));
    });
}
MAIN
"#;

const PER_JOB: &str = "place($db, (int) getenv('MYJOB_JOB_ID'), getenv('MYJOB_BATCH_ID'), stream_get_contents(STDIN));";

const PERSISTENT: &str = "require 'EXAMPLES/persistent/myjob.php';\n\
    myjob_serve(fn (MyjobJob $job) => place($db, $job->id, $job->batchId, $job->payload));";

const JOBS: u64 = 120;

/// A database with an `orders` table, and a config whose queue `orders` runs [`HANDLER`]
/// with `main` as its body.
async fn setup(tag: &str, main: &str, persistent: bool) -> (TestDb, std::path::PathBuf) {
    let db = TestDb::new(tag).await;
    let mut conn = db.conn().await;
    // No unique key on job_id: only the fencing can keep an order from being placed twice.
    conn.query_drop(
        "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, \
         item VARCHAR(100) NOT NULL)",
    )
    .await
    .unwrap();
    let handler = db.script("order.php", &HANDLER.replace("MAIN", main));
    let config = db.path("myjob.toml");
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{url}\"\n\
             [worker]\nconcurrency = 4\npoll_interval = \"100ms\"\nshutdown_timeout = \"5s\"\n\
             [reaper]\ninterval = \"500ms\"\nstale_after = \"2s\"\n\
             [[queue]]\nname = \"orders\"\ncommand = [\"{h}\"]\npersistent = {persistent}\n\
             pass_env = [\"ORDERS_DB\"]\nbackoff = \"100ms\"\nbackoff_max = \"200ms\"\n",
            url = db.url,
            h = handler.display()
        ),
    )
    .unwrap();
    (db, config)
}

async fn orders_exist_once_under_kill_9(tag: &str, main: &str, persistent: bool) {
    let (db, config) = setup(tag, main, persistent).await;
    let mut conn = db.conn().await;
    let items: Vec<String> = (0..JOBS).map(|i| format!("item {i}")).collect();
    db.insert(
        "orders",
        &items.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;

    let env = [("ORDERS_DB", db.url.as_str())];
    let logs = [db.path("worker-1.log"), db.path("worker-2.log")];
    let mut workers: Vec<Worker> = (0..2)
        .map(|i| spawn_appending(&config, i + 1, &logs[i], &env))
        .collect();

    // Four times: once a slow order is in flight, kill -9 the worker running it (not its
    // handler), and start it again.
    let mut kills = 0;
    let mut killed_slow = Vec::new();
    let began = Instant::now();
    while kills < 4 && began.elapsed() < Duration::from_secs(60) {
        let in_flight = slow_in_flight(&db, &killed_slow).await;
        let Some((job, instance)) = in_flight else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let i = instance - 1;
        workers[i].signal(Signal::SIGKILL);
        workers[i].wait(10);
        kills += 1;
        killed_slow.push(job);
        tokio::time::sleep(Duration::from_millis(300)).await;
        workers[i] = spawn_appending(&config, instance, &logs[i], &env);
    }
    assert_eq!(kills, 4, "no slow order was in flight to kill");
    db.wait_count("status = 'done'", JOBS, 120).await;
    // The orphans of the killed workers end within their 4 s.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let (orders, distinct): (u64, u64) = conn
        .query_first("SELECT COUNT(*), COUNT(DISTINCT job_id) FROM orders")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (orders, distinct),
        (JOBS, JOBS),
        "an order was lost or placed twice"
    );
    let runs = std::fs::read_to_string(db.path("runs")).unwrap();
    let mut per_job: HashMap<&str, u32> = HashMap::new();
    for line in runs.lines() {
        *per_job.entry(line.split(' ').next().unwrap()).or_default() += 1;
    }
    let twice = per_job.values().filter(|&&n| n > 1).count();
    for job in &killed_slow {
        assert!(
            per_job
                .get(job.to_string().as_str())
                .is_some_and(|&n| n > 1),
            "job {job}, orphaned by a kill, did not run again: {runs}"
        );
    }
    assert!(twice >= 4, "{twice} jobs ran twice");
    // myjob recognised the jobs its handler completed: no lost claim reported, none failed.
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(
            !text.contains("its claim was reaped"),
            "a completed job was taken for a lost claim:\n{text}"
        );
    }
    assert_eq!(db.count("status <> 'done'").await, 0);
    drop(workers);
}

fn spawn_appending(config: &Path, instance: usize, log: &Path, env: &[(&str, &str)]) -> Worker {
    Worker::start_appending_with_env(config, &instance.to_string(), log, env)
}

/// A slow order (job id a multiple of 10) that has started and is not done, not one of
/// `skip`, with the instance that runs it.
async fn slow_in_flight(db: &TestDb, skip: &[u64]) -> Option<(u64, usize)> {
    let runs = std::fs::read_to_string(db.path("runs")).unwrap_or_default();
    for line in runs.lines().rev() {
        let mut f = line.split(' ');
        let (Some(id), Some(instance)) = (f.next(), f.next()) else {
            continue;
        };
        let (Ok(id), Ok(instance)) = (id.parse::<u64>(), instance.parse::<usize>()) else {
            continue;
        };
        if id % 10 != 0 || skip.contains(&id) {
            continue;
        }
        if db.count(&format!("id = {id} AND status = 'claimed'")).await == 1 {
            return Some((id, instance));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn per_job_orders_exist_exactly_once_under_kill_9() {
    orders_exist_once_under_kill_9("once_per_job", PER_JOB, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn persistent_orders_exist_exactly_once_under_kill_9() {
    orders_exist_once_under_kill_9("once_persistent", PERSISTENT, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_its_handler_completed_is_not_taken_for_a_lost_claim() {
    // The handler completes its job, then fails: myjob's retry write finds the job done under
    // its own batch, and leaves it so, without a warning.
    let main = format!("{PER_JOB}\nfwrite(STDERR, \"failing after the commit\\n\");\nexit(1);");
    let (db, config) = setup("once_then_fail", &main, false).await;
    let id = db.insert("orders", &["item"]).await[0];
    let env = [("ORDERS_DB", db.url.as_str()), ("MYJOB_LOG", "debug")];
    let w = Worker::start_with_env(&config, "1", &env);
    w.wait_log("its handler finished the job in its own transaction", 30)
        .await;
    let (status, attempts, _, _, error) = db.job(id).await;
    assert_eq!((status.as_str(), attempts, error), ("done", 1, None));
    let log = w.log_text();
    assert!(log.contains("failing after the commit"), "{log}");
    assert!(!log.contains("its claim was reaped"), "{log}");
}

/// The session's `wsrep_sync_wait` as the handler sees it ("none" where the server has no
/// such variable), appended to DIR/sync before and after each call of the recipe.
const SYNC_WAIT: &str = r#"
function sync_wait(PDO $db): string
{
    $row = $db->query("SHOW VARIABLES LIKE 'wsrep_sync_wait'")->fetch(PDO::FETCH_NUM);
    return $row === false ? 'none' : $row[1];
}
function place_noting(PDO $db, int $id, string $batch, string $item): void
{
    $before = sync_wait($db);
    place($db, $id, $batch, $item);
    file_put_contents('DIR/sync', "$before " . sync_wait($db) . "\n", FILE_APPEND | LOCK_EX);
}
"#;

/// A node that lags (Galera) or a busy table can roll the recipe's transaction back for a
/// deadlock several times in a row. A trigger plays it at the recipe's last statement, the
/// job's completion, after the order's INSERT: the first 7 tries of each handler session fail
/// with 1213. The recipe rolls each try back and runs it again, waiting longer each time, and
/// places each order once, in its job's first attempt; the session's `wsrep_sync_wait` is
/// what it was.
async fn the_recipe_outlasts_a_run_of_deadlocks(tag: &str, persistent: bool) {
    let main = if persistent {
        "require 'EXAMPLES/persistent/myjob.php';\n\
         myjob_serve(fn (MyjobJob $job) => place_noting($db, $job->id, $job->batchId, $job->payload));"
    } else {
        "place_noting($db, (int) getenv('MYJOB_JOB_ID'), getenv('MYJOB_BATCH_ID'), stream_get_contents(STDIN));"
    };
    let (db, config) = setup(tag, &format!("{SYNC_WAIT}\n{main}"), persistent).await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "CREATE TRIGGER myjob_jobs_deadlock BEFORE UPDATE ON myjob_jobs FOR EACH ROW \
         BEGIN \
           IF NEW.status = 'done' THEN \
             SET @myjob_test_tries = IFNULL(@myjob_test_tries, 0) + 1; \
             IF @myjob_test_tries <= 7 THEN \
               SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, \
                 MESSAGE_TEXT = 'Deadlock found when trying to get lock; try restarting transaction'; \
             END IF; \
           END IF; \
         END",
    )
    .await
    .unwrap();
    let ids = db.insert("orders", &["item 1"]).await;
    let w = Worker::start_with_env(&config, "1", &[("ORDERS_DB", db.url.as_str())]);
    db.wait_count("status = 'done'", 1, 30).await;
    let (status, attempts, _, _, error) = db.job(ids[0]).await;
    assert_eq!((status.as_str(), attempts, error), ("done", 1, None));
    let orders: Vec<(u64, String)> = conn.query("SELECT job_id, item FROM orders").await.unwrap();
    assert_eq!(orders, vec![(ids[0], "item 1".to_string())]);
    let log = w.log_text();
    assert!(
        log.contains(&format!(
            "job {}: try 7 of 10 lost to a deadlock (1213)",
            ids[0]
        )),
        "{log}"
    );
    // The recipe's own transaction marks the job done; the handler notes the setting just
    // after its commit, so the note can come a moment after the row shows done.
    let sync = noted_sync(&db.path("sync")).await;
    for line in sync.lines() {
        let (before, after) = line.split_once(' ').unwrap();
        assert_eq!(before, after, "wsrep_sync_wait before and after the recipe");
    }
    assert_eq!(sync.lines().count(), 1, "{sync}");
}

/// DIR/sync once the handler has written its line, waiting up to 10 s for it.
async fn noted_sync(path: &Path) -> String {
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the handler noted no wsrep_sync_wait in {} within 10 s",
        path.display()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_per_job_recipe_outlasts_a_run_of_deadlocks() {
    the_recipe_outlasts_a_run_of_deadlocks("deadlocks_per_job", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_recipe_outlasts_a_run_of_deadlocks() {
    the_recipe_outlasts_a_run_of_deadlocks("deadlocks_persistent", true).await;
}
