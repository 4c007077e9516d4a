//! On a Galera cluster: the claims made through a node that dies come back through the other
//! nodes, write conflicts between nodes cost no reconnect, and `myjob lock`'s leases exclude
//! holders on different nodes. `MYJOB_TEST_NODES` names the cluster's nodes (tests/run sets it
//! for the cluster of tests/db-server.sh). A test kills a node, so plain `cargo test` skips
//! them; tests/run runs them with `--ignored --test-threads=1` (one test kills a node the other
//! needs), with no other test on the cluster.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{edited, TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

fn db_server(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/db-server.sh");
    let status = std::process::Command::new(script)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "tests/db-server.sh {args:?} failed");
}

/// Instance `n + 1` through node `nodes[n]`, each with `config` pointed at its node.
fn start_on_nodes(db: &TestDb, config: &Path, nodes: &[usize]) -> Vec<Worker> {
    nodes
        .iter()
        .enumerate()
        .map(|(n, &node)| {
            let on_node = db.path(&format!("worker{n}.toml"));
            edited(
                config,
                &on_node,
                &[(db.url.as_str(), db.node_url(node).as_str())],
            );
            Worker::start(&on_node, &(n + 1).to_string())
        })
        .collect()
}

/// A node dies with the instance that worked through it (a host lost whole). An instance on
/// another node puts its claims back once the dead node has left the cluster and its
/// heartbeat is stale, and runs them; nothing is left claimed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "kills a node of the Galera cluster: run through tests/run"]
async fn claims_made_through_a_node_that_dies_come_back() {
    assert_eq!(
        common::nodes().len(),
        3,
        "MYJOB_TEST_NODES names the cluster's three nodes"
    );
    // The test's own connections go through node 1.
    let db = TestDb::new("galera_node").await;
    let config = db.config("concurrency = 2", "");
    let on_node_3 = db.path("node3.toml");
    edited(
        &config,
        &on_node_3,
        &[(db.url.as_str(), db.node_url(2).as_str())],
    );

    std::fs::write(db.path("slow"), "").unwrap();
    let ids = db.insert("q", &["slow-if-flag", "slow-if-flag"]).await;
    let mut third = Worker::start(&on_node_3, "3");
    db.wait_count("status = 'claimed'", 2, 20).await;
    let owners: Vec<(String, u64)> = db
        .conn()
        .await
        .query("SELECT DISTINCT owner_server, batch_id FROM myjob_jobs WHERE status = 'claimed'")
        .await
        .unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let (owner, batch) = owners[0].clone();
    assert!(
        owner.contains(":3313/") && owner.contains("/galera:"),
        "claimed through node 3, with its member id: {owner}"
    );

    third.signal(Signal::SIGKILL);
    third.wait(10);
    db_server(&["kill", "galera", "3"]);
    let died = Instant::now();

    let first = Worker::start(&config, "1");
    first
        .wait_log("its Galera node has left the cluster", 30)
        .await;
    assert!(
        died.elapsed() >= Duration::from_secs(2),
        "put back before stale_after"
    );
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count("status = 'done'", 2, 30).await;
    for id in ids {
        let (status, attempts, new_batch, ..) = db.job(id).await;
        assert_eq!(status, "done");
        // The attempt cut short by the node's death was given back.
        assert_eq!(attempts, 1, "job {id}");
        assert_ne!(new_batch, Some(batch), "job {id} ran under a new claim");
    }
    let log = first.log_text();
    assert_eq!(
        log.matches("stale claim put back").count(),
        2,
        "each claim put back once:\n{log}"
    );
    drop(first);
    // The cluster whole again, for whatever runs next.
    db_server(&["up", "galera"]);
}

