//! Item 6: the claim's cost as finished rows pile up.

use std::time::Instant;

use mysql_async::prelude::*;

use crate::harness::{mark, median, Bench};

impl Bench {
    /// A claim of 100 at each size of the run, against 10k finished rows.
    pub(crate) async fn growth_item(&mut self) {
        let growth = self.table_growth().await;
        let base = growth[0].1;
        for (rows, ms) in &growth {
            let ratio = ms / base;
            let target = if *rows >= 1_000_000 {
                format!("≤ 1.5 {}", mark(ratio <= 1.5))
            } else {
                String::new()
            };
            self.line(&format!("| claim of 100, p50 ms, with {rows} done rows | {ms:.2} | {ratio:.2} of 10k | {target} |"));
        }
    }

    /// The median time of a claim of 100 (the real claim statement, with its SELECT) with N
    /// done rows behind 6,000 pending ones, one database per N. The sizes take turns, one
    /// claim each, so that the machine's noise falls on all of them alike: 5 rounds to warm
    /// up, then 50 timed.
    pub(crate) async fn table_growth(&self) -> Vec<(u64, f64)> {
        let sizes = self.size.growth.clone();
        let mut conns = Vec::new();
        for &rows in &sizes {
            let mut conn = self.fresh_named(&format!("myjob_bench_{rows}")).await;
            let mut left = rows;
            while left > 0 {
                let chunk = left.min(1_000_000);
                conn.query_drop(format!(
                    "INSERT INTO myjob_jobs (queue, payload, status) SELECT 'bench', 'x', 'done' FROM seq_1_to_{chunk}"
                ))
                .await
                .unwrap();
                left -= chunk;
            }
            self.insert(&mut conn, 6_000).await;
            conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();
            conns.push(conn);
        }
        let who = myjob::store::jobs::Claimer {
            owner_server: "bench",
            worker: "bench",
        };
        let mut times = vec![Vec::new(); sizes.len()];
        for batch in 1..=55u64 {
            for (conn, times) in conns.iter_mut().zip(&mut times) {
                let t = Instant::now();
                myjob::store::jobs::claim(
                    conn,
                    myjob::store::jobs::BatchId::new(batch),
                    "bench",
                    100,
                    &who,
                    myjob::store::jobs::Lane::Whole,
                )
                .await
                .unwrap();
                let got = myjob::store::jobs::read_batch(
                    conn,
                    myjob::store::jobs::BatchId::new(batch),
                    myjob::config::MAX_PAYLOAD_BYTES as u64,
                )
                .await
                .unwrap();
                assert_eq!(got.len(), 100);
                if batch > 5 {
                    times.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        let mut root = self.root().await;
        for &rows in &sizes {
            root.query_drop(format!("DROP DATABASE myjob_bench_{rows}"))
                .await
                .unwrap();
        }
        sizes
            .into_iter()
            .zip(times.into_iter().map(median))
            .collect()
    }
}
