//! What every item of the benchmark uses: the run's size, its report, fresh databases and
//! jobs, workers started and stopped, throughput runs, and the machine's counters.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use tokio::io::AsyncWriteExt;

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_myjob");

/// How big a run is: `--smoke` proves the bench works in seconds; the full run is for figures.
pub(crate) struct Size {
    pub(crate) jobs: usize,
    pub(crate) spawn_secs: f64,
    pub(crate) latency_secs: f64,
    pub(crate) idle_secs: f64,
    pub(crate) repeats: usize,
    pub(crate) growth: Vec<u64>,
    /// The claim behind a backlog: due jobs drained, and rows of each kind of backlog.
    pub(crate) backlog_jobs: usize,
    pub(crate) backlog_rows: usize,
    /// Jobs finished at once just before a drain (item 21).
    pub(crate) burst_rows: usize,
    /// Old done rows that `myjob purge` deletes while claims are timed, and the seconds of
    /// each run of claims timed without a purge.
    pub(crate) purge_rows: usize,
    pub(crate) quiet_secs: f64,
}

/// One throughput figure.
pub(crate) struct Run {
    pub(crate) rate: f64,
    /// With a `cat` per job: the median of each run's rate over the spawn rate measured just
    /// before it (see [`Bench::throughput`]).
    pub(crate) of_spawn: f64,
    pub(crate) peak_kib: u64,
    pub(crate) cpu: Cpu,
}

/// What runs the jobs of a throughput run.
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) argv: Vec<String>,
    pub(crate) persistent: bool,
    /// Jobs per run, when not the size's own (a slow handler gets fewer).
    pub(crate) jobs: Option<usize>,
    /// Queues the instance serves beside `bench`, with the same handler (see
    /// [`queue_name`]).
    pub(crate) other_queues: usize,
}

impl From<&str> for Handler {
    /// A per-job handler with no arguments.
    fn from(program: &str) -> Handler {
        Handler {
            argv: vec![program.to_owned()],
            persistent: false,
            jobs: None,
            other_queues: 0,
        }
    }
}

/// CPU time per job in µs: the whole machine's, myjob's (every instance) and MariaDB's.
#[derive(Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub(crate) all: f64,
    pub(crate) myjob: f64,
    pub(crate) db: f64,
}

pub(crate) struct Bench {
    pub(crate) server: String,
    pub(crate) url: String,
    pub(crate) dir: PathBuf,
    pub(crate) size: Size,
    pub(crate) report: String,
}

/// Makes `myjob_bench` afresh through `root` and has the build `bin` migrate it, with a
/// `config` that names it.
pub(crate) async fn migrated_by(mut root: Conn, bin: &Path, config: &Path) {
    root.query_drop("DROP DATABASE IF EXISTS myjob_bench")
        .await
        .unwrap();
    root.query_drop("CREATE DATABASE myjob_bench")
        .await
        .unwrap();
    let migrated = Command::new(bin)
        .args(["--config", config.to_str().unwrap(), "migrate"])
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}'s migrate: {migrated:?}",
        bin.display()
    );
}

impl Bench {
    pub(crate) fn line(&mut self, s: &str) {
        println!("{s}");
        self.report.push_str(s);
        self.report.push('\n');
    }

