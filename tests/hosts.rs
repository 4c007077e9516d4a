//! The fault harness's hosts (see `common::hosts`): instances on machines of their own, one
//! of them cut off from the network without a reset, alive (a partition) or dead (a host that
//! lost its power). Its claims come back within the bound docs/servers.md states ("A host cut
//! off"), and no job runs again while its first run is alive.
//!
//! These need root and network namespaces: `tests/run` runs them with `--ignored`.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::hosts::Host;
use crate::common::{edited, kill_recorded_handlers, TestDb, Worker};

/// The test's config on a host: the database through `url`, lock waits of 1 s (a
/// statement's limit and the fence are then 6 s, the session's wait_timeout 42 s).
fn config_on(db: &TestDb, url: &str, name: &str) -> std::path::PathBuf {
    let base = db.config_with_lock_wait("concurrency = 2", "1s");
    let path = db.path(name);
    edited(&base, &path, &[(db.url.as_str(), url)]);
    path
}

/// The most a cut-off host's claims may take to come back with this config: the session's
/// wait_timeout (42 s), then two reaper passes (0.5 s apart), and the slack of a loaded CI.
const BOUND: Duration = Duration::from_secs(75);

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
}

/// Starts `jobs` long jobs on an instance of `host`, and returns it with the pids of their
/// handlers.
async fn running_on(db: &TestDb, host: &Host, url: &str, jobs: usize) -> (Worker, Vec<i32>) {
    std::fs::write(db.path("slow"), "").unwrap();
    let config = config_on(db, url, "cut.toml");
    let a = Worker::start_on(host, &config, "1", &db.path("worker-a.log"));
    db.insert("q", &vec!["slow-if-flag"; jobs]).await;
    let start = Instant::now();
    while db.runs().len() < jobs {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the jobs never started on the host: {}",
            a.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pids = db.runs().iter().map(|r| r.3 as i32).collect();
    (a, pids)
}

/// A partition: host 1 is cut off while its instance runs two long jobs; an instance on host
/// 2 serves the same queue. The cut-off instance kills its handlers once the server has not
/// answered for its fence; the server drops its silent connections after the session's
/// wait_timeout, and host 2's reaper puts the jobs back: they run there, each only after its
/// first run died. When the network heals, the cut-off instance reconnects and its late
/// releases change nothing.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn a_partitioned_host_kills_its_handlers_before_its_jobs_run_elsewhere() {
    let db = TestDb::new("host_partition").await;
    let (cut, cut_url) = Host::reaching(1, "host-one", &db.url).await;
    let (other, other_url) = Host::reaching(2, "host-two", &db.url).await;
    let (a, first) = running_on(&db, &cut, &cut_url, 2).await;
    let b_config = config_on(&db, &other_url, "other.toml");
    let b = Worker::start_on(&other, &b_config, "1", &db.path("worker-b.log"));
    b.wait_log("consumer: connected", 20).await;

    let cut_at = Instant::now();
    cut.cut();
    a.wait_log("consumer: no answer from the database", 40)
        .await;
    let fenced = cut_at.elapsed();
    let start = Instant::now();
    while first.iter().any(|&pid| alive(pid)) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the handlers outlived the fence"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dead = cut_at.elapsed();
    assert_eq!(db.runs().len(), 2, "ran again while the first runs lived");
    std::fs::remove_file(db.path("slow")).unwrap();

    db.wait_count("status = 'done'", 2, BOUND.as_secs()).await;
    let elsewhere = cut_at.elapsed();
    let runs = db.runs();
    assert_eq!(runs.len(), 4, "{runs:?}");
    // Done on host two, under its name (hostname/machine id).
    assert_eq!(db.count("worker LIKE 'host-two/%'").await, 2, "{runs:?}");
    assert!(
        b.log_text().contains("reaper: stale claim put back"),
        "{}",
        b.log_text()
    );
    eprintln!(
        "partition: fenced after {:.1} s, handlers dead after {:.1} s, jobs done on another host after {:.1} s",
        fenced.as_secs_f64(),
        dead.as_secs_f64(),
        elsewhere.as_secs_f64()
    );

    // Healed: the cut-off instance reconnects; its releases are fenced out.
    cut.heal();
    let start = Instant::now();
    while a.log_text().matches("consumer: connected").count() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}",
            a.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(db.count("status = 'done' AND attempts = 1").await, 2);
    assert_eq!(db.runs().len(), 4);
}