/// The instance that worked through node 3 is killed, and no instance connects through node 3
/// any more, while the node stays a member of the cluster: no reaper there will judge its
/// claims. A reaper on another node puts them back once node 3 has been silent for longer
/// than a consumer's session wait_timeout (42 s with lock waits of 1 s and stale_after 2 s),
/// by when node 3 has dropped the connection of any instance that was only stalled.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Galera cluster: run through tests/run"]
async fn claims_of_a_member_node_that_no_instance_uses_come_back() {
    let db = TestDb::new("galera_member").await;
    let config = db.config_with_lock_wait("concurrency = 2", "1s");
    let on_node_3 = db.path("node3.toml");
    edited(
        &config,
        &on_node_3,
        &[(db.url.as_str(), db.node_url(2).as_str())],
    );
    std::fs::write(db.path("slow"), "").unwrap();
    let ids = db.insert("q", &["slow-if-flag", "slow-if-flag"]).await;
    let mut third = Worker::start(&on_node_3, "3");
    db.wait_count("status = 'claimed'", 2, 20).await;
    third.signal(Signal::SIGKILL);
    third.wait(10);
    common::kill_recorded_handlers(&db, "3");

    let killed = Instant::now();
    let first = Worker::start(&config, "1");
    first.wait_log("stale claim put back", 90).await;
    assert!(
        killed.elapsed() >= Duration::from_secs(42),
        "put back {:?} after the kill",
        killed.elapsed()
    );
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count("status = 'done'", 2, 30).await;
    for id in ids {
        assert_eq!(
            db.job(id).await.1,
            1,
            "job {id}: the cut attempt given back"
        );
    }
    let log = first.log_text();
    assert!(log.contains("has had no heartbeat"), "{log}");
}

/// One instance per node, all on one queue: claims and outcomes written through different
/// nodes conflict at commit, which Galera reports as a deadlock (1213). Each conflict is
/// tried again on the same connection: every job is done once, and no instance reconnects.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Galera cluster: run through tests/run"]
async fn write_conflicts_between_nodes_cost_no_reconnect() {
    assert_eq!(
        common::nodes().len(),
        3,
        "MYJOB_TEST_NODES names three nodes"
    );
    let db = TestDb::new("galera_conflicts").await;
    let config = db.config("concurrency = 4\nbatch_size = 20", "");
    db.insert_rows("(queue, payload)", "('q', 'quick')", 2000)
        .await;
    let workers = start_on_nodes(&db, &config, &[0, 1, 2]);
    db.wait_count("status = 'done'", 2000, 120).await;
    assert_eq!(db.count("attempts <> 1").await, 0, "each job ran once");
    let mut conflicts = 0;
    for w in &workers {
        let log = w.log_text();
        assert!(!log.contains("reconnecting"), "{log}");
        assert_eq!(log.matches("consumer: connected").count(), 1, "{log}");
        conflicts += log.matches("trying again on the same connection").count();
    }
    println!("galera: 2000 jobs on three nodes, {conflicts} conflicts tried again, no reconnect");
}

/// Four instances over the three nodes (two through the first), all on one queue: each
/// instance that claimed from the queue says so (myjob_lanes), and takes first the jobs of
/// its lane, those whose `CRC32(id) % 4` is its place among the instances. Without lanes every
/// instance claims from the same head, and about a quarter of the jobs would fall to their
/// lane's instance by chance.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Galera cluster: run through tests/run"]
async fn nodes_claim_their_own_lanes_of_a_queue() {
    const JOBS: u64 = 4000;
    let db = TestDb::new("galera_lanes").await;
    let config = db.config("concurrency = 8", "");
    let workers = start_on_nodes(&db, &config, &[0, 1, 2, 0]);
    let mut conn = db.conn().await;
    let warm = settle_lanes(&db, &mut conn, 200, 4).await;
    let first: u64 = conn
        .query_first("SELECT MAX(id) FROM myjob_jobs")
        .await
        .unwrap()
        .unwrap();
    let warm_logs: Vec<usize> = workers.iter().map(|w| w.log_text().len()).collect();
    let before = conflicts_on_nodes(&db).await;
    db.insert_rows("(queue, payload)", "('q', 'quick')", JOBS as usize)
        .await;
    db.wait_count("status = 'done'", warm + JOBS, 180).await;
    let on_nodes = conflicts_on_nodes(&db).await - before;
    assert_eq!(db.count("attempts <> 1").await, 0, "each job ran once");
    // Every lane seen in the last minute: the instances stop stamping as the queue drains.
    let (in_lane, claimed) = in_lanes(&mut conn, first, 4, 60).await;
    assert_eq!(claimed, JOBS);
    let mut conflicts = 0;
    for (w, from) in workers.iter().zip(warm_logs) {
        for line in w.log_text()[from..].lines() {
            if line.contains("trying again on the same connection") {
                conflicts += 1;
                println!("{line}");
            }
        }
    }
    println!("galera: {JOBS} jobs, 4 instances over 3 nodes: {in_lane} claimed in their lane, {conflicts} conflicts tried again, {on_nodes} on the nodes");
    assert!(
        in_lane >= JOBS * 8 / 10,
        "{in_lane} of {JOBS} jobs claimed by their lane's instance"
    );
    // A lane's claim that walked the claim index kept its lock on each row of the other
    // lanes it passed, and a node applying another node's claim of one aborted it: 8 to 16
    // conflicts per 1,000 jobs. Read first and claimed by primary key, a lane locks only its
    // own jobs.
    assert!(
        on_nodes <= JOBS * 4 / 1000,
        "{on_nodes} conflicts on the nodes for {JOBS} jobs"
    );
    // Instances with nothing to claim say nothing: their lanes lapse, and a later claim
    // starts from the whole head.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let fresh: Option<u64> = conn
        .query_first("SELECT COUNT(*) FROM myjob_lanes WHERE seen_at >= NOW(6) - INTERVAL 6 SECOND")
        .await
        .unwrap();
    assert_eq!(fresh, Some(0), "idle instances still stamp their lanes");
}

