//! The fault-injection run: many jobs over three queues (one of them run by persistent
//! handler processes under a rate limit, one with concurrency keys), three instances, and for a set time
//! kill -9s, killed claimer connections, a restart of the database server and a frozen instance. At the end
//! it prints a verdict and a table: no job lost, none marked done twice, and every job that
//! ran more than once listed by cause.
//!
//! It restarts the database server under test, so plain `cargo test` skips it: `tests/chaos` runs it (the
//! full run), `tests/chaos --short` is the shorter run CI does. `MYJOB_CHAOS_JOBS` and
//! `MYJOB_CHAOS_SECS` set the size. With `MYJOB_CHAOS_SYSTEMD` (the root of the container
//! tests/systemd/boot-systemd.sh boots, set by `tests/chaos --systemd`) the instances are the
//! units myjob@1..3 there rather than processes of the test's own.
//!
//! Against a multi-primary cluster (`MYJOB_TEST_NODES`, set by `tests/chaos` for the Galera
//! cluster) instance N connects to node N, the killed claimer connections are killed on their
//! own node, and the server restart is a kill -9 of one node (never the first, which the test
//! itself reads through) and its return to the cluster.
//!
//! How it knows what happened, without trusting myjob's own account:
//! - the handler appends a start line and an end line per run to a file (one `write` each,
//!   O_APPEND): job, attempt, instance, myjob's pid, batch, time, exit code;
//! - a trigger on `myjob_jobs` records every UPDATE that leaves a row `done`, so a second
//!   "done" for a job, even one that changes nothing, shows up;
//! - the keyed queue's runs, from the same record, give how many jobs of each key ran at
//!   once (a run cut short by a kill -9 ends when its instance was killed);
//! - the run keeps its own list of the faults it injected, with times and pids.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::common::haproxy::HaProxy;
use crate::common::hosts::Host;
use crate::common::{replicas, TestDb, Worker};
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use nix::sys::signal::Signal;

const INSTANCES: usize = 3;
const QUEUES: [&str; 3] = ["a", "b", "c"];
/// The queue with a rate limit.
const RATE_LIMITED_QUEUE: &str = "b";
/// Queue `b` runs a persistent handler: one long-lived process per slot.
const PERSISTENT_QUEUE: &str = "b";
/// Queue `a`'s jobs have one of [`KEYS`] concurrency keys, at most [`KEY_LIMIT`] of a key
/// running at once: a limit that binds (4 slots of the 12 the instances have: the queue
/// takes about half of a short run, and runs through its faults).
const KEYED_QUEUE: &str = "a";
const KEYS: u64 = 2;
const KEY_LIMIT: usize = 2;
/// Queue `c` allows one attempt, so its designed failures end `failed`; `a` and `b` retry.
const FAIL_EVERY: u64 = 50;
const STALE_AFTER: Duration = Duration::from_secs(5);
const KILL_EVERY: Duration = Duration::from_secs(10);
const RESTART_AFTER: Duration = Duration::from_secs(2);
const CONN_KILL_EVERY: Duration = Duration::from_secs(7);
/// Longer than `stale_after`: the frozen instance's claims are old, yet alive.
const FREEZE_FOR: Duration = Duration::from_secs(8);
/// How long after the frozen instance resumes the server restart may begin at the earliest.
const THAW_BEFORE_RESTART: Duration = Duration::from_secs(3);
/// How long the server stays down in its restart.
const DB_DOWN_FOR: Duration = Duration::from_secs(3);
/// A blip: an instance's host cut off for less than its fence, which it rides out.
const BLIP_FOR: Duration = Duration::from_secs(10);
/// A partition: an instance's host cut off for longer than its session's wait_timeout (75 s
/// with the default lock wait), after which the server has dropped its connections and the
/// other instances' reapers put its claims back.
const PARTITION_FOR: Duration = Duration::from_secs(90);
/// How long a cut-off instance may go on running its handlers: its fence (a statement's
/// limit, 20 s with the default lock wait), noticed within one more statement's limit at
/// the most. Its jobs must not run elsewhere before.
const FENCE: Duration = Duration::from_secs(20);

/// The handler: records the start, sleeps 0 to 20 ms, fails attempt 1 of one job in 50, and
/// records the end. bash, for `$EPOCHREALTIME` without a `date` process per line.
const HANDLER: &str = r#"#!/bin/bash
t() { echo "${EPOCHREALTIME/[.,]/}"; }
echo "S $MYJOB_JOB_ID $MYJOB_ATTEMPT $MYJOB_INSTANCE $PPID $MYJOB_BATCH_ID $(t) -" >> DIR/runs
printf -v d '0.%03d' $((RANDOM % 21))
sleep "$d"
code=0
if [ $((MYJOB_JOB_ID % FAIL_EVERY)) -eq 0 ] && [ "$MYJOB_ATTEMPT" -eq 1 ]; then
  echo "designed failure" >&2
  code=1
fi
echo "E $MYJOB_JOB_ID $MYJOB_ATTEMPT $MYJOB_INSTANCE $PPID $MYJOB_BATCH_ID $(t) $code" >> DIR/runs
exit $code
"#;

/// The same handler as a persistent process (queue [`PERSISTENT_QUEUE`]): the job's numbers
/// come from its header, the exit code it records is the one its answer stands for.
const PERSISTENT: &str = r#"#!/bin/bash
t() { echo "${EPOCHREALTIME/[.,]/}"; }
echo READY
while read -r word id attempt max batch len; do
  head -c "$len" > /dev/null
  echo "S $id $attempt $MYJOB_INSTANCE $PPID $batch $(t) -" >> DIR/runs
  printf -v d '0.%03d' $((RANDOM % 21))
  sleep "$d"
  code=0 answer=OK
  if [ $((id % FAIL_EVERY)) -eq 0 ] && [ "$attempt" -eq 1 ]; then
    echo "designed failure" >&2
    code=1 answer="RETRY designed failure"
  fi
  echo "E $id $attempt $MYJOB_INSTANCE $PPID $batch $(t) $code" >> DIR/runs
  echo "$answer"
