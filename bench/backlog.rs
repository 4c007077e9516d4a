//! Items 8 and 12: the drain of due jobs behind a backlog of another queue's jobs and of its
//! own queue's future ones, against a clean table; and behind future jobs alone, inserted by
//! plain SQL just before, with 1 and 4 instances.

use mysql_async::prelude::*;

use crate::harness::{mark, median, wait_queue_done, Bench, Workers};

impl Bench {
    /// The drain on a clean table and behind the backlog.
    pub(crate) async fn backlog_item(&mut self) {
        let (clean, behind) = self.backlog(1, true).await;
        self.line(&format!(
            "| drain {} due `/bin/true` jobs, 1 instance × 8, clean table, s | {clean:.2} | 1 | |",
            self.size.backlog_jobs
        ));
        self.line(&format!(
            "| the same behind {} pending rows of another queue and {} of its own not yet due, s | {behind:.2} | {:.2} of clean | ≤ 1.5 {} |",
            self.size.backlog_rows,
            self.size.backlog_rows,
            behind / clean,
            mark(behind / clean <= 1.5)
        ));
    }

    /// Item 12: 200,000 jobs for tomorrow inserted by plain SQL (a reminder campaign) just
    /// before a drain of due jobs of the same queue, with 1 and 4 instances each staging:
    /// scheduling must not hold up claims.
    pub(crate) async fn scheduled_item(&mut self) {
        for instances in [1, 4] {
            let (clean, behind) = self.backlog(instances, false).await;
            self.line(&format!(
                "| drain {} due jobs, {instances} instance(s) × 8, clean table, s | {clean:.2} | 1 | |",
                self.size.backlog_jobs
            ));
            self.line(&format!(
                "| the same right after {} plain INSERTs of future jobs of its queue, s | {behind:.2} | {:.2} of clean | ≤ 1.5 {} |",
                self.size.backlog_rows,
                behind / clean,
                mark(behind / clean <= 1.5)
            ));
        }
    }

    /// Seconds to drain `backlog_jobs` due `/bin/true` jobs with `instances` × 8 (from the
    /// first claim to the last finish as the table records them) on a clean table, and behind
    /// `backlog_rows` jobs of its own queue not yet due, inserted just before by plain SQL as
    /// a producer would (a campaign for tomorrow), and with `other` as many due jobs of a
    /// queue no instance serves. Medians of `repeats`, each verified.
    pub(crate) async fn backlog(&self, instances: usize, other: bool) -> (f64, f64) {
        let n = self.size.backlog_jobs;
        let rows = self.size.backlog_rows;
        let mut clean = Vec::new();
        let mut behind = Vec::new();
        let mut kinds = vec![("bench", "NOW(6) + INTERVAL 1 DAY")];
        if other {
            kinds.push(("other", "NOW(6)"));
        }
        for _ in 0..self.size.repeats {
            for with_backlog in [false, true] {
                let mut conn = self.fresh().await;
                if with_backlog {
                    for &(queue, run_at) in &kinds {
                        for start in (0..rows).step_by(1000) {
                            let k = (rows - start).min(1000);
                            let values = vec![format!("('{queue}', 'x', {run_at})"); k].join(", ");
                            conn.query_drop(format!(
                                "INSERT INTO myjob_jobs (queue, payload, run_at) VALUES {values}"
                            ))
                            .await
                            .unwrap();
                        }
                    }
                }
                self.insert(&mut conn, n).await;
                conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();
                let config = self.config(8, &"/bin/true".into(), "100ms");
                let workers = Workers((1..=instances).map(|i| self.start(&config, i)).collect());
                wait_queue_done(&mut conn, "bench", n as u64).await;
                workers.stop();
                let secs: f64 = conn
                    .query_first(
                        "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), MAX(finished_at)) / 1e6 \
                         FROM myjob_jobs WHERE status = 'done'",
                    )
                    .await
                    .unwrap()
                    .unwrap();
                if with_backlog {
                    behind.push(secs);
                } else {
                    clean.push(secs);
                }
            }
        }
        (median(clean), median(behind))
    }
}