/// A lane whose instance is slow does not hold up the others: its instance (one slot, one
/// second a job) keeps claiming, so it stays one of the lanes, and its backlog fills the
/// head that the other lane reads. The quick instance takes the slow lane's jobs that have
/// waited, from the end of what it read; before, behind a head longer than what it read it
/// took its own jobs only, found none, and the slow lane's jobs ran one a second.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Galera cluster: run through tests/run"]
async fn a_slow_lane_does_not_hold_up_the_queue() {
    const JOBS: u64 = 300;
    let db = TestDb::new("galera_slow_lane").await;
    let quick = db.config("concurrency = 8", "");
    let slow = db.path("slow.toml");
    edited(&quick, &slow, &[("concurrency = 8", "concurrency = 1")]);
    let _quick = start_on_nodes(&db, &quick, &[0]);
    let on_node_1 = db.path("slow-on-node.toml");
    edited(
        &slow,
        &on_node_1,
        &[(db.url.as_str(), db.node_url(1).as_str())],
    );
    // Instance 2 is the slow one, through the second node.
    let _slow = Worker::start(&on_node_1, "2");
    let mut conn = db.conn().await;
    let warm = settle_lanes(&db, &mut conn, 50, 2).await;
    db.insert_rows("(queue, payload)", "('q', 'slow-on:2')", JOBS as usize)
        .await;
    // The slow lane's half alone would take 150 s: one a second.
    let began = Instant::now();
    db.wait_count("status = 'done'", warm + JOBS, 40).await;
    let by: Vec<(String, u64)> = conn
        .query("SELECT worker, COUNT(*) FROM myjob_jobs WHERE payload LIKE 'slow%' GROUP BY worker")
        .await
        .unwrap();
    println!(
        "galera: {JOBS} jobs, half of them slow on one instance, done in {:?}: {by:?}",
        began.elapsed()
    );
    assert_eq!(db.count("attempts <> 1").await, 0, "each job ran once");
}