done
"#;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fault the run injected.
#[derive(Debug, Clone)]
enum Fault {
    /// Matched to runs by instance name and time, not pid: a handler started just before its
    /// myjob died may see its parent as pid 1.
    Kill {
        instance: String,
        at: f64,
    },
    ConnKill {
        pid: u32,
        at: f64,
    },
    DbRestart {
        from: f64,
        to: f64,
    },
    /// The instance's host cut off from the network (see `common::hosts`), nothing reset.
    Partition {
        instance: String,
        from: f64,
        to: f64,
    },
    /// `held`: the jobs the instance had claimed when it was frozen.
    Freeze {
        pid: u32,
        instance: String,
        from: f64,
        to: f64,
        held: Vec<u64>,
    },
}

/// One handler run, from the handler's own record.
#[derive(Debug, Clone, Default)]
struct Run {
    attempt: u32,
    instance: String,
    pid: u32,
    start: f64,
    /// The exit code, when the run got to its end line.
    code: Option<i32>,
    /// When it ended, when it got to its end line.
    end: Option<f64>,
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "restarts the server under test: run through tests/chaos"]
async fn chaos() {
    let jobs = env_or("MYJOB_CHAOS_JOBS", 50_000);
    let secs = Duration::from_secs(env_or("MYJOB_CHAOS_SECS", 180));
    let db = TestDb::new("chaos").await;
    // Kept after the run (the handler's record, the instances' logs), for a look at a FAIL.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let systemd = std::env::var_os("MYJOB_CHAOS_SYSTEMD").map(PathBuf::from);
    let work = match &systemd {
        Some(root) => Work::under(root, "/var/lib/myjob-chaos"),
        None => Work::under(Path::new("/"), dir.to_str().unwrap()),
    };
    write_handler(&work);
    // A failover run: the instances reach the primary through HAProxy, and the restart is a
    // failover to the replica (tests/chaos sets MYJOB_TEST_REPLICA for `replicas`).
    let haproxy = std::env::var("MYJOB_TEST_REPLICA")
        .ok()
        .filter(|replica| !replica.is_empty())
        .map(|replica| HaProxy::start(&common::server_url(), &replica));
    let mut urls: Vec<String> = (0..INSTANCES)
        .map(|i| match &haproxy {
            Some(h) => h.url(&db.node_url(i)),
            None => db.node_url(i),
        })
        .collect();
    // Long runs as processes put each instance on a host of its own, which the run cuts off.
    let mut hosts = Vec::new();
    if std::env::var_os("MYJOB_CHAOS_PARTITIONS").is_some() {
        assert!(systemd.is_none(), "partitions are run as processes");
        for (i, url) in urls.iter_mut().enumerate() {
            let (host, reached) =
                Host::reaching(21 + i as u8, &format!("chaos-{}", i + 1), url).await;
            hosts.push(host);
            *url = reached;
        }
    }
    // The rate-limited queue's third of the jobs could not all start in less than 60% of
    // the run: the limit binds, and its jobs held back still finish before the faults end.
    let rate = (jobs / 3).div_ceil((secs.as_secs() * 6 / 10).max(1)).max(1);
    let configs: Vec<String> = urls.iter().map(|u| config_text(u, &work, rate)).collect();
    prepare(&db, jobs).await;
    println!(
        "chaos: {jobs} jobs over {} queues, {INSTANCES} instances x 4 slots as {}, faults for {} s",
        QUEUES.len(),
        if systemd.is_some() {
            "the units myjob@1..3 of a real systemd"
        } else {
            "separate processes"
        },
        secs.as_secs()
    );

    let started = Instant::now();
    let started_at = now();
    let mut fleet = match &systemd {
        Some(root) => {
            assert_eq!(common::nodes().len(), 1, "a cluster is run as processes");
            Fleet::units(root, &configs[0])
        }
        None => Fleet::processes(&dir, &configs, hosts),
    };
    let faults = inject(&db, &mut fleet, secs, haproxy.as_ref()).await;

    // Every instance up again, then wait for the queue to empty.
    fleet.all_up().await;
    let settle = Duration::from_secs(120 + jobs / 100);
    let left = wait_empty(&db, settle).await;
    let duration = started.elapsed();
    let restarts = fleet.stop(&dir, started_at);

    let mut verdict = judge(
        &db,
        &work.host.join("runs"),
        jobs,
        &faults,
        left,
        started_at,
    )
    .await;
    verdict.systemd_restarts = restarts;
    println!(
        "the handler's record: {}; the instances' logs: {}",
        work.host.join("runs").display(),
        dir.display()
    );
    verdict.print(&faults, duration);
    if !verdict.pass() {
        tell_of(&verdict.suspects(), &dir, &work.host.join("runs"));
    }
    assert!(
        verdict.pass(),
        "chaos: the verdict is FAIL (see the table above)"
    );
}

/// The directory of the handler and its record, as the test sees it and as the instances do
/// (under systemd they live in the container's root).
struct Work {
    host: PathBuf,
    inside: PathBuf,
}

impl Work {
    fn under(root: &Path, inside: &str) -> Work {
        Work {
            host: root.join(inside.trim_start_matches('/')),
            inside: PathBuf::from(inside),
        }
    }
}

fn write_handler(work: &Work) {
    let _ = std::fs::remove_file(work.host.join("runs"));
    for (file, text) in [("handler.sh", HANDLER), ("persistent.sh", PERSISTENT)] {
        let handler = work.host.join(file);
        let script = text
            .replace("DIR", work.inside.to_str().unwrap())
            .replace("FAIL_EVERY", &FAIL_EVERY.to_string());
        std::fs::write(&handler, script).unwrap();
        common::chmod_x(&handler);
    }
}

fn config_text(url: &str, work: &Work, rate: u64) -> String {
    let mut text = format!(
        "[database]\nurl = \"{url}\"\n\n\
         [worker]\nconcurrency = 4\npoll_interval = \"200ms\"\nshutdown_timeout = \"5s\"\n\n\
         [reaper]\ninterval = \"1s\"\nstale_after = \"{stale}s\"\n",
        stale = STALE_AFTER.as_secs()
    );
    for q in QUEUES {
        let attempts = if q == "c" { 1 } else { 3 };
        let persistent = q == PERSISTENT_QUEUE;
        let file = if persistent {
            "persistent.sh"
        } else {
            "handler.sh"
        };
        text += &format!(
            "\n[[queue]]\nname = \"{q}\"\ncommand = [\"{h}\"]\npersistent = {persistent}\n\
             backoff = \"1s\"\nbackoff_max = \"2s\"\nmax_attempts = {attempts}\n",
            h = work.inside.join(file).display()
        );
        // One queue under a rate limit that binds: its budget taken and given back through
        // every fault, and its jobs held back still all run.
        if q == RATE_LIMITED_QUEUE {
            text += &format!("rate_limit = \"{rate}/1s\"\n");
        }
        if q == KEYED_QUEUE {
            text += &format!("key_limit = {KEY_LIMIT}\n");
        }
    }
    text
}