    pub(crate) fn save(&self) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results");
        let _ = std::fs::create_dir_all(&dir);
        let out = Command::new("date")
            .arg("+%Y-%m-%dT%H%M%S")
            .output()
            .unwrap();
        let name = format!("{}.md", String::from_utf8_lossy(&out.stdout).trim());
        std::fs::write(dir.join(&name), &self.report).unwrap();
        eprintln!("written to bench/results/{name}");
    }

    pub(crate) async fn root(&self) -> Conn {
        Conn::new(Opts::from_url(&self.server).unwrap())
            .await
            .expect("cannot reach MariaDB (see tests/mariadb-up.sh)")
    }

    pub(crate) async fn conn(&self) -> Conn {
        myjob::db::connect(&myjob::config::DatabaseSettings::from_url(&self.url).unwrap())
            .await
            .unwrap()
    }

    pub(crate) async fn server_version(&self) -> String {
        let mut c = self.root().await;
        c.query_first("SELECT VERSION()")
            .await
            .unwrap()
            .unwrap_or_default()
    }

    /// A fresh, migrated myjob_bench database.
    pub(crate) async fn fresh(&self) -> Conn {
        self.fresh_named("myjob_bench").await
    }

    /// A fresh, migrated database `name` on the bench's server.
    pub(crate) async fn fresh_named(&self, name: &str) -> Conn {
        let mut root = self.root().await;
        root.query_drop(format!("DROP DATABASE IF EXISTS {name}"))
            .await
            .unwrap();
        root.query_drop(format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = format!("{}/{name}", self.server);
        let mut conn =
            myjob::db::connect(&myjob::config::DatabaseSettings::from_url(&url).unwrap())
                .await
                .unwrap();
        myjob::store::schema::migrate(&mut conn).await.unwrap();
        conn
    }

    /// A fresh `myjob_bench` on a table another build of myjob (`bin`, with `config`) made
    /// with its own `migrate`: a baseline's run.
    pub(crate) async fn fresh_of(&self, bin: &Path, config: &Path) -> Conn {
        migrated_by(self.root().await, bin, config).await;
        self.conn().await
    }

    /// Inserts `n` pending jobs of 200 bytes into `bench`.
    pub(crate) async fn insert(&self, conn: &mut Conn, n: usize) {
        self.insert_into(conn, "bench", n).await;
    }

    /// Inserts `n` pending jobs of 200 bytes into `queue`, as an application would: plain
    /// multi-row INSERTs.
    pub(crate) async fn insert_into(&self, conn: &mut Conn, queue: &str, n: usize) {
        let payload = "x".repeat(200);
        let row = format!("('{queue}', ?)");
        for start in (0..n).step_by(1000) {
            let rows = (n - start).min(1000);
            let values = vec![row.as_str(); rows].join(", ");
            let params: Vec<mysql_async::Value> =
                (0..rows).map(|_| payload.as_str().into()).collect();
            conn.exec_drop(
                format!("INSERT INTO myjob_jobs (queue, payload) VALUES {values}"),
                params,
            )
            .await
            .unwrap();
        }
    }

    /// A config of one instance × `concurrency` serving `bench` with `handler`, and its other
    /// queues after it. Metrics off, said explicitly: numbered instances started side by side
    /// must not compete for ports (see [`crate::metrics`] for the runs with them on).
    pub(crate) fn config(&self, concurrency: usize, handler: &Handler, poll: &str) -> PathBuf {
        let path = self.dir.join(format!("bench-{concurrency}.toml"));
        let argv: Vec<String> = handler.argv.iter().map(|a| format!("{a:?}")).collect();
        let mut text = format!(
            "[database]\nurl = \"{}\"\n[worker]\nconcurrency = {concurrency}\npoll_interval = \"{poll}\"\n\
             [retention]\ndone = \"forever\"\nfailed = \"forever\"\ncancelled = \"forever\"\n\
             [metrics]\nlisten = \"\"\n",
            self.url
        );
        for q in 0..=handler.other_queues {
            text += &format!(
                "[[queue]]\nname = \"{}\"\ncommand = [{}]\npersistent = {}\n",
                queue_name(q),
                argv.join(", "),
                handler.persistent
            );
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    pub(crate) fn start(&self, config: &Path, instance: usize) -> Child {
        self.start_logging(config, instance, "info")
    }

    /// [`Bench::start`] with `filter` as MYJOB_LOG.
    pub(crate) fn start_logging(&self, config: &Path, instance: usize, filter: &str) -> Child {
        self.start_of(Path::new(BIN), config, instance, filter)
    }

    /// [`Bench::start_logging`] of the binary `bin` (another build of myjob).
    pub(crate) fn start_of(
        &self,
        bin: &Path,
        config: &Path,
        instance: usize,
        filter: &str,
    ) -> Child {
        self.command_of(bin, config, instance, filter)
            .spawn()
            .unwrap()
    }

    /// The command [`Bench::start_of`] spawns: its log in the bench's directory.
    pub(crate) fn command_of(
        &self,
        bin: &Path,
        config: &Path,
        instance: usize,
        filter: &str,
    ) -> Command {
        let log = std::fs::File::create(self.dir.join(format!("worker-{instance}.log"))).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args([
            "--config",
            config.to_str().unwrap(),
            "run",
            "--instance",
            &instance.to_string(),
        ])
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .env("MYJOB_LOG", filter)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        cmd
    }

    /// Jobs/s of `instances` × `concurrency` on `size.jobs` pending jobs, from the first claim
    /// to the last finish as the table records them; the largest peak RSS; and the CPU per
    /// job. The medians of `repeats` runs, each verified.
    /// `repeats` runs of `instances` × `concurrency` with `command` per job. With `inflight`
    /// above 0, each run follows a spawn ceiling of `inflight` cats at a time, and `of_spawn`
    /// is the median of the runs' ratios to theirs.
    pub(crate) async fn throughput(
        &self,
        instances: usize,
        concurrency: usize,
        handler: impl Into<Handler>,
        inflight: usize,
    ) -> Run {
        let handler = handler.into();
        let jobs = handler.jobs.unwrap_or(self.size.jobs);
        let mut rates = Vec::new();
        let mut ratios = Vec::new();
        let mut cpu = Vec::new();
        let mut peak = 0;
        for _ in 0..self.size.repeats {
            let spawn = match inflight {
                0 => None,
                n => {
                    let (count, secs) = spawn_rate(n, self.size.spawn_secs).await;
                    Some(count as f64 / secs)
                }
            };
            let mut conn = self.fresh().await;
            self.insert(&mut conn, jobs).await;
            let config = self.config(concurrency, &handler, "100ms");
            let db = server_pid(&self.server);
            let (busy, db_ticks) = (busy_ticks(), db.map_or(0, cpu_ticks));
            let workers = Workers((1..=instances).map(|i| self.start(&config, i)).collect());
            let n = jobs as u64;
            wait_queue_done(&mut conn, "bench", n).await;
            let per_job = |ticks: u64| ticks_us(ticks) / n as f64;
            cpu.push(Cpu {
                all: per_job(busy_ticks() - busy),
                myjob: per_job(workers.0.iter().map(|w| cpu_ticks(w.id())).sum()),
                db: per_job(db.map_or(0, cpu_ticks) - db_ticks),
            });
            for w in &workers.0 {
                peak = peak.max(peak_rss_kib(w.id()));
            }
            workers.stop();
            let rate = drain_rate(&mut conn, n).await;
            rates.push(rate);
            if let Some(spawn) = spawn {
                ratios.push(rate / spawn);
            }
        }
        Run {
            rate: median(rates),
            of_spawn: if ratios.is_empty() {
                0.0
            } else {
                median(ratios)
            },
            peak_kib: peak,
            cpu: Cpu {
                all: median(cpu.iter().map(|c| c.all).collect()),
                myjob: median(cpu.iter().map(|c| c.myjob).collect()),
                db: median(cpu.iter().map(|c| c.db).collect()),
            },
        }
    }
}

/// How many `cat`s ran, with `inflight` at a time for `secs`, and the seconds until the last
/// ended.
pub(crate) async fn spawn_rate(inflight: usize, secs: f64) -> (u64, f64) {
    let payload: Arc<[u8]> = vec![b'x'; 1024].into();
    let count = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..inflight {
        let (payload, count) = (payload.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let mut child = tokio::process::Command::new("cat")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let mut stdin = child.stdin.take().unwrap();
                let _ = stdin.write_all(&payload).await;
                drop(stdin);
                child.wait().await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (count.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

/// Waits until the due jobs of `queue` are all done (other rows may wait for ever), and
/// checks that `n` are; a run that takes over 10 minutes is a failure.
/// The drain's rate in jobs per second, from the first claim to the last finish by the
/// table's clock, once every one of the `n` jobs is checked done and claimed once.
pub(crate) async fn drain_rate(conn: &mut Conn, n: u64) -> f64 {
    let (done, once, secs): (u64, u64, f64) = conn
        .query_first(
            "SELECT COUNT(*), SUM(attempts = 1), \
             TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), MAX(finished_at)) / 1e6 \
             FROM myjob_jobs WHERE status = 'done'",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((done, once), (n, n), "every job done, each claimed once");
    n as f64 / secs
}

pub(crate) async fn wait_queue_done(conn: &mut Conn, queue: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        // Probes of the claim index: a COUNT of the done rows would cost the server a scan
        // each time, CPU taken from the run being measured.
        let waiting: Option<u8> = conn
            .exec_first(
                "SELECT 1 FROM myjob_jobs WHERE status IN ('pending', 'claimed') AND queue = ? \
                 AND run_at <= NOW(6) LIMIT 1",
                (queue,),
            )
            .await
            .unwrap();
        if waiting.is_none() {
            let done: u64 = conn
                .exec_first(
                    "SELECT COUNT(*) FROM myjob_jobs WHERE status = 'done' AND queue = ?",
                    (queue,),
                )
                .await
                .unwrap()
                .unwrap();
            assert_eq!(done, n, "every due job done, none failed");
            return;
        }
        assert!(Instant::now() < deadline, "jobs still waiting after 600 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `myjob run` processes of one measurement. Dropped without [`Workers::stop`] (a failed
/// assertion), it kills them: a worker left running would take the next run's jobs.
pub(crate) struct Workers(pub(crate) Vec<Child>);

impl Workers {
    /// SIGTERM, and each must exit 0.
    pub(crate) fn stop(mut self) {
        for w in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(w.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        for mut w in std::mem::take(&mut self.0) {
            let status = w.wait().unwrap();
            assert!(status.success(), "a worker exited with {status}");
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// VmHWM: the peak resident set of a process, in KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The CPU time all cores spent busy (user, nice, system, irq, softirq, steal) since boot,
/// in clock ticks: /proc/stat's first line.
pub(crate) fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal
    [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| f.get(i).copied().unwrap_or(0))
        .sum()
}

pub(crate) fn ticks_us(ticks: u64) -> f64 {
    let per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks as f64 / per_sec * 1e6
}

/// The process of the server the bench runs against, for its CPU time: the one that listens
/// on the url's port (the suite may run other servers on this machine, in chroots).
pub(crate) fn server_pid(url: &str) -> Option<u32> {
    let port = mysql_async::Opts::from_url(url).ok()?.tcp_port();
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let local_port = f.get(1)?.rsplit_once(':')?.1;
                    let listening = *f.get(3)? == "0A";
                    let inode = f.get(9)?;
                    (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                        .then(|| format!("socket:[{inode}]"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let fds = std::fs::read_dir(e.path().join("fd")).ok()?;
        fds.flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|link| inodes.iter().any(|i| link.to_str() == Some(i.as_str())))
            .then_some(pid)
    })
}

/// utime + stime of a process, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<&str> = after.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

pub(crate) fn chmod_x(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

pub(crate) fn mark(ok: bool) -> &'static str {
    if ok {
        "✓"
    } else {
        "✗ missed"
    }
}

/// The name of the `q`th queue an instance serves (see [`Bench::config`]): `bench` first, the
/// one every item fills, then `q1`, `q2`, …
pub(crate) fn queue_name(q: usize) -> String {
    match q {
        0 => "bench".to_owned(),
        n => format!("q{n}"),
    }
}
