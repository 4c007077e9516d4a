//! A real Prometheus (Debian 12's 2.42, from `tests/prometheus.sh`) scraping two instances:
//! what it stores and answers through its HTTP API is what docs/monitoring.md's queries read. The
//! counters of both instances add up to the jobs the table shows done, each instance's share
//! to the runs it made; the families carry their HELP and type; the queue gauges come from
//! one leader only, and from the other instance once the leader is killed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{TestDb, Worker};
use nix::sys::signal::Signal;

/// Jobs run per test.
const N: u64 = 200;

/// The gauge that says which instance serves the queue gauges.
const LEADER: &str = "myjob_queue_gauges_leader";

/// A free port of 127.0.0.1 at the time of asking.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A base port whose instances 1 and 2 (base + 1, base + 2) are both free.
fn base_port() -> u16 {
    for _ in 0..100 {
        let first = free_port();
        if first < u16::MAX && port_is_free(first + 1) {
            return first - 1;
        }
    }
    panic!("no two free ports in a row on 127.0.0.1");
}

/// The test's config with `[metrics] listen` on `base` (the tests' configs turn it off).
fn config_with_metrics(db: &TestDb, base: u16) -> PathBuf {
    let text = std::fs::read_to_string(db.config("concurrency = 8", "")).unwrap();
    let listen = format!("listen = \"127.0.0.1:{base}\"");
    assert!(text.contains("listen = \"\""), "{text}");
    let text = text.replace("listen = \"\"", &listen);
    let path = db.path("metrics.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The directory of Debian's `prometheus` and `promtool`, fetched the first time.
fn prometheus_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("tests/prometheus.sh"))
        .arg("dir")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/prometheus.sh");
    assert!(out.status.success(), "tests/prometheus.sh dir: {out:?}");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A running Prometheus, killed when dropped (a failed assert included).
struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("prometheus's log:\n{log}");
        }
    }
}

impl Prometheus {
    /// Starts Prometheus in the test's directory, scraping `targets` (job `myjob`) every
    /// second, and waits until it is ready.
    async fn start(db: &TestDb, targets: &[u16]) -> Prometheus {
        let bin = prometheus_dir().join("prometheus");
        let targets: Vec<String> = targets
            .iter()
            .map(|p| format!("\"127.0.0.1:{p}\""))
            .collect();
        let config = db.path("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: myjob\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let port = free_port();
        let log = db.path("prometheus.log");
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                db.path("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .current_dir(db.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let mut prometheus = Prometheus { child, port, log };
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = http_get(port, "/-/ready") {
                return prometheus;
            }
            let exited = prometheus.child.try_wait().unwrap();
            assert!(exited.is_none(), "prometheus exited: {exited:?}");
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "prometheus not ready within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The API's `data` for `GET /api/v1/<path>` with the query string `params`.
    fn api(&self, path: &str, params: &[(&str, &str)]) -> serde_json::Value {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", common::percent_encode(v)))
            .collect();
        let url = format!("/api/v1/{path}?{}", query.join("&"));
        let (status, body) = http_get(self.port, &url).unwrap();
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {url}: {status} {e}: {body}"));
        assert_eq!(json["status"], "success", "GET {url}: {status} {body}");
        json["data"].clone()
    }

    /// An instant query's vector, one (labels, value) per series.
    fn query(&self, promql: &str) -> Vec<Series> {
        let data = self.api("query", &[("query", promql)]);
        assert_eq!(data["resultType"], "vector", "{promql}: {data}");
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect();
                let value = s["value"][1].as_str().unwrap().parse().unwrap();
                Series { labels, value }
            })
            .collect()
    }

    /// The single value of `promql`, or None when it has no series (Err: more than one).
    fn scalar(&self, promql: &str) -> Result<Option<f64>, String> {
        match self.query(promql).as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.value)),
            more => Err(format!("{promql}: several series: {more:?}")),
        }
    }

    /// What `/api/v1/metadata` says of `metric`: (type, help), under the name itself or, for
    /// an OpenMetrics counter, the name without `_total`.
    fn metadata(&self, metric: &str) -> Option<(String, String)> {
        let names = [metric, metric.strip_suffix("_total").unwrap_or(metric)];
        names.iter().find_map(|name| {
            let data = self.api("metadata", &[("metric", name)]);
            let entry = data.get(*name)?.as_array()?.first()?.clone();
            Some((
                entry["type"].as_str()?.to_owned(),
                entry["help"].as_str()?.to_owned(),
            ))
        })
    }
}

