//! Item 17: what concurrency keys cost. A queue without limits pays nothing: the no-op
//! handler against the same with myjob as it was before concurrency keys (a build of the
//! commit before them, on a table its own `migrate` made: `bench/run` builds it and names it
//! in MYJOB_BENCH_BASELINE_BIN), in turns, and the producer's INSERTs of its jobs alike. Keyed jobs: the no-op handler over 1,000 keys and over one key (each job
//! handed on by the one before), against the queue without limits. And the index entries a
//! claim reads behind 200,000 blocked jobs of one key, against a clean table, and a
//! hand-off's behind them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::Conn;

use myjob::store::jobs::keys::Referee;

use crate::harness::{drain_rate, mark, median, Bench, Handler, Workers};

impl Bench {
    pub(crate) async fn flow_item(&mut self) {
        let baseline = std::env::var_os("MYJOB_BENCH_BASELINE_BIN").map(PathBuf::from);
        let (mut with, mut without, mut ins_with, mut ins_without) =
            (vec![], vec![], vec![], vec![]);
        let mut many = vec![];
        for _ in 0..self.size.repeats {
            let (ins, rate) = self.keyed_run(None).await;
            ins_with.push(ins);
            with.push(rate);
            if let Some(bin) = &baseline {
                let (ins, rate) = self.baseline_run(bin).await;
                ins_without.push(ins);
                without.push(rate);
            }
            many.push(self.keyed_run(Some(1000)).await.1);
        }
        // One key runs one job at a time: fewer jobs, and one run.
        let one = self.keyed_run_of(Some(1), self.size.jobs / 10).await.1;
        let (with, ins_with, many) = (median(with), median(ins_with), median(many));
        match baseline {
            Some(_) => {
                let (without, ins_without) = (median(without), median(ins_without));
                self.line(&format!(
                    "| no-op handler, 1 × 8, a queue without limits, jobs/s | {with:.0} | {:.2} of myjob before concurrency keys ({without:.0}) | ≥ 0.95 {} |",
                    with / without,
                    mark(with / without >= 0.95)
                ));
                self.line(&format!(
                    "| its jobs' plain INSERTs (1,000 rows a statement), rows/s | {ins_with:.0} | {:.2} of before ({ins_without:.0}) | |",
                    ins_with / ins_without
                ));
            }
            None => self.line(&format!(
                "| no-op handler, 1 × 8, a queue without limits, jobs/s | {with:.0} | (no baseline build: MYJOB_BENCH_BASELINE_BIN unset) | ≥ 0.95 ✗ missed |"
            )),
        }
        self.line(&format!(
            "| no-op handler, 1 × 8, jobs over 1,000 concurrency keys (key_limit 1), jobs/s | {many:.0} | {:.2} of without limits | |",
            many / with
        ));
        self.line(&format!(
            "| no-op handler, 1 × 8, jobs of one key (key_limit 1: each handed on by the one before), jobs/s | {one:.0} | {:.2} ms a hand-off | |",
            1000.0 / one
        ));
        let (clean, behind, hand_off) = self.key_reads().await;
        self.line(&format!(
            "| index entries a claim of 100 reads behind {} blocked jobs of one key | {behind} | {:.2} of a clean table ({clean}) | ≤ 1.20 {} |",
            self.size.backlog_rows,
            behind as f64 / clean as f64,
            mark(behind as f64 <= clean as f64 * 1.2)
        ));
        self.line(&format!(
            "| index entries a hand-off reads behind them (admitted, then refused for a held slot) | {} / {} | | ≤ 10 {} |",
            hand_off.0,
            hand_off.1,
            mark(hand_off.0 <= 10 && hand_off.1 <= 10)
        ));
    }

    /// The no-op run of [`Bench::keyed_run_of`] with the baseline build `bin`, on a fresh
    /// database its own `migrate` made.
    async fn baseline_run(&self, bin: &Path) -> (f64, f64) {
        let config = self.config(8, &Handler::from("myjob:noop"), "100ms");
        let mut conn = self.fresh_of(bin, &config).await;
        self.timed_run(&mut conn, bin, &config, None, self.size.jobs)
            .await
    }

    /// [`Bench::keyed_run_of`] with the size's jobs.
    async fn keyed_run(&self, keys: Option<u64>) -> (f64, f64) {
        self.keyed_run_of(keys, self.size.jobs).await
    }

    /// One run of `n` jobs, the no-op handler at concurrency 8, on a fresh database: with
    /// `keys`, the jobs have that many concurrency keys, in turn.
    async fn keyed_run_of(&self, keys: Option<u64>, n: usize) -> (f64, f64) {
        let mut conn = self.fresh().await;
        let config = self.config(8, &Handler::from("myjob:noop"), "100ms");
        let bin = Path::new(crate::harness::BIN);
        self.timed_run(&mut conn, bin, &config, keys, n).await
    }

