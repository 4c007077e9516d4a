//! Item 14: what a fleet of instances costs the server. Measured: the server's CPU per job,
//! its CPU and queries per idle instance, its memory per connection, and the reaper's
//! `SHOW PROCESSLIST` with thousands of connections listed against a nearly empty list.
//! From those, the cost of 100 hosts × 4 instances, each holding three connections (the
//! consumer's, the reaper's and the stager's).

use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

use crate::harness::{cpu_ticks, median, server_pid, ticks_us, Bench, Handler, Workers};

/// Connections each instance holds: the consumer's, the reaper's and the stager's.
const PER_INSTANCE: usize = 3;
/// The fleet the estimate is made for.
const HOSTS: usize = 100;
const INSTANCES_PER_HOST: usize = 4;
/// How many times the processlist is read at each size.
const READS: usize = 20;

impl Bench {
    pub(crate) async fn capacity_item(&mut self) {
        let Some(server) = server_pid(&self.server) else {
            self.line("| capacity: the server is not a process of this machine, skipped | | | |");
            return;
        };
        // The server's CPU per job, at the queue's own speed (no process per job).
        let run = self.throughput(1, 64, "myjob:noop", 0).await;
        let per_core = 1e6 / run.cpu.db;
        self.line(&format!(
            "| server CPU per job, no-op handler, 1 instance × 64, µs | {:.0} | {per_core:.0} jobs/s per server core | |",
            run.cpu.db
        ));

        let (instances, qps, cpu) = self.idle_fleet(server).await;
        self.line(&format!(
            "| {instances} idle instances: server queries/s per instance | {qps:.1} | | |"
        ));
        self.line(&format!(
            "| {instances} idle instances: server CPU % of a core per instance | {cpu:.3} | | |"
        ));

        let list = self.processlist_cost(server).await;
        self.line(&format!(
            "| server memory per idle connection, KiB | {:.0} | | |",
            list.kib_per_conn
        ));
        self.line(&format!(
            "| `SHOW PROCESSLIST` with {} connections listed, ms (the reaper's read, once per interval) | {:.2} | {:.1} of {} listed ({:.2} ms) | |",
            list.many, list.many_ms, list.many_ms / list.few_ms, list.few, list.few_ms
        ));

        // The fleet, from the figures above.
        let fleet = HOSTS * INSTANCES_PER_HOST;
        let conns = fleet * PER_INSTANCE;
        let per_conn_ms = (list.many_ms - list.few_ms) / (list.many - list.few) as f64;
        let fleet_list_ms = list.few_ms + per_conn_ms * (conns - list.few) as f64;
        self.line(&format!(
            "| {HOSTS} hosts × {INSTANCES_PER_HOST} instances idle: connections; server memory, MiB; queries/s; CPU, % of a core | {conns}; {:.0}; {:.0}; {:.1} | | |",
            list.kib_per_conn * conns as f64 / 1024.0,
            qps * fleet as f64,
            cpu * fleet as f64
        ));
        self.line(&format!(
            "| the same: `SHOW PROCESSLIST`, ms, per reaper interval | {fleet_list_ms:.1} | | |"
        ));
    }

    /// Idle instances at concurrency 8 serving one queue: the server's queries/s and CPU per
    /// instance over `idle_secs`, less what the server does with none.
    async fn idle_fleet(&self, server: u32) -> (usize, f64, f64) {
        let instances = if self.size.idle_secs < 5.0 { 2 } else { 10 };
        let mut conn = self.fresh().await;
        let (q_none, cpu_none) = self.server_load(&mut conn, server).await;
        let config = self.config(8, &Handler::from("/bin/cat"), "500ms");
        let workers = Workers((1..=instances).map(|i| self.start(&config, i)).collect());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (q, cpu) = self.server_load(&mut conn, server).await;
        workers.stop();
        let n = instances as f64;
        (
            instances,
            (q - q_none).max(0.0) / n,
            (cpu - cpu_none).max(0.0) / n,
        )
    }

    /// The server's queries/s (its Questions, less this probe's own) and CPU % of a core over
    /// `idle_secs`.
    async fn server_load(&self, conn: &mut Conn, server: u32) -> (f64, f64) {
        let questions = async |conn: &mut Conn| -> u64 {
            let rows: Vec<(String, u64)> = conn
                .query("SHOW GLOBAL STATUS LIKE 'Questions'")
                .await
                .unwrap();
            rows[0].1
        };
        let q0 = questions(conn).await;
        let (c0, t0) = (cpu_ticks(server), Instant::now());
        tokio::time::sleep(Duration::from_secs_f64(self.size.idle_secs)).await;
        let q1 = questions(conn).await;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = ticks_us(cpu_ticks(server) - c0) / 1e6 / secs * 100.0;
        ((q1 - q0 - 1) as f64 / secs, cpu)
    }

    /// `SHOW PROCESSLIST` as listed now, and with `many` idle connections more; the server's
    /// resident memory per connection added.
    async fn processlist_cost(&self, server: u32) -> ProcesslistCost {
        let many = if self.size.idle_secs < 5.0 { 200 } else { 2000 };
        let mut root = self.root().await;
        let (max,): (u64,) = root
            .query_first("SELECT @@GLOBAL.max_connections")
            .await
            .unwrap()
            .unwrap();
        let few = count(&mut root).await;
        let few_ms = read_ms(&mut root).await;
        root.query_drop(format!("SET GLOBAL max_connections = {}", many + few + 100))
            .await
            .unwrap();
        let rss0 = rss_kib(server);
        let opts = Opts::from_url(&self.server).unwrap();
        let mut held = Vec::with_capacity(many);
        for _ in 0..many {
            held.push(Conn::new(opts.clone()).await.unwrap());
        }
        let listed = count(&mut root).await;
        let kib_per_conn = rss_kib(server).saturating_sub(rss0) as f64 / many as f64;
        let many_ms = read_ms(&mut root).await;
        for conn in held {
            let _ = conn.disconnect().await;
        }
        root.query_drop(format!("SET GLOBAL max_connections = {max}"))
            .await
            .unwrap();
        ProcesslistCost {
            few,
            few_ms,
            many: listed,
            many_ms,
            kib_per_conn,
        }
    }
}

struct ProcesslistCost {
    few: usize,
    few_ms: f64,
    many: usize,
    many_ms: f64,
    kib_per_conn: f64,
}

/// How many connections the server lists.
async fn count(conn: &mut Conn) -> usize {
    conn.query::<mysql_async::Row, _>("SHOW PROCESSLIST")
        .await
        .unwrap()
        .len()
}

/// The median time of [`READS`] reads of the processlist, as the reaper reads it.
async fn read_ms(conn: &mut Conn) -> f64 {
    let mut ms = Vec::with_capacity(READS);
    for _ in 0..READS {
        let t = Instant::now();
        let ids: Vec<u64> = conn
            .query::<mysql_async::Row, _>("SHOW PROCESSLIST")
            .await
            .unwrap()
            .into_iter()
            .filter_map(|row| row.get::<u64, _>(0))
            .collect();
        assert!(!ids.is_empty());
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    median(ms)
}

/// A process's resident memory, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