/// `myjob lock` on a Galera cluster, whose named locks hold on one node only, holds a lease
/// row instead: holders on the three nodes take turns; a holder whose node dies stops its
/// command and exits 75, and a waiter on another node gets the lock only once the lease has
/// run out, after the command is dead.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "kills a node of the Galera cluster: run through tests/run"]
async fn lock_leases_exclude_holders_on_every_node() {
    let db = TestDb::new("galera_lock").await;
    let config = db.config("", "");
    let on_node: Vec<std::path::PathBuf> = (0..3)
        .map(|i| {
            let path = db.path(&format!("node{}.toml", i + 1));
            edited(
                &config,
                &path,
                &[(db.url.as_str(), db.node_url(i).as_str())],
            );
            path
        })
        .collect();
    let lock = |node: usize, args: &[&str]| {
        std::process::Command::new(common::bin())
            .args(["--config", on_node[node].to_str().unwrap(), "lock"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };

    // Each holder writes start, waits, writes end: with the lock, no two starts in a row.
    let log = db.path("log");
    let script = format!(
        "echo start >> {l}; sleep 1; echo end >> {l}",
        l = log.display()
    );
    let holders: Vec<_> = (0..3)
        .map(|node| lock(node, &["turns", "--wait", "60s", "--", "sh", "-c", &script]))
        .collect();
    for h in holders {
        let out = h.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, "start\nend\n".repeat(3), "interleaved:\n{text}");

    // A holder on node 3, with a command that ignores SIGTERM; its node dies.
    let pidfile = db.path("pid");
    let script = format!("trap '' TERM; echo $$ > {}; sleep 120", pidfile.display());
    let holder = lock(
        2,
        &["dies", "--kill-grace", "1s", "--", "sh", "-c", &script],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let command: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "the holder's command never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    db_server(&["kill", "galera", "3"]);
    let died = Instant::now();
    let got = db.path("got");
    let waiter = lock(
        1,
        &[
            "dies",
            "--wait",
            "60s",
            "--",
            "sh",
            "-c",
            &format!("touch {}", got.display()),
        ],
    );
    let out = holder.wait_with_output().unwrap();
    let stopped = died.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("lock dies: its lease could not be renewed"),
        "{err}"
    );
    assert!(err.contains("so the command was stopped"), "{err}");
    assert!(
        std::fs::read_to_string(format!("/proc/{command}/stat")).is_err(),
        "the command outlived its lock"
    );
    assert!(
        !got.exists(),
        "the waiter got the lock while the holder ran"
    );
    let out = waiter.wait_with_output().unwrap();
    let acquired = died.elapsed();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(got.exists());
    // The lease: 15 s plus the grace of 1 s from the last renewal, at most a second before
    // the node died; the holder stopped at once (its renewal failed) and SIGKILLed 1 s later.
    assert!(
        stopped < Duration::from_secs(10),
        "stopped after {stopped:?}"
    );
    assert!(
        acquired >= Duration::from_secs(14),
        "taken over after {acquired:?}"
    );
    // The cluster whole again, for whatever runs next.
    db_server(&["up", "galera"]);
}

/// Reads through one node see what was committed through another a moment before: the schema
/// check of a worker started right after a `myjob migrate` through another node, and an
/// operator's read of a job just enqueued elsewhere. Node 2 is held behind by FLUSH TABLES
/// WITH READ LOCK, which pauses its applier, so a read there that does not wait for the
/// cluster certainly misses both commits: the race, made certain rather than left to luck.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Galera cluster: run through tests/run"]
async fn reads_see_commits_made_through_another_node() {
    let db = TestDb::new("galera_causal").await;
    let config = db.config("", "");
    let on_node_2 = db.path("node2.toml");
    edited(
        &config,
        &on_node_2,
        &[(db.url.as_str(), db.node_url(1).as_str())],
    );
    let node_2 = || async {
        mysql_async::Conn::new(mysql_async::Opts::from_url(&db.node_url(1)).unwrap())
            .await
            .unwrap()
    };
    let version = |sync: bool| async move {
        let mut conn = node_2().await;
        conn.query_drop(format!("SET SESSION wsrep_sync_wait = {}", sync as u8))
            .await
            .unwrap();
        let v: Option<u32> = conn
            .query_first("SELECT MAX(version) FROM myjob_schema_migrations")
            .await
            .unwrap();
        v.unwrap()
    };
    // The last migration taken back, on every node: the schema is one version behind.
    let latest = myjob::store::schema::latest();
    db.conn()
        .await
        .exec_drop(
            "DELETE FROM myjob_schema_migrations WHERE version = ?",
            (latest,),
        )
        .await
        .unwrap();
    assert_eq!(version(true).await, latest - 1);

    // Node 2 held behind; through node 1, the migrate finishes and a job is enqueued.
    let mut paused = node_2().await;
    paused
        .query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .unwrap();
    db.conn()
        .await
        .exec_drop(
            "INSERT INTO myjob_schema_migrations (version, name) VALUES (?, 'again')",
            (latest,),
        )
        .await
        .unwrap();
    let id = db.insert("q", &["enqueued through node 1"]).await[0];
    assert_eq!(version(false).await, latest - 1, "node 2 is not behind");

    // A worker and an operator's read through node 2, both started while it is behind.
    let mut worker = Worker::start(&on_node_2, "1");
    let show = std::process::Command::new(common::bin())
        .args(["--config", on_node_2.to_str().unwrap(), "show"])
        .arg(id.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !worker.exited(),
        "the worker read a schema that was already migrated as behind:\n{}",
        worker.log_text()
    );
    paused.query_drop("UNLOCK TABLES").await.unwrap();

    let out = show.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("id:") && stdout.contains("queue:"),
        "{stdout}"
    );
    worker.wait_log("ready", 30).await;
    db.wait_count("status = 'done'", 1, 30).await;
}

/// The exactly-once recipe in a handler whose database is another node than its worker's
/// (an application that reaches the cluster through any node). The worker claims the job
/// through node 1; node 2, where the handler works, has not applied the claim yet: held by
/// FLUSH TABLES WITH READ LOCK until the handler has seen the job missing there, then busy
/// applying a large UPDATE that came before the job. A recipe that did not wait for the
/// cluster would find the job not its run's, sell nothing, and exit 0, and the job would be
/// taken for done. The recipe's BEGIN waits for node 2 to catch up, and places the order
/// once.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Galera cluster: run through tests/run"]
async fn the_recipe_through_a_node_that_lags_places_its_order() {
    assert_eq!(common::nodes().len(), 3, "MYJOB_TEST_NODES names 3 nodes");
    let db = TestDb::new("galera_recipe_lag").await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, \
         item VARCHAR(100) NOT NULL)",
    )
    .await
    .unwrap();
    conn.query_drop("CREATE TABLE filler (n INT PRIMARY KEY, v INT NOT NULL DEFAULT 0)")
        .await
        .unwrap();
    conn.query_drop("INSERT INTO filler (n) SELECT seq FROM seq_1_to_200000")
        .await
        .unwrap();
    let handler = db.script(
        "order.php",
        r#"#!/usr/bin/env php
<?php
require 'EXAMPLES/exactly-once/complete.php';
$u = parse_url(getenv('ORDERS_DB'));
$db = new PDO(
    sprintf('mysql:host=%s;port=%d;dbname=%s', $u['host'], $u['port'], ltrim($u['path'], '/')),
    urldecode($u['user']),
    urldecode($u['pass'] ?? '')
);
$id = (int) getenv('MYJOB_JOB_ID');
$batch = getenv('MYJOB_BATCH_ID');
// What this node has of the job before the recipe, read without waiting for the cluster.
$seen = $db->prepare('SELECT batch_id FROM myjob_jobs WHERE id = ?');
$seen->execute([$id]);
$had = $seen->fetchColumn();
file_put_contents('DIR/seen', $had === false ? 'missing' : ($had === $batch ? 'claimed' : 'other'));
$placed = myjob_complete_in($db, $id, $batch, function (PDO $db) use ($id) {
    $db->prepare('INSERT INTO orders (job_id, item) VALUES (?, ?)')->execute([$id, 'lagged']);
});
file_put_contents('DIR/placed', $placed ? 'true' : 'false');
"#,
    );
    let config = db.path("myjob.toml");
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{url}\"\n\
             [worker]\npoll_interval = \"100ms\"\n\
             [[queue]]\nname = \"orders\"\ncommand = [\"{h}\"]\npass_env = [\"ORDERS_DB\"]\n",
            url = db.url,
            h = handler.display()
        ),
    )
    .unwrap();
    let node_2 = db.node_url(1);
    let mut paused = mysql_async::Conn::new(mysql_async::Opts::from_url(&node_2).unwrap())
        .await
        .unwrap();
    // Node 2 has the tables before it is held.
    paused
        .query_drop("SET SESSION wsrep_sync_wait = 1")
        .await
        .unwrap();
    let rows: u64 = paused
        .query_first("SELECT COUNT(*) FROM filler")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rows, 200_000);
    let worker = Worker::start_with_env(&config, "1", &[("ORDERS_DB", node_2.as_str())]);
    worker.wait_log("ready", 30).await;

    paused
        .query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .unwrap();
    conn.query_drop("UPDATE filler SET v = v + 1")
        .await
        .unwrap();
    let id = db.insert("orders", &["order"]).await[0];
    let began = Instant::now();
    while !db.path("seen").exists() {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the handler never started:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    paused.query_drop("UNLOCK TABLES").await.unwrap();

    db.wait_count("status = 'done'", 1, 60).await;
    assert_eq!(
        std::fs::read_to_string(db.path("seen")).unwrap(),
        "missing",
        "node 2 had the job before the recipe: it did not lag"
    );
    let (status, attempts, _, _, error) = db.job(id).await;
    assert_eq!((status.as_str(), attempts, error), ("done", 1, None));
    let orders: Vec<(u64, String)> = conn.query("SELECT job_id, item FROM orders").await.unwrap();
    assert_eq!(
        orders,
        vec![(id, "lagged".to_string())],
        "{}",
        worker.log_text()
    );
    // The handler says so after its commit, which the job's row showed first.
    let began = Instant::now();
    while !db.path("placed").exists() && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(std::fs::read_to_string(db.path("placed")).unwrap(), "true");
}

