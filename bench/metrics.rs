//! Item 15: what the metrics cost. The no-op handler's rate with `[metrics]` on and scraped
//! every second, against the same with them off; and how long a scrape of an instance
//! serving 10 queues takes.
//!
//! Every config the bench writes says `listen` explicitly (see [`Bench::config`], which says
//! `""`): here it is rewritten to a port of this run's, free when the run starts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::queue_name;
use crate::harness::{
    cpu_ticks, drain_rate, mark, median, percentile, ticks_us, wait_queue_done, Bench, Handler,
    Workers,
};

/// What a scrape may take.
const BUDGET_MS: f64 = 50.0;

/// What the scrapes ask for: Prometheus's own Accept, in short.
const ACCEPT: &str = "application/openmetrics-text;version=1.0.0";

/// The config line [`Bench::config`] writes, metrics off.
const OFF: &str = "[metrics]\nlisten = \"\"\n";

impl Bench {
    /// The no-op handler, 1 instance × 8, with metrics off and on in turns (off, on, on,
    /// off, …): the machine's speed drifts within minutes, so the ratio is the median of each
    /// pair's own. While on, a GET /metrics every second. Then 50 scrapes of an instance
    /// serving 10 queues, each with jobs done.
    pub(crate) async fn metrics_item(&mut self) {
        let smoke = self.size.jobs < 1000;
        let (pairs, jobs) = self.turns();
        let (mut off, mut on, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpu_off, mut cpu_on, mut cpu_ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut scrapes = 0;
        for pair in 1..=pairs {
            // In turns, the order swapped at each pair (off on, on off, ...): a run that
            // always came second would carry the first's after-effects (the server's purge
            // of the rows it just deleted) into every ratio.
            let ((rate_off, us_off, _), (rate_on, us_on, scraped)) = if pair % 2 == 1 {
                let off = self.noop_run(jobs, false, "info").await;
                (off, self.noop_run(jobs, true, "info").await)
            } else {
                let on = self.noop_run(jobs, true, "info").await;
                (self.noop_run(jobs, false, "info").await, on)
            };
            eprintln!(
                "metrics pair {pair}: off {rate_off:.0} jobs/s, on {rate_on:.0} jobs/s ({scraped} scrapes) = {:.3}; \
                 myjob CPU per job off {us_off:.1} µs, on {us_on:.1} µs = {:.3}",
                rate_on / rate_off,
                us_on / us_off
            );
            off.push(rate_off);
            on.push(rate_on);
            ratios.push(rate_on / rate_off);
            cpu_off.push(us_off);
            cpu_on.push(us_on);
            cpu_ratios.push(us_on / us_off);
            scrapes += scraped;
        }
        let ratio = median(ratios);
        self.line(&format!(
            "| no-op handler, 1 instance × 8, metrics on and scraped every 1 s ({scrapes} scrapes in {pairs} runs), jobs/s | {:.0} | {ratio:.3} of metrics off ({:.0}), median of {pairs} pairs | ≥ 0.98 {} |",
            median(on),
            median(off),
            mark(ratio >= 0.98)
        ));
        // A second view of the same runs: the CPU myjob spent per job (its whole life, in
        // clock ticks of 10 ms: about 1 % of a full run).
        self.line(&format!(
            "| the same, myjob's CPU per job, metrics on, µs | {:.1} | {:.3} of metrics off ({:.1}), median of {pairs} pairs | |",
            median(cpu_on),
            median(cpu_ratios),
            median(cpu_off)
        ));

        let times = self.scrape_times(if smoke { 10 } else { 50 }).await;
        let first = times[0];
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let (p50, p99, max) = (
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.99),
            sorted[sorted.len() - 1],
        );
        self.line(&format!(
            "| GET /metrics (OpenMetrics) of 1 instance serving 10 queues, {} scrapes, ms: median (p99, max, first) | {p50:.2} ({p99:.2}, {max:.2}, {first:.2}) | {:.2} of 50 ms (p99) | < 1 {} |",
            times.len(),
            p99 / BUDGET_MS,
            mark(p99 < BUDGET_MS)
        ));
    }

    /// How many pairs of runs an in-turns comparison makes, and of how many no-op jobs each:
    /// longer runs than the other items' (about 6 s each), since a 2 % difference is under
    /// the noise of a 2 s run.
    pub(crate) fn turns(&self) -> (usize, usize) {
        if self.size.jobs < 1000 {
            (1, self.size.jobs)
        } else {
            (7, self.size.jobs * 5 / 2)
        }
    }

