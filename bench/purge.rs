//! Item 10: `myjob stats` on a million rows, and claims and INSERTs while `myjob purge`
//! deletes them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::*;

use crate::harness::{mark, median, percentile, wait_queue_done, Bench, Workers, BIN};

impl Bench {
    /// Item 10: `myjob stats` on a table of `purge_rows` done rows and 400,000 pending ones
    /// (the probe's, below) against the same on an empty table (the command's fixed cost: start, connect, schema check); then a claim's
    /// p99 and an INSERT's p99 while `myjob purge` deletes those rows, against the same
    /// measured just before and just after without a purge. All the while a worker drains a
    /// queue that a producer (this process, timing its INSERTs) feeds 200 jobs/s, and a probe
    /// (this process too) claims 10 jobs of another queue every 20 ms with the worker's own
    /// claim statement, then marks them done.
    pub(crate) async fn purge(&mut self) {
        let rows = self.size.purge_rows;
        let config = self.config(8, &"myjob:noop".into(), "100ms");
        let stats_time = |config: &Path| {
            let mut times = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                let out = Command::new(BIN)
                    .args(["--config", config.to_str().unwrap(), "stats"])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "myjob stats: {out:?}");
                times.push(t.elapsed().as_secs_f64());
            }
            median(times)
        };
        let mut conn = self.fresh().await;
        let empty = stats_time(&config);
        let mut left = rows;
        while left > 0 {
            let chunk = left.min(1_000_000);
            conn.query_drop(format!(
                "INSERT INTO myjob_jobs (queue, payload, status, run_at, finished_at) \
                 SELECT 'old', REPEAT('x', 200), 'done', NOW(6) - INTERVAL 10 DAY, \
                     NOW(6) - INTERVAL 10 DAY FROM seq_1_to_{chunk}"
            ))
            .await
            .unwrap();
            left -= chunk;
        }
        conn.query_drop(
            "INSERT INTO myjob_jobs (queue, payload) SELECT 'probe', 'x' FROM seq_1_to_400000",
        )
        .await
        .unwrap();
        conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();
        let full = stats_time(&config);
        self.line(&format!(
            "| `myjob stats` with {rows} done rows and 400000 pending, s | {full:.3} | {:.2} of an empty table's ({empty:.3} s) | < 1 s {} |",
            full / empty,
            mark(full < 1.0)
        ));

        let workers = Workers(vec![self.start(&config, 1)]);
        let mut produced = 0u64;
        let mut batch = 1u64;
        let quiet = Duration::from_secs_f64(self.size.quiet_secs);
        let mut before = self
            .timed_load(None, quiet, &mut produced, &mut batch)
            .await;
        let started = Instant::now();
        let purge = Command::new(BIN)
            .args([
                "--config",
                config.to_str().unwrap(),
                "purge",
                "--done-older-than",
                "7d",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let during = self
            .timed_load(Some(purge), quiet, &mut produced, &mut batch)
            .await;
        let purge_secs = started.elapsed().as_secs_f64();
        let after = self
            .timed_load(None, quiet, &mut produced, &mut batch)
            .await;
        wait_queue_done(&mut conn, "bench", produced).await;
        workers.stop();
        let old: u64 = conn
            .query_first("SELECT COUNT(*) FROM myjob_jobs WHERE queue = 'old'")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(old, 0, "the purge deleted every old row");

        before.0.extend(after.0);
        before.1.extend(after.1);
        let p99 = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            percentile(&v, 0.99)
        };
        let (claim_quiet, claim_purge) = (p99(before.0), p99(during.0));
        let (insert_quiet, insert_purge) = (p99(before.1), p99(during.1));
        self.line(&format!(
            "| `myjob purge` of {rows} done rows while a worker drains a queue, s (rows/s) | {purge_secs:.0} ({:.0}) | | |",
            rows as f64 / purge_secs
        ));
        self.line(&format!(
            "| claim of 10 (claim, select, done), p99 ms, during the purge | {claim_purge:.2} | {:.2} of without ({claim_quiet:.2} ms) | ≤ 2 {} |",
            claim_purge / claim_quiet,
            mark(claim_purge / claim_quiet <= 2.0)
        ));
        self.line(&format!(
            "| producer's INSERT of one job, p99 ms, during the purge | {insert_purge:.2} | {:.2} of without ({insert_quiet:.2} ms) | ≤ 2 {} |",
            insert_purge / insert_quiet,
            mark(insert_purge / insert_quiet <= 2.0)
        ));
    }

    /// Claims and INSERTs timed, in ms, as [`Bench::purge`] describes, for `secs`, or until
    /// `purge` exits when given (it must exit 0).
    pub(crate) async fn timed_load(
        &self,
        mut purge: Option<Child>,
        secs: Duration,
        produced: &mut u64,
        batch: &mut u64,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut probe = self.conn().await;
        let mut producer = self.conn().await;
        let who = myjob::store::jobs::Claimer {
            owner_server: "bench",
            worker: "bench",
        };
        let (mut claims, mut inserts) = (Vec::new(), Vec::new());
        let end = Instant::now() + secs;
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut turn = 0u64;
        loop {
            match &mut purge {
                Some(child) => {
                    if let Some(status) = child.try_wait().unwrap() {
                        assert!(status.success(), "myjob purge exited with {status}");
                        break;
                    }
                }
                None if Instant::now() >= end => break,
                None => {}
            }
            tick.tick().await;
            turn += 1;
            let t = Instant::now();
            producer
                .query_drop("INSERT INTO myjob_jobs (queue, payload) VALUES ('bench', 'x')")
                .await
                .unwrap();
            inserts.push(t.elapsed().as_secs_f64() * 1000.0);
            *produced += 1;
            if turn.is_multiple_of(4) {
                let t = Instant::now();
                myjob::store::jobs::claim(
                    &mut probe,
                    myjob::store::jobs::BatchId::new(*batch),
                    "probe",
                    10,
                    &who,
                    myjob::store::jobs::Lane::Whole,
                )
                .await
                .unwrap();
                let got = myjob::store::jobs::read_batch(
                    &mut probe,
                    myjob::store::jobs::BatchId::new(*batch),
                    myjob::config::MAX_PAYLOAD_BYTES as u64,
                )
                .await
                .unwrap();
                assert_eq!(got.len(), 10, "the probe's queue ran dry");
                probe
                    .exec_drop(
                        "UPDATE myjob_jobs SET status = 'done', finished_at = NOW(6) WHERE batch_id = ?",
                        (*batch,),
                    )
                    .await
                    .unwrap();
                claims.push(t.elapsed().as_secs_f64() * 1000.0);
                *batch += 1;
            }
        }
        (claims, inserts)
    }
}