/// Rounds of `rows` quick jobs on queue q until `lanes` instances say they claim from it
/// (myjob_lanes) and each has read the others: a round's jobs then go to their lanes. No
/// pause between rounds: an instance that stops claiming stops stamping its lane, and the
/// others drop it a few seconds later, so a test's burst must come while they all claim.
/// A round counts only once it began a refresh (and a margin) after the rows first named
/// every instance: until each instance has read them, one that read the table before the last
/// stamp still claims the whole head, or half of it, and a round can go to the lanes while it
/// happens to take little (a CI run's burst met such an instance: 28 conflicts on the nodes).
/// Returns the jobs run.
async fn settle_lanes(db: &TestDb, conn: &mut mysql_async::Conn, rows: usize, lanes: u32) -> u64 {
    let mut done = 0;
    let mut all_seen: Option<Instant> = None;
    for round in 1.. {
        let began = Instant::now();
        let last: u64 = conn
            .query_first("SELECT COALESCE(MAX(id), 0) FROM myjob_jobs")
            .await
            .unwrap()
            .unwrap();
        db.insert_rows("(queue, payload)", "('q', 'quick')", rows)
            .await;
        done += rows as u64;
        db.wait_count("status = 'done'", done, 60).await;
        let (in_lane, claimed) = in_lanes(conn, last, lanes, 6).await;
        let seen: u64 = conn
            .query_first(
                "SELECT COUNT(*) FROM myjob_lanes \
                 WHERE queue = 'q' AND seen_at >= NOW(6) - INTERVAL 6 SECOND",
            )
            .await
            .unwrap()
            .unwrap();
        if seen != u64::from(lanes) {
            all_seen = None;
        } else if all_seen.is_none() {
            all_seen = Some(Instant::now());
        }
        let read_by_all = all_seen.is_some_and(|t| {
            began >= t + myjob::worker::LANES_REFRESH + Duration::from_millis(500)
        });
        if read_by_all && in_lane * 10 >= claimed * 9 {
            return done;
        }
        assert!(
            round < 40,
            "the {lanes} instances never split the queue: {in_lane} of {claimed} jobs in their lane"
        );
    }
    unreachable!()
}

