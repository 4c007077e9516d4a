//! Item 1, the ceilings every other figure is a ratio to: how fast this machine spawns a
//! `cat`, and how fast one connection drains a queue with the batch_id pattern and no myjob.

use std::time::Instant;

use mysql_async::prelude::*;

use crate::harness::{busy_ticks, median, spawn_rate, ticks_us, Bench};

/// This run's ceilings.
pub(crate) struct Ceilings {
    /// `cat` spawns/s, at the best number in flight.
    pub(crate) spawn: f64,
    /// The machine's CPU per spawn there, in µs.
    pub(crate) spawn_cpu: f64,
    /// That number in flight.
    pub(crate) inflight: usize,
    /// Jobs/s of the raw claim loop.
    pub(crate) claim: f64,
}

impl Bench {
    /// Measures both ceilings and writes the table's head and their rows.
    pub(crate) async fn ceilings(&mut self) -> Ceilings {
        let (spawn, spawn_cpu, inflight) = self.spawn_ceiling().await;
        let claim = self.claim_ceiling().await;
        self.line("| what | figure | ratio | target |\n|---|---|---|---|");
        self.line(&format!("| ceiling: `cat` spawns/s (tokio, 1 KiB stdin, best of 8/16/32 in flight) | {spawn:.0} | 1 | |"));
        self.line(&format!(
            "| ceiling: CPU µs per `cat` spawn, whole machine | {spawn_cpu:.0} | | |"
        ));
        self.line(&format!("| ceiling: raw batch_id claim loop, jobs/s (claim 100 + select + batched done) | {claim:.0} | 1 | |"));
        Ceilings {
            spawn,
            spawn_cpu,
            inflight,
            claim,
        }
    }

    /// How many `cat` processes per second tokio spawns and reaps, each fed 1 KiB on stdin
    /// with stdout to /dev/null: the best of 8, 16 and 32 in flight (each the median of
    /// `repeats`), and the machine's CPU per spawn there, in µs.
    pub(crate) async fn spawn_ceiling(&self) -> (f64, f64, usize) {
        let mut best = (0.0f64, 0.0f64, 0);
        for inflight in [8, 16, 32] {
            let mut rates = Vec::new();
            let mut cpu = Vec::new();
            for _ in 0..self.size.repeats {
                let busy = busy_ticks();
                let (n, secs) = spawn_rate(inflight, self.size.spawn_secs).await;
                cpu.push(ticks_us(busy_ticks() - busy) / n as f64);
                rates.push(n as f64 / secs);
            }
            let rate = median(rates);
            if rate > best.0 {
                best = (rate, median(cpu), inflight);
            }
        }
        best
    }

    /// One connection, no myjob: claim 100 with the batch_id pattern, read them back, mark
    /// them done in one UPDATE; jobs/s until the table is drained.
    pub(crate) async fn claim_ceiling(&self) -> f64 {
        let mut rates = Vec::new();
        for _ in 0..self.size.repeats {
            let mut conn = self.fresh().await;
            self.insert(&mut conn, self.size.jobs).await;
            let start = Instant::now();
            let mut done = 0usize;
            let mut batch = 1u64;
            loop {
                conn.exec_drop(
                    "UPDATE myjob_jobs FORCE INDEX (myjob_jobs_claim) SET status = 'claimed', batch_id = ?, \
                     owner_conn = CONNECTION_ID(), claimed_at = NOW(6), attempts = attempts + 1 \
                     WHERE status = 'pending' AND queue = 'bench' AND run_at <= NOW(6) \
                     ORDER BY status, queue, priority DESC, id LIMIT 100",
                    (batch,),
                )
                .await
                .unwrap();
                let ids: Vec<u64> = conn
                    .exec("SELECT id FROM myjob_jobs WHERE batch_id = ?", (batch,))
                    .await
                    .unwrap();
                if ids.is_empty() {
                    break;
                }
                let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
                conn.exec_drop(
                    format!("UPDATE myjob_jobs SET status = 'done', finished_at = NOW(6) WHERE batch_id = ? AND id IN ({list})"),
                    (batch,),
                )
                .await
                .unwrap();
                done += ids.len();
                batch += 1;
            }
            rates.push(done as f64 / start.elapsed().as_secs_f64());
        }
        median(rates)
    }
}
