//! Item 19: the storage's hot path against myjob before its second design (a build of the
//! commit before it, on a table its own `migrate` made: `bench/run` builds it and names it in
//! MYJOB_BENCH_STORAGE_BASELINE_BIN). The no-op handler and a minimal persistent one, 1 × 8,
//! each build in turn: jobs/s, the server's CPU per job, myjob's own CPU per job, and the
//! statements the server ran per 1,000 jobs; then a producer's single-row INSERT, p50 and
//! p99. Medians of the repeats.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::harness::{
    cpu_ticks, drain_rate, mark, median, percentile, server_pid, ticks_us, Bench, Handler, Workers,
    BIN,
};

/// One run's figures.
#[derive(Default, Clone, Copy)]
struct Hot {
    rate: f64,
    /// CPU per job, µs.
    server: f64,
    myjob: f64,
    /// Statements the server was sent per 1,000 jobs (Questions), less the bench's own.
    statements: f64,
}

impl Bench {
    pub(crate) async fn storage_item(&mut self) {
        let Some(old) = std::env::var_os("MYJOB_BENCH_STORAGE_BASELINE_BIN").map(PathBuf::from)
        else {
            self.line("| storage's hot path | (no baseline build: MYJOB_BENCH_STORAGE_BASELINE_BIN unset) | | ✗ missed |");
            return;
        };
        for (what, handler) in [
            ("no-op handler", Handler::from("myjob:noop")),
            ("minimal persistent handler", Handler::minimal_persistent()),
        ] {
            let (mut new_runs, mut old_runs) = (vec![], vec![]);
            for _ in 0..self.size.repeats {
                new_runs.push(self.hot_run(Path::new(BIN), &handler, false).await);
                old_runs.push(self.hot_run(&old, &handler, true).await);
            }
            let (new, old) = (medians(&new_runs), medians(&old_runs));
            let noop = what == "no-op handler";
            self.hot_line(
                &format!("{what}, 1 × 8, jobs/s"),
                new.rate,
                old.rate,
                noop.then_some((2.0, true)),
            );
            self.hot_line(
                &format!("{what}: server CPU per job, µs"),
                new.server,
                old.server,
                noop.then_some((0.4, false)),
            );
            self.hot_line(
                &format!("{what}: myjob's CPU per job, µs"),
                new.myjob,
                old.myjob,
                (!noop).then_some((0.7, false)),
            );
            self.hot_line(
                &format!("{what}: statements per 1,000 jobs"),
                new.statements,
                old.statements,
                None,
            );
        }
        // A producer's INSERT of one job, as a web request makes it: each build's table in turn.
        let (mut new_runs, mut old_runs) = (vec![], vec![]);
        for _ in 0..self.size.repeats {
            new_runs.push(self.single_inserts(Path::new(BIN), false).await);
            old_runs.push(self.single_inserts(&old, true).await);
        }
        for (what, pick) in [("p50", 0), ("p99", 1)] {
            let of = |runs: &[[f64; 2]]| median(runs.iter().map(|r| r[pick]).collect());
            self.hot_line(
                &format!("a producer's single-row INSERT, autocommit, {what}, µs"),
                of(&new_runs),
                of(&old_runs),
                Some((1.0, false)),
            );
        }
    }

    /// `size.jobs / 10` single-row INSERTs of a plain job, each committed by itself, timed one
    /// by one after a hundred untimed, on a table `bin`'s own `migrate` made: p50 and p99, µs.
    async fn single_inserts(&self, bin: &Path, baseline: bool) -> [f64; 2] {
        let config = self.config(8, &Handler::from("myjob:noop"), "100ms");
        let mut conn = self.table_of(bin, &config, baseline).await;
        let payload = "x".repeat(200);
        let mut took = Vec::new();
        for i in 0..100 + self.size.jobs / 10 {
            let t = Instant::now();
            conn.exec_drop(
                "INSERT INTO myjob_jobs (queue, payload) VALUES ('bench', ?)",
                (&payload,),
            )
            .await
            .unwrap();
            if i >= 100 {
                took.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        took.sort_by(f64::total_cmp);
        [percentile(&took, 0.5), percentile(&took, 0.99)]
    }

    /// A fresh `myjob_bench` as `bin` makes it: the baseline's own `migrate` (with `config`)
    /// when `baseline`, this build's otherwise.
    async fn table_of(&self, bin: &Path, config: &Path, baseline: bool) -> Conn {
        if baseline {
            self.fresh_of(bin, config).await
        } else {
            self.fresh().await
        }
    }

    /// A line of the item: `new`, its ratio to `old`, and the target, at least (`true`) or at
    /// most that ratio.
    fn hot_line(&mut self, what: &str, new: f64, old: f64, target: Option<(f64, bool)>) {
        let ratio = new / old;
        let target = match target {
            Some((t, true)) => format!("≥ {t:.1} {}", mark(ratio >= t)),
            Some((t, false)) => format!("≤ {t:.1} {}", mark(ratio <= t)),
            None => String::new(),
        };
        self.line(&format!(
            "| {what} | {new:.0} | {ratio:.2} of before the second design ({old:.0}) | {target} |"
        ));
    }

    /// One run of three times the size's jobs with `bin` (the baseline on a table its own
    /// `migrate` made, when `baseline`), verified like every run.
    async fn hot_run(&self, bin: &Path, handler: &Handler, baseline: bool) -> Hot {
        let n = self.size.jobs * 3;
        let config = self.config(8, handler, "100ms");
        let mut conn = self.table_of(bin, &config, baseline).await;
        self.insert(&mut conn, n).await;
        let db = server_pid(&self.server);
        let (db0, q0) = (db.map_or(0, cpu_ticks), questions(&mut conn).await);
        let workers = Workers(vec![self.start_of(bin, &config, 1, "info")]);
        let polls = wait_done(&mut conn, n as u64).await;
        let (db1, q1) = (db.map_or(0, cpu_ticks), questions(&mut conn).await);
        let mine = cpu_ticks(workers.0[0].id());
        workers.stop();
        let per_job = |ticks: u64| ticks_us(ticks) / n as f64;
        Hot {
            rate: drain_rate(&mut conn, n as u64).await,
            server: per_job(db1 - db0),
            myjob: per_job(mine),
            // Each poll is one statement, and each reading of the counter one.
            statements: (q1 - q0).saturating_sub(polls + 1) as f64 * 1000.0 / n as f64,
        }
    }
}

fn medians(runs: &[Hot]) -> Hot {
    let of = |f: fn(&Hot) -> f64| median(runs.iter().map(f).collect());
    Hot {
        rate: of(|h| h.rate),
        server: of(|h| h.server),
        myjob: of(|h| h.myjob),
        statements: of(|h| h.statements),
    }
}

/// The server's Questions: statements clients sent it, this connection's included.
async fn questions(conn: &mut Conn) -> u64 {
    let (_, v): (String, u64) = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Questions'")
        .await
        .unwrap()
        .unwrap();
    v
}

/// Waits until no job of `bench` is waiting or running, by a cheap probe every 200 ms, and
/// says how many probes it sent. A run over 10 minutes fails.
async fn wait_done(conn: &mut Conn, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut polls = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        polls += 1;
        let waiting: Option<u8> = conn
            .query_first(
                "SELECT 1 FROM myjob_jobs WHERE status IN ('pending', 'claimed') \
                 AND queue = 'bench' LIMIT 1",
            )
            .await
            .unwrap();
        if waiting.is_none() {
            return polls;
        }
        assert!(
            Instant::now() < deadline,
            "{n} jobs still not done after 600 s"
        );
    }
}