/// Of queue q's jobs after `id`, how many the instance of their lane claimed, and how many
/// there are, with the `lanes` instances seen claiming in the last `secs` seconds in order of
/// their node and name (as `worker::consumer::lanes` orders them). None in a lane while more or fewer
/// say they claim.
async fn in_lanes(conn: &mut mysql_async::Conn, id: u64, lanes: u32, secs: u32) -> (u64, u64) {
    let seen: Vec<(String, String)> = conn
        .exec(
            "SELECT server, worker FROM myjob_lanes \
             WHERE queue = 'q' AND seen_at >= NOW(6) - INTERVAL ? SECOND ORDER BY server, worker",
            (secs,),
        )
        .await
        .unwrap();
    let by_lane: Vec<(String, String, u32)> = conn
        .exec(
            "SELECT owner_server, worker, CRC32(id) % ? FROM myjob_jobs WHERE id > ?",
            (lanes, id),
        )
        .await
        .unwrap();
    let in_lane = by_lane
        .iter()
        .filter(|(server, worker, lane)| {
            seen.len() == lanes as usize
                && seen.iter().position(|(s, w)| s == server && w == worker) == Some(*lane as usize)
        })
        .count();
    (in_lane as u64, by_lane.len() as u64)
}

/// The certification failures and brute-force aborts of the three nodes so far.
async fn conflicts_on_nodes(db: &TestDb) -> u64 {
    let mut sum = 0;
    for i in 0..3 {
        let url = db.node_url(i);
        let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).unwrap())
            .await
            .unwrap();
        let both: Option<u64> = conn
            .query_first(
                "SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME IN ('WSREP_LOCAL_CERT_FAILURES', 'WSREP_LOCAL_BF_ABORTS')",
            )
            .await
            .unwrap();
        sum += both.expect("a Galera node counts its conflicts");
        conn.disconnect().await.unwrap();
    }
    sum
}