    /// Inserts `n` jobs (see [`insert_keyed`]) and runs them with `bin`: rows/s of the
    /// producer's INSERTs, and jobs/s from the first claim to the last finish. Verified: every
    /// job done, each claimed once.
    async fn timed_run(
        &self,
        conn: &mut Conn,
        bin: &Path,
        config: &Path,
        keys: Option<u64>,
        n: usize,
    ) -> (f64, f64) {
        let t = Instant::now();
        insert_keyed(conn, n, keys).await;
        let inserted = n as f64 / t.elapsed().as_secs_f64();
        let workers = Workers(vec![self.start_of(bin, config, 1, "info")]);
        wait_none_left(conn).await;
        workers.stop();
        (inserted, drain_rate(conn, n as u64).await)
    }

    /// Index entries (Handler_read_* deltas) of a claim of 100 on a table of 100 pending jobs,
    /// and of the same behind `backlog_rows` blocked jobs of one key; and of a hand-off behind
    /// them that admits one, and of one that finds the slot held.
    async fn key_reads(&self) -> (u64, u64, (u64, u64)) {
        let who = myjob::store::jobs::Claimer {
            owner_server: "bench",
            worker: "bench",
        };
        let mut conn = self.fresh().await;
        self.insert(&mut conn, 100).await;
        conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();
        let clean = reads_of(&mut conn, async |c: &mut Conn| {
            claim_100(c, &who).await;
        })
        .await;
        let mut conn = self.fresh().await;
        insert_one_key(&mut conn, self.size.backlog_rows).await;
        self.insert(&mut conn, 100).await;
        conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();
        let behind = reads_of(&mut conn, async |c: &mut Conn| {
            claim_100(c, &who).await;
        })
        .await;
        let admitted = reads_of(&mut conn, async |c: &mut Conn| {
            let ok = myjob::store::jobs::keys::hand_off(c, "bench", b"hot", 1, Referee::Index)
                .await
                .unwrap();
            assert!(ok, "the hand-off admitted the key's first job");
        })
        .await;
        let refused = reads_of(&mut conn, async |c: &mut Conn| {
            let ok = myjob::store::jobs::keys::hand_off(c, "bench", b"hot", 1, Referee::Index)
                .await
                .unwrap();
            assert!(!ok, "the slot is held");
        })
        .await;
        (clean, behind, (admitted, refused))
    }
}

/// `n` pending jobs of 200 bytes in `bench` (blocked ones, with `keys` keys in turn), as an
/// application inserts them: 1,000 rows a statement.
async fn insert_keyed(conn: &mut Conn, n: usize, keys: Option<u64>) {
    let payload = "x".repeat(200);
    // Without keys, the statement any schema takes, the baseline's too.
    let (row, columns) = match keys {
        Some(_) => ("('bench', ?, ?)", "(queue, payload, concurrency_key)"),
        None => ("('bench', ?)", "(queue, payload)"),
    };
    for start in (0..n).step_by(1000) {
        let rows = (n - start).min(1000);
        let values = vec![row; rows].join(", ");
        let mut params: Vec<mysql_async::Value> = Vec::new();
        for i in start..start + rows {
            params.push(payload.as_str().into());
            if let Some(k) = keys {
                params.push(format!("k{}", i as u64 % k).into());
            }
        }
        conn.exec_drop(
            format!("INSERT INTO myjob_jobs {columns} VALUES {values}"),
            params,
        )
        .await
        .unwrap();
    }
}

/// `n` blocked jobs of the key `hot`.
async fn insert_one_key(conn: &mut Conn, n: usize) {
    for start in (0..n).step_by(1000) {
        let rows = (n - start).min(1000);
        let values = vec!["('bench', 'x', 'hot')"; rows].join(", ");
        conn.query_drop(format!(
            "INSERT INTO myjob_jobs (queue, payload, concurrency_key) VALUES {values}"
        ))
        .await
        .unwrap();
    }
}

/// Until no job is pending, blocked or claimed (probes of the claim index).
async fn wait_none_left(conn: &mut Conn) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let waiting: Option<u8> = conn
            .query_first(
                "SELECT 1 FROM myjob_jobs WHERE status IN ('pending', 'blocked', 'claimed') LIMIT 1",
            )
            .await
            .unwrap();
        if waiting.is_none() {
            return;
        }
        assert!(Instant::now() < deadline, "jobs still waiting after 600 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The index entries `f` reads, by the session's Handler_read_* counters, less what reading
/// them costs.
async fn reads_of(conn: &mut Conn, f: impl AsyncFnOnce(&mut Conn)) -> u64 {
    async fn reads(conn: &mut Conn) -> u64 {
        let rows: Vec<(String, u64)> = conn
            .query("SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read%'")
            .await
            .unwrap();
        rows.into_iter().map(|r| r.1).sum()
    }
    let a = reads(conn).await;
    let own = reads(conn).await - a;
    let before = reads(conn).await;
    f(conn).await;
    (reads(conn).await - before).saturating_sub(own)
}

/// Claims 100 jobs of the queue `bench` under batch 1, as the consumer would.
async fn claim_100(c: &mut Conn, who: &myjob::store::jobs::Claimer<'_>) {
    let batch = myjob::store::jobs::BatchId::new(1);
    myjob::store::jobs::claim(c, batch, "bench", 100, who, myjob::store::jobs::Lane::Whole)
        .await
        .unwrap();
}
