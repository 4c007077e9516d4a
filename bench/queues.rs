//! Item 11: several queues cost nothing. An instance serving Q queues of which one is busy,
//! against the same instance serving that queue alone, with a `cat` per job and with a
//! minimal persistent handler; and with every queue busy, how evenly the slots are shared.

use std::time::{Duration, Instant};

use mysql_async::prelude::*;

use crate::harness::{mark, median, queue_name, Bench, Handler, Workers};

impl Bench {
    /// Q = 1, 2 and 10 with one busy, per handler; then Q = 10, all busy. The three take
    /// turns, one run each per repeat, and each ratio is the median of the repeats' own: the
    /// machine's speed drifts within minutes, and runs of one Q after the other would
    /// measure the drift.
    pub(crate) async fn queues_item(&mut self) {
        const QS: [usize; 3] = [1, 2, 10];
        for (name, handler) in [
            ("`cat` per job", Handler::from("/bin/cat")),
            ("minimal persistent", Handler::minimal_persistent()),
        ] {
            let repeats = std::mem::replace(&mut self.size.repeats, 1);
            let mut rates = vec![Vec::new(); QS.len()];
            for _ in 0..repeats {
                for (i, q) in QS.into_iter().enumerate() {
                    let handler = Handler {
                        other_queues: q - 1,
                        ..handler.clone()
                    };
                    rates[i].push(self.throughput(1, 8, handler, 0).await.rate);
                }
            }
            self.size.repeats = repeats;
            self.line(&format!(
                "| {name}, 1 instance × 8 serving its one busy queue, jobs/s | {:.0} | 1 | |",
                median(rates[0].clone())
            ));
            for (i, q) in QS.into_iter().enumerate().skip(1) {
                let ratio = median(rates[i].iter().zip(&rates[0]).map(|(r, a)| r / a).collect());
                self.line(&format!(
                    "| the same serving {q} queues, {} of them empty, jobs/s | {:.0} | {ratio:.2} of one queue | ≥ 0.90 {} |",
                    q - 1,
                    median(rates[i].clone()),
                    mark(ratio >= 0.9)
                ));
            }
        }
        let spread = self.shares(10).await;
        self.line(&format!(
            "| 10 queues all busy, `cat` per job: the largest gap between a queue's share of the jobs done by mid-drain and 1/10 | | {spread:.2} of 1/10 | ≤ 0.25 {} |",
            mark(spread <= 0.25)
        ));
    }

    /// `queues` queues of `jobs / queues` jobs each, one instance × 8 serving them all: when
    /// half the jobs are done, each queue's share of them, as a fraction of 1/`queues` off
    /// (the largest of those, median of `repeats`).
    async fn shares(&self, queues: usize) -> f64 {
        let per_queue = self.size.jobs / queues;
        let mut spreads = Vec::new();
        for _ in 0..self.size.repeats {
            let mut conn = self.fresh().await;
            for q in 0..queues {
                self.insert_into(&mut conn, &queue_name(q), per_queue).await;
            }
            let handler = Handler {
                other_queues: queues - 1,
                ..Handler::from("/bin/cat")
            };
            let config = self.config(8, &handler, "100ms");
            let workers = Workers(vec![self.start(&config, 1)]);
            let half = (per_queue * queues / 2) as u64;
            let deadline = Instant::now() + Duration::from_secs(600);
            let done: Vec<(Vec<u8>, u64)> = loop {
                let done: Vec<(Vec<u8>, u64)> = conn
                    .query(
                        "SELECT queue, COUNT(*) FROM myjob_jobs WHERE status = 'done' GROUP BY queue",
                    )
                    .await
                    .unwrap();
                if done.iter().map(|d| d.1).sum::<u64>() >= half {
                    break done;
                }
                assert!(Instant::now() < deadline, "not half done after 600 s");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            workers.stop();
            let total: u64 = done.iter().map(|d| d.1).sum();
            let fair = 1.0 / queues as f64;
            let spread = (0..queues)
                .map(|q| {
                    let name = queue_name(q);
                    let n = done
                        .iter()
                        .find(|d| d.0 == name.as_bytes())
                        .map_or(0, |d| d.1);
                    (n as f64 / total as f64 - fair).abs() / fair
                })
                .fold(0.0, f64::max);
            spreads.push(spread);
        }
        median(spreads)
    }
}