#[derive(Debug)]
struct Series {
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Series {
    fn instance(&self) -> &str {
        self.labels.get("instance").map_or("", String::as_str)
    }
}

/// One GET; returns the status and the body. HTTP/1.1 with `Connection: close`, the body
/// read to the end and de-chunked where Go's server chunked it.
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let bad = |what: &str| std::io::Error::other(format!("{what}: {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| bad("no head"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    if !chunked {
        return Ok((status, body.to_owned()));
    }
    let mut rest = body;
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or_else(|| bad("chunk"))?;
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad("chunk size"))?;
        if size == 0 {
            return Ok((status, out));
        }
        out.push_str(after.get(..size).ok_or_else(|| bad("short chunk"))?);
        rest = after.get(size + 2..).ok_or_else(|| bad("chunk end"))?;
    }
}

/// Polls `check` every 250 ms until it gives Ok, or panics after `secs` with the last Err.
async fn until<T>(what: &str, secs: u64, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(t) => return t,
            Err(last) => assert!(
                start.elapsed() < Duration::from_secs(secs),
                "{what}: not within {secs} s; last: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Two instances with metrics on, Prometheus scraping both, and N jobs done.
struct Setup {
    // Dropped first: Prometheus, then the workers, then the database and its directory.
    prometheus: Prometheus,
    workers: BTreeMap<String, Worker>,
    db: TestDb,
}

impl Setup {
    async fn start(tag: &str) -> Setup {
        let db = TestDb::new(tag).await;
        let base = base_port();
        let config = config_with_metrics(&db, base);
        let mut workers = BTreeMap::new();
        for n in [1, 2] {
            let worker = Worker::start(&config, &n.to_string());
            workers.insert(format!("127.0.0.1:{}", base + n), worker);
        }
        let ports: Vec<u16> = (1..=2).map(|n| base + n).collect();
        let prometheus = Prometheus::start(&db, &ports).await;
        let payloads = vec!["ok"; N as usize];
        db.insert("q", &payloads).await;
        db.wait_count("status = 'done'", N, 30).await;
        Setup {
            prometheus,
            workers,
            db,
        }
    }

    /// The `instance` labels of the two instances.
    fn instances(&self) -> Vec<String> {
        self.workers.keys().cloned().collect()
    }

    /// The instance label of myjob instance `n` ("1" or "2").
    fn instance_of(&self, n: &str) -> String {
        let base: u16 = self.instances()[0]
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        format!("127.0.0.1:{}", base - 1 + n.parse::<u16>().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_adds_up_both_instances_counts() {
    let s = Setup::start("prometheus_counts").await;
    let p = &s.prometheus;
    let started = Instant::now();

    // Each instance's done jobs, from the handler's record of runs: every run succeeded on
    // its first attempt, so the runs of an instance are its `done` outcomes.
    let runs = s.db.runs();
    assert_eq!(runs.len() as u64, N, "one run per job: {runs:?}");
    let mut expected: BTreeMap<String, f64> = s.instances().into_iter().map(|i| (i, 0.0)).collect();
    for (_, attempt, instance, _) in &runs {
        assert_eq!(*attempt, 1);
        *expected.get_mut(&s.instance_of(instance)).unwrap() += 1.0;
    }

    until("both targets up", 20, || {
        let up = p.query(r#"up{job="myjob"}"#);
        let got: BTreeMap<String, f64> = up
            .iter()
            .map(|s| (s.instance().to_owned(), s.value))
            .collect();
        let want: BTreeMap<String, f64> = s.instances().into_iter().map(|i| (i, 1.0)).collect();
        if up.len() == 2 && got == want {
            Ok(())
        } else {
            Err(format!("{up:?}"))
        }
    })
    .await;

    until("the counts of N jobs", 20, || {
        let done = p.scalar(r#"sum(myjob_jobs_finished_total{outcome="done"})"#)?;
        let durations = p.scalar("sum(myjob_job_duration_seconds_count)")?;
        let other = p.scalar(r#"sum(myjob_jobs_finished_total{outcome!="done"})"#)?;
        let by_instance: BTreeMap<String, f64> = p
            .query(r#"sum by (instance) (myjob_jobs_finished_total{outcome="done"})"#)
            .iter()
            .map(|s| (s.instance().to_owned(), s.value))
            .collect();
        if done == Some(N as f64)
            && durations == Some(N as f64)
            && other == Some(0.0)
            && by_instance == expected
        {
            Ok(())
        } else {
            Err(format!(
                "done {done:?}, durations {durations:?}, other outcomes {other:?}, \
                 done by instance {by_instance:?} (the runs: {expected:?})"
            ))
        }
    })
    .await;

    // The families' HELP and type, as Prometheus took them from the scrapes.
    for (metric, kind) in [
        ("myjob_jobs_finished_total", "counter"),
        ("myjob_job_duration_seconds", "histogram"),
    ] {
        let (got, help) = p
            .metadata(metric)
            .unwrap_or_else(|| panic!("no metadata for {metric}"));
        assert_eq!(got, kind, "{metric}");
        assert!(!help.trim().is_empty(), "{metric}: no HELP");
    }
    eprintln!(
        "prometheus: the counts were there {:.1} s after the last job was done; done by \
         instance: {expected:?}",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_queue_gauges_come_from_one_leader_and_move_when_it_dies() {
    let mut s = Setup::start("prometheus_leader").await;
    let p = &s.prometheus;
    let instances = s.instances();

    // One instance, the leader, reports the queue; the other reports that it is not
    // the leader. The first scrapes may come before a leader has read the drained queue.
    let leader_of = || -> Result<String, String> {
        let count = p.scalar("count(count by (instance) (myjob_queue_jobs))")?;
        let reporting = p.query("count by (instance) (myjob_queue_jobs)");
        let flagged = p.query(LEADER);
        let leader: BTreeMap<String, f64> = flagged
            .iter()
            .map(|s| (s.instance().to_owned(), s.value))
            .collect();
        let pending =
            p.query(r#"max without (instance) (myjob_queue_jobs{queue="q",state="pending"})"#);
        let state = format!(
            "count {count:?}, reporting {reporting:?}, leader {leader:?}, pending {pending:?}"
        );
        let [one] = reporting.as_slice() else {
            return Err(state);
        };
        let l = one.instance().to_owned();
        let flags: BTreeMap<String, f64> = instances
            .iter()
            .map(|i| (i.clone(), if *i == l { 1.0 } else { 0.0 }))
            .collect();
        let drained = matches!(pending.as_slice(), [p] if p.value == 0.0);
        if count == Some(1.0) && flagged.len() == 2 && leader == flags && drained {
            Ok(l)
        } else {
            Err(state)
        }
    };
    let leader = until("one leader reporting the drained queue", 20, &leader_of).await;
    // And it stays so over three scrapes: the lead does not move between live instances.
    let settled = Instant::now();
    while settled.elapsed() < Duration::from_secs(3) {
        assert_eq!(leader_of(), Ok(leader.clone()), "the leader moved");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (metric, kind) in [
        (LEADER, "gauge"),
        ("myjob_queue_jobs", "gauge"),
        ("myjob_queue_oldest_due_age_seconds", "gauge"),
    ] {
        let (got, help) = p
            .metadata(metric)
            .unwrap_or_else(|| panic!("no metadata for {metric}"));
        assert_eq!(got, kind, "{metric}");
        assert!(!help.trim().is_empty(), "{metric}: no HELP");
    }
    assert!(
        !p.query(&format!(
            r#"myjob_queue_oldest_due_age_seconds{{instance="{leader}",queue="q"}}"#
        ))
        .is_empty(),
        "the leader has no myjob_queue_oldest_due_age_seconds for q"
    );

    // kill -9 the leader: its scrapes fail, so its series go stale at once, and the other
    // instance takes the lead (the server frees a dead connection's named locks).
    let other = instances.iter().find(|i| **i != leader).unwrap().clone();
    s.workers[&leader].signal(Signal::SIGKILL);
    let killed = Instant::now();
    until("the other instance reporting the queue", 15, || {
        let dead = p.scalar(&format!(r#"up{{instance="{leader}"}}"#))?;
        let reporting = p.query("count by (instance) (myjob_queue_jobs)");
        let leads = p.scalar(&format!(r#"{LEADER}{{instance="{other}"}}"#))?;
        let pending = p.scalar(&format!(
            r#"myjob_queue_jobs{{instance="{other}",queue="q",state="pending"}}"#
        ))?;
        let moved = matches!(reporting.as_slice(), [one] if one.instance() == other);
        if dead == Some(0.0) && moved && leads == Some(1.0) && pending == Some(0.0) {
            Ok(())
        } else {
            Err(format!(
                "up of the killed {dead:?}, reporting {reporting:?}, leader flag of {other} \
                 {leads:?}, its pending {pending:?}"
            ))
        }
    })
    .await;
    let took = killed.elapsed();
    eprintln!(
        "prometheus: the queue gauges moved from {leader} to {other} {:.1} s after the kill -9 \
         (scrape interval 1 s)",
        took.as_secs_f64()
    );
    assert_eq!(s.workers.remove(&leader).unwrap().wait(5), None);
}