/// The audit trigger, then the jobs, inserted as an application would.
async fn prepare(db: &TestDb, jobs: u64) {
    let mut conn = db.conn().await;
    conn.query_drop(
        // A primary key, which Galera wants on every table.
        "CREATE TABLE chaos_done (seq BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, \
         job_id BIGINT UNSIGNED NOT NULL, batch_id BIGINT UNSIGNED, \
         at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
    )
    .await
    .unwrap();
    conn.query_drop(
        "CREATE TRIGGER chaos_done AFTER UPDATE ON myjob_jobs FOR EACH ROW \
         IF NEW.status = 'done' THEN \
           INSERT INTO chaos_done (job_id, batch_id) VALUES (NEW.id, NEW.batch_id); \
         END IF",
    )
    .await
    .unwrap();
    let payload = "x".repeat(200);
    let mut id = 0u64;
    while id < jobs {
        let n = (jobs - id).min(1000);
        let rows = vec!["(?, ?, ?)"; n as usize].join(", ");
        let mut params: Vec<mysql_async::Value> = Vec::new();
        for i in id..id + n {
            let queue = QUEUES[(i % 3) as usize];
            params.push(queue.into());
            params.push(payload.as_str().into());
            // Blocked from its INSERT on, as a producer's plain SQL makes it.
            let key = (queue == KEYED_QUEUE).then(|| format!("k{}", i / 3 % KEYS));
            params.push(key.into());
        }
        conn.exec_drop(
            format!("INSERT INTO myjob_jobs (queue, payload, concurrency_key) VALUES {rows}"),
            params,
        )
        .await
        .unwrap();
        id += n;
    }
}

/// The instances under test: separate `myjob run` processes, or the units `myjob@1..3` of the
/// real systemd booted by tests/systemd/boot-systemd.sh. Under systemd a kill -9 is
/// `systemctl kill` of the main process, the restart is the unit's own (Restart=on-failure,
/// RestartSec=2), and KillMode=mixed decides what happens to the killed instance's handlers.
enum Fleet {
    Processes {
        /// One config per instance: they differ in the node they connect to.
        configs: Vec<PathBuf>,
        logs: PathBuf,
        workers: Vec<Option<Worker>>,
        /// Killed instances, and when to start them again.
        restarts: Vec<(Instant, usize)>,
        /// In a long run, the host of each instance (see `common::hosts`); none otherwise.
        hosts: Vec<Host>,
    },
    Units {
        /// Each unit's NRestarts before the run.
        restarts_before: Vec<u64>,
    },
}