    /// One run of `jobs` no-op jobs, 1 instance × 8, with metrics on (and a scrape every
    /// second) or off, and `log` as MYJOB_LOG: jobs/s from the first claim to the last
    /// finish, as the table records them, verified; myjob's CPU µs per job; and how many
    /// scrapes were answered.
    pub(crate) async fn noop_run(&self, jobs: usize, metrics: bool, log: &str) -> (f64, f64, u64) {
        let mut conn = self.fresh().await;
        self.insert(&mut conn, jobs).await;
        let config = self.config(8, &"myjob:noop".into(), "100ms");
        let at = metrics.then(|| metrics_on(&config));
        let workers = Workers(vec![self.start_logging(&config, 1, log)]);
        let scraper = at.map(Scraper::start);
        let n = jobs as u64;
        wait_queue_done(&mut conn, "bench", n).await;
        let scraped = scraper.map_or(0, Scraper::stop);
        let cpu = ticks_us(cpu_ticks(workers.0[0].id())) / n as f64;
        workers.stop();
        (drain_rate(&mut conn, n).await, cpu, scraped)
    }

    /// 1 instance × 8 serving 10 queues with metrics on, each queue with 100 jobs done (20 in
    /// a smoke run) so that every series has counted something; then `count` scrapes, 100 ms
    /// apart so that some come after any cache of the instance's has expired: each one's ms,
    /// from the connect to the last byte, in order. The first is checked: 200, OpenMetrics,
    /// every queue's jobs counted.
    async fn scrape_times(&self, count: usize) -> Vec<f64> {
        let per_queue = if self.size.jobs < 1000 { 20 } else { 100 };
        let mut conn = self.fresh().await;
        for q in 0..10 {
            self.insert_into(&mut conn, &queue_name(q), per_queue).await;
        }
        let handler = Handler {
            other_queues: 9,
            ..Handler::from("myjob:noop")
        };
        let config = self.config(8, &handler, "100ms");
        let at = metrics_on(&config);
        let workers = Workers(vec![self.start(&config, 1)]);
        for q in 0..10 {
            wait_queue_done(&mut conn, &queue_name(q), per_queue as u64).await;
        }
        let scrapes = tokio::task::spawn_blocking(move || {
            (0..count)
                .map(|i| {
                    if i > 0 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    scrape(at).expect("GET /metrics")
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        workers.stop();
        let text = &scrapes[0].1;
        assert!(
            text.starts_with("HTTP/1.1 200") && text.contains("application/openmetrics-text"),
            "a scrape answered 200 in OpenMetrics: {}",
            text.lines().next().unwrap_or("")
        );
        assert!(
            text.trim_end().ends_with("# EOF"),
            "the scrape's body is whole"
        );
        for q in 0..10 {
            let series = format!(
                "myjob_jobs_finished_total{{queue=\"{}\",outcome=\"done\"}} {per_queue}\n",
                queue_name(q)
            );
            assert!(text.contains(&series), "the scrape has {series}");
        }
        // The leader's queue depths, read from the database at a scrape and cached, where
        // this build has them: a scrape that reads them is slower than one that does not.
        eprintln!(
            "metrics scrape of 10 queues: {} bytes with the headers; queue depths (myjob_queue_jobs) {}",
            text.len(),
            if text.contains("myjob_queue_jobs{") { "in it" } else { "not in it" }
        );
        scrapes.into_iter().map(|s| s.0).collect()
    }
}

/// Rewrites `config` (one of [`Bench::config`]'s) with metrics on, at a base port such that
/// instance 1 serves on a port free just now; returns that address.
fn metrics_on(config: &Path) -> SocketAddr {
    let free = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let text = std::fs::read_to_string(config).unwrap();
    assert!(text.contains(OFF), "the bench's config says metrics off");
    let on = format!("[metrics]\nlisten = \"127.0.0.1:{}\"\n", free.port() - 1);
    std::fs::write(config, text.replace(OFF, &on)).unwrap();
    free
}

/// One GET /metrics over a connection of its own, as Prometheus asks: the ms from the
/// connect to the end of the answer, and the answer (headers and body).
fn scrape(at: SocketAddr) -> std::io::Result<(f64, String)> {
    let start = Instant::now();
    let mut stream = TcpStream::connect_timeout(&at, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: {at}\r\nAccept: {ACCEPT}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((ms, String::from_utf8_lossy(&answer).into_owned()))
}

/// A thread that scrapes an instance every second until stopped, as Prometheus would at a
/// 1 s interval, and counts the answers that were 200 (none in a smoke run's short runs).
/// Before the instance listens, its GETs fail and are not counted.
struct Scraper {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Scraper {
    fn start(at: SocketAddr) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let thread = std::thread::spawn({
            let (stop, ok) = (stop.clone(), ok.clone());
            move || {
                let mut next = Instant::now() + Duration::from_secs(1);
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep((next - now).min(Duration::from_millis(50)));
                        continue;
                    }
                    next += Duration::from_secs(1);
                    if let Ok((_, text)) = scrape(at) {
                        if text.starts_with("HTTP/1.1 200") {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        Scraper { stop, ok, thread }
    }

    /// Stops the thread; the scrapes answered.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.ok.load(Ordering::Relaxed)
    }
}