/// A host that vanished: host 3 loses its power while its instance runs two long jobs (cut
/// off, and every process on it killed: nothing says goodbye to the server). An instance on
/// host 4 runs them once the server has dropped the dead host's connections.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn a_vanished_hosts_claims_come_back_within_the_bound() {
    let db = TestDb::new("host_vanished").await;
    let (gone, gone_url) = Host::reaching(3, "host-three", &db.url).await;
    let (other, other_url) = Host::reaching(4, "host-four", &db.url).await;
    let (mut a, _) = running_on(&db, &gone, &gone_url, 2).await;
    let b_config = config_on(&db, &other_url, "other.toml");
    let b = Worker::start_on(&other, &b_config, "1", &db.path("worker-b.log"));
    b.wait_log("consumer: connected", 20).await;

    let cut_at = Instant::now();
    gone.cut();
    a.signal(nix::sys::signal::Signal::SIGKILL);
    a.wait(10);
    kill_recorded_handlers(&db, "1");
    std::fs::remove_file(db.path("slow")).unwrap();

    db.wait_count("status = 'done'", 2, BOUND.as_secs()).await;
    let back = cut_at.elapsed();
    let runs = db.runs();
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert!(
        b.log_text().contains("reaper: stale claim put back"),
        "{}",
        b.log_text()
    );
    // Claimed on host 4 under its own name (hostname/machine id).
    assert_eq!(db.count("worker LIKE 'host-four/%'").await, 2);
    eprintln!(
        "vanished host: its jobs done on another host after {:.1} s",
        back.as_secs_f64()
    );
}

/// Recurring jobs across hosts: an instance on each of hosts 5 and 6 and one here serve a
/// schedule ticking every second (on a cluster, each through another node). The host that
/// enqueued the latest tick is cut off for 6 s: the others go on, each tick once; healed,
/// the cut-off instance's late passes enqueue no tick a second time.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn a_schedule_ticks_once_across_hosts_through_a_partition() {
    let db = TestDb::new("host_schedule").await;
    let base = db.config(
        "concurrency = 2",
        "\n[[schedule]]\nname = \"tick\"\nqueue = \"q\"\npayload = \"x\"\nevery = \"1s\"\n",
    );
    let mut hosts = Vec::new();
    let mut workers = Vec::new();
    for (i, n, name) in [(1, 5, "host-five"), (2, 6, "host-six")] {
        let (host, url) = Host::reaching(n, name, &db.node_url(i)).await;
        let config = db.path(&format!("{name}.toml"));
        edited(&base, &config, &[(db.url.as_str(), url.as_str())]);
        let log = db.path(&format!("{name}.log"));
        workers.push(Worker::start_on(&host, &config, "1", &log));
        hosts.push(host);
    }
    let _here = Worker::start(&base, "1");
    db.wait_at_least("queue = 'q'", 1, 30).await;
    tokio::time::sleep(Duration::from_secs(6)).await;

    // The host whose instance enqueued (or ran) the latest tick of the two. On a loaded
    // cluster the hosts' instances can take a while to be seen, and the one here takes
    // every tick meanwhile: wait up to 30 s more for one of theirs.
    let enqueued = |w: &Worker, job: Option<u64>| {
        job.is_some_and(|job| w.log_text().contains(&format!("job_id={job} ")))
    };
    let waited = Instant::now();
    let cut = loop {
        let rows = common::ticks::rows(&db, "tick").await;
        let found = rows
            .iter()
            .rev()
            .find_map(|(_, job)| workers.iter().position(|w| enqueued(w, *job)));
        match found {
            Some(cut) => break cut,
            None if waited.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            None => panic!("neither host enqueued or ran a tick in 36 s"),
        }
    };
    let before = common::ticks::assert_each_once(&db, "tick", 1, "q").await;
    hosts[cut].cut();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = common::ticks::assert_each_once(&db, "tick", 1, "q").await;
    let more = during.len() - before.len();
    eprintln!(
        "{more} ticks in the 6 s host {} was cut off",
        hosts[cut].hostname
    );
    assert!((5..=8).contains(&more), "{more} ticks in 6 s");

    hosts[cut].heal();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let after = common::ticks::assert_each_once(&db, "tick", 1, "q").await;
    eprintln!(
        "{} ticks in the 15 s after the heal",
        after.len() - during.len()
    );
    assert!(after.len() - during.len() >= 14);
}