impl Fleet {
    fn processes(dir: &Path, configs: &[String], hosts: Vec<Host>) -> Fleet {
        let configs: Vec<PathBuf> = configs
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let path = dir.join(format!("myjob-{}.toml", i + 1));
                std::fs::write(&path, text).unwrap();
                path
            })
            .collect();
        let logs = dir.to_owned();
        let workers = (0..INSTANCES)
            .map(|i| Some(Self::start(&configs[i], &logs, i, hosts.get(i))))
            .collect();
        Fleet::Processes {
            configs,
            logs,
            workers,
            restarts: Vec::new(),
            hosts,
        }
    }

    /// Installs the config as /etc/myjob/myjob.toml (root:myjob 0640, as the package does) and
    /// starts the units. tests/chaos has installed the binary, the unit and the user.
    fn units(root: &Path, config: &str) -> Fleet {
        std::fs::write(root.join("etc/myjob/myjob.toml"), config).unwrap();
        sd(&["chown", "root:myjob", "/etc/myjob/myjob.toml"]);
        sd(&["chmod", "640", "/etc/myjob/myjob.toml"]);
        let units: Vec<String> = (0..INSTANCES).map(unit).collect();
        let restarts_before = units.iter().map(|u| n_restarts(u)).collect();
        let mut start = vec!["systemctl", "start"];
        start.extend(units.iter().map(String::as_str));
        let out = sd(&start);
        assert!(out.status.success(), "systemctl start failed: {out:?}");
        Fleet::Units { restarts_before }
    }

    fn start(config: &Path, logs: &Path, i: usize, host: Option<&Host>) -> Worker {
        let name = (i + 1).to_string();
        let log = logs.join(format!("worker-{name}.log"));
        match host {
            Some(host) => Worker::start_on(host, config, &name, &log),
            None => Worker::start_appending(config, &name, &log),
        }
    }

    /// Instance `i`'s host, in a long run as processes.
    fn host(&self, i: usize) -> Option<&Host> {
        match self {
            Fleet::Processes { hosts, .. } => hosts.get(i),
            Fleet::Units { .. } => None,
        }
    }

    /// The process id of instance `i` while it runs, as its handlers and the `worker` column
    /// see it (under systemd: in the container's PID namespace).
    fn pid(&self, i: usize) -> Option<u32> {
        match self {
            Fleet::Processes { workers, .. } => workers[i].as_ref().map(|w| w.pid() as u32),
            Fleet::Units { .. } => {
                let show = sd(&[
                    "systemctl",
                    "show",
                    "-p",
                    "ActiveState",
                    "-p",
                    "MainPID",
                    &unit(i),
                ]);
                let show = String::from_utf8_lossy(&show.stdout).into_owned();
                let prop = |name: &str| {
                    show.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                        .unwrap_or("")
                        .to_owned()
                };
                let pid: u32 = prop("MainPID").parse().unwrap_or(0);
                (prop("ActiveState") == "active" && pid != 0).then_some(pid)
            }
        }
    }

    /// kill -9 of instance `i`: a process is started again `RESTART_AFTER` later by
    /// [`Fleet::restart_killed`], a unit by systemd.
    fn kill(&mut self, i: usize) {
        match self {
            Fleet::Processes {
                workers, restarts, ..
            } => {
                let mut w = workers[i].take().unwrap();
                w.signal(Signal::SIGKILL);
                w.wait(10);
                restarts.push((Instant::now() + RESTART_AFTER, i));
            }
            Fleet::Units { .. } => self.signal(i, Signal::SIGKILL),
        }
    }

    /// Sends `sig` to instance `i`'s myjob process only.
    fn signal(&self, i: usize, sig: Signal) {
        match self {
            Fleet::Processes { workers, .. } => workers[i].as_ref().unwrap().signal(sig),
            Fleet::Units { .. } => {
                let out = sd(&[
                    "systemctl",
                    "kill",
                    "--kill-who=main",
                    &format!("--signal={}", sig.as_str()),
                    &unit(i),
                ]);
                assert!(out.status.success(), "systemctl kill failed: {out:?}");
            }
        }
    }

    /// Starts the killed processes whose time has come, or all of them.
    fn restart_killed(&mut self, all: bool) {
        if let Fleet::Processes {
            configs,
            logs,
            workers,
            restarts,
            hosts,
        } = self
        {
            let now = Instant::now();
            restarts.retain(|&(when, i)| {
                let due = all || now >= when;
                if due {
                    workers[i] = Some(Self::start(&configs[i], logs, i, hosts.get(i)));
                }
                !due
            });
        }
    }

    /// Every instance running again.
    async fn all_up(&mut self) {
        self.restart_killed(true);
        let deadline = Instant::now() + Duration::from_secs(30);
        while (0..INSTANCES).any(|i| self.pid(i).is_none()) {
            assert!(Instant::now() < deadline, "an instance did not come back");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops every instance, which must stop cleanly. Under systemd, copies each unit's
    /// journal since `since` into `logs` and returns how often systemd restarted the units.
    fn stop(self, logs: &Path, since: f64) -> Option<u64> {
        match self {
            Fleet::Processes { mut workers, .. } => {
                for w in workers.iter().flatten() {
                    w.signal(Signal::SIGTERM);
                }
                for w in workers.iter_mut().flatten() {
                    assert_eq!(w.wait(30), Some(0), "an instance did not stop cleanly");
                }
                None
            }
            Fleet::Units { restarts_before } => {
                let units: Vec<String> = (0..INSTANCES).map(unit).collect();
                // Read before the stop, which sets it back to 0.
                let restarts = units
                    .iter()
                    .zip(restarts_before)
                    .map(|(u, before)| n_restarts(u) - before)
                    .sum();
                let mut stop = vec!["systemctl", "stop"];
                stop.extend(units.iter().map(String::as_str));
                assert!(sd(&stop).status.success(), "systemctl stop failed");
                let since = format!("--since=@{}", since as u64);
                for u in &units {
                    let journal = sd(&[
                        "journalctl",
                        "-u",
                        u,
                        &since,
                        "--no-pager",
                        "-o",
                        "short-precise",
                    ]);
                    std::fs::write(logs.join(format!("{u}.log")), journal.stdout).unwrap();
                    let result = sd(&["systemctl", "show", "-p", "Result", "--value", u]);
                    assert_eq!(
                        String::from_utf8_lossy(&result.stdout).trim(),
                        "success",
                        "{u} did not stop cleanly"
                    );
                }
                Some(restarts)
            }
        }
    }
}

fn unit(i: usize) -> String {
    format!("myjob@{}", i + 1)
}

fn n_restarts(unit: &str) -> u64 {
    let out = sd(&["systemctl", "show", "-p", "NRestarts", "--value", unit]);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// A command inside the systemd container (tests/systemd/run-in-systemd.sh).
fn sd(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/systemd/run-in-systemd.sh");
    std::process::Command::new(script)
        .args(args)
        .output()
        .unwrap()
}

/// Injects faults for `secs`: kill -9 of a random instance every 10 s (restarted 2 s later),
/// KILL CONNECTION of a random claimer every 7 s, one instance frozen (SIGSTOP) for longer
/// than `stale_after` at 20 % of the time, and one server restart at half the time, once the
/// frozen instance has resumed: both early, while the queue is still busy in a full run.
async fn inject(
    db: &TestDb,
    fleet: &mut Fleet,
    secs: Duration,
    haproxy: Option<&HaProxy>,
) -> Vec<Fault> {
    let begin = Instant::now();
    let mut faults = Vec::new();
    // With hosts: a blip early on, a partition late (after the restart).
    let mut cuts = vec![
        (begin + secs.mul_f64(0.1), BLIP_FOR),
        (begin + secs.mul_f64(0.6), PARTITION_FOR),
    ];
    if fleet.host(0).is_none() {
        cuts.clear();
    }
    // The instance cut off now: (index, until, from).
    let mut cut: Option<(usize, Instant, f64)> = None;
    let mut next_kill = begin + KILL_EVERY / 2;
    let mut next_conn_kill = begin + CONN_KILL_EVERY / 2;
    let restart_at = begin + secs.mul_f64(0.5);
    let mut restart: Option<tokio::task::JoinHandle<(f64, f64)>> = None;
    let freeze_at = begin + secs.mul_f64(0.2);
    let mut frozen: Option<(usize, u32, Instant, f64, Vec<u64>)> = None;

    loop {
        let froze = frozen.is_some() || faults.iter().any(|f| matches!(f, Fault::Freeze { .. }));
        let restarted = faults.iter().any(|f| matches!(f, Fault::DbRestart { .. }));
        // Past `secs` only to end the freeze, the partition and do the one restart, if they
        // are not done yet.
        if begin.elapsed() >= secs
            && frozen.is_none()
            && restart.is_none()
            && restarted
            && cut.is_none()
            && cuts.is_empty()
        {
            break;
        }
        let t = Instant::now();
        let in_time = begin.elapsed() < secs;
        let frozen_i = frozen.as_ref().map(|f| f.0);
        let cut_i = cut.as_ref().map(|c| c.0);

        // A host cut off: never the frozen instance's, nor a killed one's.
        if cut.is_none() && cuts.first().is_some_and(|c| t >= c.0) {
            let (_, length) = cuts.remove(0);
            let alive: Vec<usize> = (0..INSTANCES)
                .filter(|&i| fleet.pid(i).is_some() && Some(i) != frozen_i)
                .collect();
            if let Some(&i) = pick(&alive) {
                fleet.host(i).unwrap().cut();
                println!(
                    "chaos: host of instance {} cut off for {} s",
                    i + 1,
                    length.as_secs()
                );
                cut = Some((i, t + length, now()));
            }
        }
        if cut.as_ref().is_some_and(|c| t >= c.1) {
            let (i, _, from) = cut.take().unwrap();
            fleet.host(i).unwrap().heal();
            faults.push(Fault::Partition {
                instance: (i + 1).to_string(),
                from,
                to: now(),
            });
        }

        if in_time && t >= next_kill {
            next_kill += KILL_EVERY;
            // The cut-off instance is left alone: its handlers must die by its own fence.
            let alive: Vec<usize> = (0..INSTANCES)
                .filter(|&i| fleet.pid(i).is_some() && Some(i) != frozen_i && Some(i) != cut_i)
                .collect();
            if let Some(&i) = pick(&alive) {
                fleet.kill(i);
                faults.push(Fault::Kill {
                    instance: (i + 1).to_string(),
                    at: now(),
                });
            }
        }
        fleet.restart_killed(false);

        if in_time && t >= next_conn_kill && restart.is_none() {
            next_conn_kill += CONN_KILL_EVERY;
            let frozen_pid = frozen.as_ref().map(|f| f.1);
            let cut_pid = cut_i.and_then(|i| fleet.pid(i));
            if let Some(f) = kill_a_claimer(db, fleet, &[frozen_pid, cut_pid]).await {
                faults.push(f);
            }
        }

        // Never while an instance is frozen, nor just after: a restart breaks its connection,
        // and its claims may then rightly be taken; the freeze tests a live connection.
        let thawed_for = faults.iter().find_map(|f| match f {
            Fault::Freeze { to, .. } => Some(now() - to),
            _ => None,
        });
        if t >= restart_at
            && thawed_for.is_some_and(|s| s >= THAW_BEFORE_RESTART.as_secs_f64())
            && !restarted
        {
            restart = Some(match haproxy {
                Some(h) => {
                    let fail_over = fail_over(h);
                    tokio::spawn(fail_over)
                }
                None => tokio::spawn(restart_server()),
            });
            // Marks that the restart has begun; replaced by the real window when it ends.
            faults.push(Fault::DbRestart {
                from: now(),
                to: f64::MAX,
            });
        }
        if restart.as_ref().is_some_and(|h| h.is_finished()) {
            let (from, to) = restart.take().unwrap().await.unwrap();
            for f in &mut faults {
                if let Fault::DbRestart { from: a, to: b } = f {
                    (*a, *b) = (from, to);
                }
            }
        }

        if t >= freeze_at && !froze && cut.is_none() {
            // The instance holding the most claims on a live connection, so that the freeze
            // has something to test.
            let mut most: Option<(usize, u32, usize)> = None;
            for i in 0..INSTANCES {
                let Some(pid) = fleet.pid(i) else { continue };
                let n = claims_of(db, i, pid).await.len();
                if most.is_none_or(|(.., m)| n > m) {
                    most = Some((i, pid, n));
                }
            }
            if let Some((i, pid, _)) = most {
                fleet.signal(i, Signal::SIGSTOP);
                let held = claims_of(db, i, pid).await;
                frozen = Some((i, pid, t + FREEZE_FOR, now(), held));
            }
        }
        if frozen.as_ref().is_some_and(|f| t >= f.2) {
            let (i, pid, _, from, held) = frozen.take().unwrap();
            fleet.signal(i, Signal::SIGCONT);
            faults.push(Fault::Freeze {
                pid,
                instance: (i + 1).to_string(),
                from,
                to: now(),
                held,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    faults
}

fn pick<T>(items: &[T]) -> Option<&T> {
    if items.is_empty() {
        None
    } else {
        items.get(rand::random::<u64>() as usize % items.len())
    }
}

async fn try_conn(url: &str) -> Option<Conn> {
    let opts = Opts::from_url(url).unwrap();
    tokio::time::timeout(Duration::from_secs(2), Conn::new(opts))
        .await
        .ok()?
        .ok()
}

/// KILL CONNECTION of the claimer connection of one instance holding claims, on the server
/// (the node) that instance is connected to. The frozen instance and the cut-off one are left
/// alone: their claims must survive, or go, for another reason.
async fn kill_a_claimer(db: &TestDb, fleet: &Fleet, spared: &[Option<u32>]) -> Option<Fault> {
    let mut candidates: Vec<(usize, u32)> = (0..INSTANCES)
        .filter_map(|i| Some((i, fleet.pid(i)?)))
        .filter(|&(_, pid)| !spared.contains(&Some(pid)))
        .collect();
    while !candidates.is_empty() {
        let k = rand::random::<u64>() as usize % candidates.len();
        let (i, pid) = candidates.swap_remove(k);
        let Some(mut conn) = try_conn(&db.node_url(i)).await else {
            continue;
        };
        let owner = live_claims(&mut conn, pid).await.first().map(|&(_, c)| c);
        let killed = match owner {
            Some(id) => conn
                .query_drop(format!("KILL CONNECTION {id}"))
                .await
                .is_ok(),
            None => false,
        };
        let _ = conn.disconnect().await;
        if killed {
            return Some(Fault::ConnKill { pid, at: now() });
        }
    }
    None
}

/// The jobs claimed by the instance with process id `pid` through a connection that is alive
/// on the server `conn` is connected to (the instance's own node), with that connection's id.
/// A claim whose connection has died is the reaper's to take, frozen instance or not: made by
/// a killed connection before the instance re-owned it, or by a claim that committed as the
/// connection died, so that the instance never learnt of it.
async fn live_claims(conn: &mut Conn, pid: u32) -> Vec<(u64, u64)> {
    conn.exec(
        "SELECT id, owner_conn FROM myjob_jobs WHERE status = 'claimed' AND worker LIKE ? \
         AND owner_conn IN (SELECT ID FROM information_schema.PROCESSLIST) ORDER BY id",
        (format!("%:{pid}:%"),),
    )
    .await
    .unwrap_or_default()
}

/// [`live_claims`] of instance `i`, by job id, read on its node.
async fn claims_of(db: &TestDb, i: usize, pid: u32) -> Vec<u64> {
    let Some(mut conn) = try_conn(&db.node_url(i)).await else {
        return Vec::new();
    };
    let held = live_claims(&mut conn, pid).await;
    let _ = conn.disconnect().await;
    held.into_iter().map(|(id, _)| id).collect()
}

/// Prints the handler's record and what the instances' logs say of each job in `ids`, so that
/// a FAIL in CI, where only the output is kept, tells its own story.
fn tell_of(ids: &[u64], logs: &Path, runs: &Path) {
    let runs = std::fs::read_to_string(runs).unwrap_or_default();
    let Ok(dir) = std::fs::read_dir(logs) else {
        return;
    };
    let files: Vec<(String, String)> = dir
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), text))
        })
        .collect();
    for id in ids {
        println!("the runs and logs of job {id}:");
        let run = |l: &&str| l.split(' ').nth(1) == Some(id.to_string().as_str());
        for line in runs.lines().filter(run) {
            println!("  runs: {line}");
        }
        let needle = format!("job_id={id}");
        // `job_id=12` but not `job_id=123`.
        let names = |l: &str| {
            l.match_indices(&needle)
                .any(|(at, _)| !l[at + needle.len()..].starts_with(|c: char| c.is_ascii_digit()))
        };
        for (name, text) in &files {
            for line in text.lines().filter(|l| names(l)) {
                println!("  {name}: {line}");
            }
        }
    }
}

/// Stops the server under test (`MYJOB_TEST_SERVER_NAME`, as tests/db-server.sh names it) by
/// its own pid file, keeps it down a few seconds, and starts it again with the same script.
/// In a cluster, one node but the first is killed (SIGKILL) and rejoins. Returns the window
/// (Unix seconds) in which it was away.
async fn restart_server() -> (f64, f64) {
    let name = std::env::var("MYJOB_TEST_SERVER_NAME").unwrap_or_else(|_| "mariadb10".into());
    let nodes = common::nodes().len();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/db-server.sh");
    let run = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new(&script);
        cmd.args(args).stdout(std::process::Stdio::null());
        cmd
    };
    let from = now();
    // SIGTERM, then wait for the process to end: the port closes at the start of a
    // shutdown, the process ends seconds later (InnoDB writes its buffers).
    let stopped = if nodes > 1 {
        let node = (2 + rand::random::<u64>() as usize % (nodes - 1)).to_string();
        println!("chaos: killing node {node} of {name}");
        run(&["kill", &name, &node]).status().await.unwrap()
    } else {
        run(&["stop", &name]).status().await.unwrap()
    };
    assert!(
        stopped.success(),
        "tests/db-server.sh could not stop {name}"
    );
    tokio::time::sleep(DB_DOWN_FOR).await;
    // Its stderr says why, should it fail (the tail of the server's log).
    let up = run(&["up", &name])
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(
        up.status.success(),
        "tests/db-server.sh could not start {name} again: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    (from, now())
}

/// The restart of a failover run: the primary killed (kill -9), the replica (semi-sync, so
/// it has every commit a client was told of) promoted once it has applied what it received,
/// HAProxy moved to it. From then on the run reads the new primary. Returns the window (Unix
/// seconds) in which no primary answered.
fn fail_over(haproxy: &HaProxy) -> impl std::future::Future<Output = (f64, f64)> + Send {
    let switch = haproxy.switcher();
    async move {
        let from = now();
        println!("chaos: killing the primary, failing over to the replica");
        tokio::task::spawn_blocking(replicas::kill_primary)
            .await
            .unwrap();
        let replica = replicas::replica_url();
        replicas::apply_received(&replica).await;
        replicas::promote(&replica).await;
        switch.switch();
        common::failed_over_to(&replica);
        (from, now())
    }
}

/// Waits until no job is pending, scheduled or claimed; returns how many still were at the
/// deadline.
async fn wait_empty(db: &TestDb, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(mut conn) = try_conn(&db.node_url(0)).await {
            let left: Option<u64> = conn
                .query_first(
                    "SELECT COUNT(*) FROM myjob_jobs \
                     WHERE status IN ('pending', 'blocked', 'suspect', 'scheduled', 'claimed')",
                )
                .await
                .ok()
                .flatten();
            let _ = conn.disconnect().await;
            if left == Some(0) || (Instant::now() >= deadline && left.is_some()) {
                return left.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct Verdict {
    jobs: u64,
    done: u64,
    failed: u64,
    /// Pending, scheduled or claimed at the end, or missing.
    lost: u64,
    /// Failed although not a designed failure.
    failed_unexpectedly: Vec<u64>,
    double_done: Vec<u64>,
    /// Done, yet no run of the handler ended with exit 0.
    done_unrun: Vec<u64>,
    /// Jobs that ran more than their design says, by the cause of the extra run.
    reruns: BTreeMap<&'static str, Vec<u64>>,
    /// Seconds from the start until the last job finished.
    busy: f64,
    /// Jobs claimed by the frozen instance when it was frozen.
    frozen_jobs: usize,
    /// Of those, the ones that ran elsewhere although their instance was not killed later.
    frozen_lost: Vec<u64>,
    /// Handler runs with a start line and no end line: killed with their instance.
    cut_short: usize,
    /// The most jobs of one concurrency key that ran at once, by key.
    key_most: BTreeMap<String, usize>,
    kills: usize,
    /// Under systemd: how often it restarted the units, which must be once per kill.
    systemd_restarts: Option<u64>,
}

impl Verdict {
    fn pass(&self) -> bool {
        self.lost == 0
            && self.key_most.values().all(|&n| n <= KEY_LIMIT)
            && self.double_done.is_empty()
            && self.failed_unexpectedly.is_empty()
            && self.done_unrun.is_empty()
            && !self.reruns.contains_key(UNEXPLAINED)
            && !self.reruns.contains_key(FROZEN)
            && !self.reruns.contains_key(PARTITION_EARLY)
            && self.frozen_lost.is_empty()
            && self.systemd_restarts.is_none_or(|n| n == self.kills as u64)
    }

    /// A few of the jobs that made the verdict FAIL, worst first.
    fn suspects(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = [
            &self.frozen_lost,
            &self.double_done,
            &self.done_unrun,
            &self.failed_unexpectedly,
        ]
        .into_iter()
        .chain(
            [UNEXPLAINED, FROZEN, PARTITION_EARLY]
                .iter()
                .filter_map(|c| self.reruns.get(c)),
        )
        .flat_map(|ids| ids.iter().take(3).copied())
        .collect();
        ids.truncate(3);
        ids
    }

    fn print(&self, faults: &[Fault], duration: Duration) {
        let count = |f: fn(&Fault) -> bool| faults.iter().filter(|x| f(x)).count();
        let reruns: usize = self.reruns.values().map(Vec::len).sum();
        let cut: Vec<String> = faults
            .iter()
            .filter_map(|f| match f {
                Fault::Partition { from, to, .. } => Some(format!("{:.0} s", to - from)),
                _ => None,
            })
            .collect();
        let cuts = match cut.len() {
            0 => String::new(),
            n => format!(", {n} hosts cut off ({})", cut.join(", ")),
        };
        println!(
            "faults: {} kill -9, {} KILL CONNECTION, {} server {}{}, {} freeze of {} s (stale_after {} s; the frozen instance held {} claims)",
            count(|f| matches!(f, Fault::Kill { .. })),
            count(|f| matches!(f, Fault::ConnKill { .. })),
            count(|f| matches!(f, Fault::DbRestart { .. })),
            if std::env::var("MYJOB_TEST_REPLICA").is_ok_and(|r| !r.is_empty()) {
                "failover"
            } else {
                "restart"
            },
            cuts,
            count(|f| matches!(f, Fault::Freeze { .. })),
            FREEZE_FOR.as_secs(),
            STALE_AFTER.as_secs(),
            self.frozen_jobs,
        );
        println!();
        println!(
            "| jobs | done | failed | lost | double-done | re-run | last job done | duration |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} s | {:.0} s |",
            self.jobs,
            self.done,
            self.failed,
            self.lost,
            self.double_done.len(),
            reruns,
            self.busy,
            duration.as_secs_f64()
        );
        println!();
        println!("| re-run cause | jobs |");
        println!("|---|---:|");
        for (cause, ids) in &self.reruns {
            println!("| {cause} | {} |", ids.len());
        }
        if self.reruns.is_empty() {
            println!("| (none) | 0 |");
        }
        println!();
        let show = |what: &str, ids: &[u64]| {
            if !ids.is_empty() {
                let some: Vec<String> = ids.iter().take(20).map(u64::to_string).collect();
                println!("{what}: {} (e.g. {})", ids.len(), some.join(", "));
            }
        };
        show("double-done jobs", &self.double_done);
        show(
            "failed without a designed failure",
            &self.failed_unexpectedly,
        );
        show("done without a successful run", &self.done_unrun);
        show("taken from the frozen instance", &self.frozen_lost);
        for cause in [UNEXPLAINED, FROZEN, PARTITION_EARLY] {
            show(cause, self.reruns.get(cause).map_or(&[][..], Vec::as_slice));
        }
        println!(
            "handler runs cut short (no end line; killed with their instance): {}",
            self.cut_short
        );
        println!(
            "queue {KEYED_QUEUE}: the most jobs of one concurrency key at once, by key (key_limit {KEY_LIMIT}): {:?}",
            self.key_most
        );
        if let Some(n) = self.systemd_restarts {
            println!(
                "systemd restarted the units {n} times for {} kill -9 (must be equal)",
                self.kills
            );
        }
        println!("verdict: {}", if self.pass() { "PASS" } else { "FAIL" });
    }
}

const KILLED: &str = "in flight when its instance was killed (kill -9)";
const CONN_KILLED: &str = "in flight when its claimer connection was killed";
const DB_RESTARTED: &str = "in flight when the server restarted (or failed over)";
const PARTITIONED: &str = "in flight on an instance whose host was cut off";
const PARTITION_EARLY: &str =
    "run elsewhere while its first run, on a cut-off host, may have lived (a bug)";
const FROZEN: &str = "reaped while its instance was frozen (a bug)";
const UNEXPLAINED: &str = "no fault explains it (a bug)";
/// Worst first.
const CAUSES: [&str; 7] = [
    UNEXPLAINED,
    FROZEN,
    PARTITION_EARLY,
    KILLED,
    CONN_KILLED,
    PARTITIONED,
    DB_RESTARTED,
];

async fn judge(
    db: &TestDb,
    runs: &Path,
    jobs: u64,
    faults: &[Fault],
    left: u64,
    started: f64,
) -> Verdict {
    let mut conn = db.conn().await;
    let keyed: Vec<(u64, String, String, Option<String>)> = conn
        .query("SELECT id, queue, status, concurrency_key FROM myjob_jobs")
        .await
        .unwrap();
    let rows: Vec<(u64, String, String)> = keyed
        .iter()
        .map(|(id, q, s, _)| (*id, q.clone(), s.clone()))
        .collect();
    let double_done: Vec<u64> = conn
        .query("SELECT job_id FROM chaos_done GROUP BY job_id HAVING COUNT(*) > 1 ORDER BY job_id")
        .await
        .unwrap();
    let designed = |id: u64| id.is_multiple_of(FAIL_EVERY);
    let mut v = Verdict {
        jobs,
        done: 0,
        failed: 0,
        lost: jobs.saturating_sub(rows.len() as u64).max(left),
        failed_unexpectedly: Vec::new(),
        double_done,
        done_unrun: Vec::new(),
        reruns: BTreeMap::new(),
        frozen_jobs: 0,
        frozen_lost: Vec::new(),
        busy: 0.0,
        cut_short: 0,
        key_most: BTreeMap::new(),
        kills: faults
            .iter()
            .filter(|f| matches!(f, Fault::Kill { .. }))
            .count(),
        systemd_restarts: None,
    };
    let last: Option<f64> = conn
        .query_first("SELECT CAST(UNIX_TIMESTAMP(MAX(finished_at)) AS DOUBLE) FROM myjob_jobs")
        .await
        .unwrap()
        .flatten();
    v.busy = last.map_or(0.0, |t| t - started);
    let runs = read_runs(runs);
    v.cut_short = runs.values().flatten().filter(|r| r.code.is_none()).count();
    for (id, queue, status) in &rows {
        let succeeded = runs
            .get(id)
            .is_some_and(|r| r.iter().any(|r| r.code == Some(0)));
        match status.as_str() {
            "done" => {
                v.done += 1;
                if !succeeded {
                    v.done_unrun.push(*id);
                }
            }
            "failed" => {
                v.failed += 1;
                if !(designed(*id) && queue == "c") {
                    v.failed_unexpectedly.push(*id);
                }
            }
            _ => v.lost += u64::from(left == 0),
        }
    }

    // Whether instance `name` was killed between `from` and `to`.
    let killed = |name: &str, from: f64, to: f64| {
        faults.iter().any(|f| {
            matches!(f, Fault::Kill { instance, at } if instance == name && *at >= from && *at <= to)
        })
    };
    let freeze = faults.iter().find_map(|f| match f {
        Fault::Freeze {
            pid,
            instance,
            from,
            to,
            held,
        } => Some((*pid, instance.as_str(), *from, *to, held)),
        _ => None,
    });
    if let Some((pid, instance, from, _, held)) = freeze {
        // Its claims were old, yet alive: each must have run on it, and only there, unless
        // the instance was killed later.
        v.frozen_jobs = held.len();
        if !killed(instance, from, f64::MAX) {
            for id in held {
                let list = runs.get(id).map_or(&[][..], Vec::as_slice);
                let here = list.iter().any(|r| r.pid == pid);
                // A designed failure's retry may run anywhere.
                let elsewhere = list
                    .iter()
                    .any(|r| r.pid != pid && r.start >= from && !(designed(*id) && r.attempt >= 2));
                if !here || elsewhere {
                    v.frozen_lost.push(*id);
                }
            }
        }
    }
    v.key_most = key_most(&keyed, &runs, faults);
    let freeze = freeze.map(|(pid, _, from, to, _)| (pid, from, to));
    for (id, runs) in &runs {
        // Every run but the last was superseded by a later one: why?
        let mut cause: Option<&'static str> = None;
        for pair in runs.windows(2) {
            let (r, next) = (&pair[0], &pair[1]);
            if designed(*id) && r.attempt == 1 && r.code == Some(1) {
                continue;
            }
            let window = |at: f64| at >= r.start - STALE_AFTER.as_secs_f64() && at <= next.start;
            // Cut off while it ran: its instance kills it at its fence, and only then may the
            // job run elsewhere (unless the run had ended by itself).
            let partition = faults.iter().find_map(|f| match f {
                Fault::Partition { instance, from, to }
                    if *instance == r.instance && *from <= next.start && *to >= r.start =>
                {
                    Some(*from)
                }
                _ => None,
            });
            let c = if let Some(from) = partition {
                let alive = r.end.is_none_or(|end| end > next.start);
                if next.instance != r.instance && alive && next.start < from + FENCE.as_secs_f64()
                {
                    PARTITION_EARLY
                } else {
                    PARTITIONED
                }
            } else if killed(&r.instance, r.start - 1.0, next.start) {
                KILLED
            } else if faults.iter().any(|f| matches!(f, Fault::DbRestart { from, to } if *from <= next.start && *to >= r.start - STALE_AFTER.as_secs_f64())) {
                DB_RESTARTED
            } else if faults.iter().any(|f| matches!(f, Fault::ConnKill { pid, at, .. } if *pid == r.pid && window(*at))) {
                CONN_KILLED
            } else if freeze.is_some_and(|(pid, from, to)| pid == r.pid && from <= next.start && to >= r.start) {
                FROZEN
            } else {
                UNEXPLAINED
            };
            // A job with several extra runs is listed under the worst of their causes.
            let rank = |c: &str| CAUSES.iter().position(|x| *x == c);
            cause = Some(cause.map_or(c, |old| if rank(c) < rank(old) { c } else { old }));
        }
        if let Some(c) = cause {
            v.reruns.entry(c).or_default().push(*id);
        }
    }
    v
}

/// The most runs of jobs of one concurrency key that were alive at once, by key. A run
/// without an end line ended when its instance was killed (its guard kills it then), or at
/// the latest when its job ran again (a claim lost: the handler is killed, and the job keeps
/// its slot for its next run).
fn key_most(
    jobs: &[(u64, String, String, Option<String>)],
    runs: &HashMap<u64, Vec<Run>>,
    faults: &[Fault],
) -> BTreeMap<String, usize> {
    let mut events: Vec<(f64, bool, &str)> = Vec::new();
    for (id, _, _, key) in jobs {
        let (Some(key), Some(list)) = (key, runs.get(id)) else {
            continue;
        };
        for (i, r) in list.iter().enumerate() {
            let killed = faults.iter().find_map(|f| match f {
                Fault::Kill { instance, at } if *instance == r.instance && *at >= r.start => {
                    Some(*at)
                }
                _ => None,
            });
            let next = list.get(i + 1).map(|n| n.start);
            let end = r
                .end
                .or_else(|| match (killed, next) {
                    (Some(k), Some(n)) => Some(k.min(n)),
                    (k, n) => k.or(n),
                })
                .unwrap_or(r.start);
            events.push((r.start, true, key));
            events.push((end, false, key));
        }
    }
    // Ends before starts at one instant: a slot handed on cannot start before its end.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut running: HashMap<&str, usize> = HashMap::new();
    let mut most: BTreeMap<String, usize> = BTreeMap::new();
    for (_, start, key) in events {
        let n = running.entry(key).or_default();
        if start {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        let m = most.entry(key.to_owned()).or_default();
        *m = (*m).max(*n);
    }
    most
}

/// The handler's record, by job: runs in start order, each with its exit code if it ended.
fn read_runs(path: &Path) -> HashMap<u64, Vec<Run>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // (job, attempt, pid, batch) → run
    let mut by_key: HashMap<(u64, u32, u32, u64), Run> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, job, attempt, instance, pid, batch, micros, code] = f[..] else {
            panic!("a torn line in the handler's record: {line:?}");
        };
        let key = (
            job.parse().unwrap(),
            attempt.parse().unwrap(),
            pid.parse().unwrap(),
            batch.parse().unwrap(),
        );
        let run = by_key.entry(key).or_insert_with(|| Run {
            attempt: key.1,
            instance: instance.to_owned(),
            pid: key.2,
            ..Run::default()
        });
        match kind {
            "S" => run.start = micros.parse::<f64>().unwrap() / 1e6,
            _ => {
                run.code = Some(code.parse().unwrap());
                run.end = Some(micros.parse::<f64>().unwrap() / 1e6);
            }
        }
    }
    let mut runs: HashMap<u64, Vec<Run>> = HashMap::new();
    for ((job, ..), run) in by_key {
        runs.entry(job).or_default().push(run);
    }
    for list in runs.values_mut() {
        list.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    runs
}
