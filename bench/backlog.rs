//! Items 8, 12 and 21: the drain of due jobs behind a backlog of another queue's jobs and of
//! its own queue's future ones, against a clean table; behind future jobs alone, inserted by
//! plain SQL just before, with 1 and 4 instances; and right after a burst of its own queue's
//! jobs finished at once, whose index entries InnoDB's purge has yet to remove.

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::harness::{mark, median, wait_queue_done, Bench, Workers};

impl Bench {
    /// The drain on a clean table and behind the backlog.
    pub(crate) async fn backlog_item(&mut self) {
        let (clean, behind) = self.backlog(1, Behind::FutureAndOther).await;
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
            let (clean, behind) = self.backlog(instances, Behind::Future).await;
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

    /// Item 21: the drain of due jobs right after a burst of its queue's jobs finished at
    /// once. Each finished job leaves a delete-marked entry in the claim index's `pending`
    /// range of its queue, which every claim walks past until InnoDB's purge has removed it.
    pub(crate) async fn burst_item(&mut self) {
        let (clean, behind) = self.backlog(1, Behind::Burst).await;
        self.line(&format!(
            "| drain {} due `/bin/true` jobs, 1 instance × 8, right after {} jobs of its queue finished at once, s | {behind:.2} | {:.2} of clean ({clean:.2}) | ≤ 1.2 {} |",
            self.size.backlog_jobs,
            self.size.burst_rows,
            behind / clean,
            mark(behind / clean <= 1.2)
        ));
    }

    /// Seconds to drain `backlog_jobs` due `/bin/true` jobs with `instances` × 8 (from the
    /// first claim to the last finish as the table records them) on a clean table, and
    /// `behind` what [`Behind`] names. Medians of `repeats`, each verified.
    pub(crate) async fn backlog(&self, instances: usize, behind_what: Behind) -> (f64, f64) {
        let n = self.size.backlog_jobs;
        let mut clean = Vec::new();
        let mut behind = Vec::new();
        for _ in 0..self.size.repeats {
            for with_backlog in [false, true] {
                let mut conn = self.fresh().await;
                let done_before = match with_backlog {
                    true => self.lay(&mut conn, behind_what).await,
                    false => 0,
                };
                let first: u64 = conn
                    .query_first("SELECT IFNULL(MAX(id), 0) + 1 FROM myjob_jobs")
                    .await
                    .unwrap()
                    .unwrap();
                self.insert(&mut conn, n).await;
                conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();
                let config = self.config(8, &"/bin/true".into(), "100ms");
                let workers = Workers((1..=instances).map(|i| self.start(&config, i)).collect());
                wait_queue_done(&mut conn, "bench", n as u64 + done_before).await;
                workers.stop();
                let secs: f64 = conn
                    .exec_first(
                        "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), MAX(finished_at)) / 1e6 \
                         FROM myjob_jobs WHERE status = 'done' AND id >= ?",
                        (first,),
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

    /// Lays `behind` in the table; returns how many of its jobs are done.
    async fn lay(&self, conn: &mut Conn, behind: Behind) -> u64 {
        let rows = self.size.backlog_rows;
        let future = ("bench", "NOW(6) + INTERVAL 1 DAY");
        let kinds = match behind {
            Behind::Future => vec![future],
            Behind::FutureAndOther => vec![future, ("other", "NOW(6)")],
            Behind::Burst => return self.burst(conn).await,
        };
        for (queue, run_at) in kinds {
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
        0
    }

    /// `burst_rows` jobs of `bench` inserted, then finished in one transaction, claim and
    /// outcome at once: InnoDB's purge then has all of their old index entries to remove at
    /// once (about 6 s for 300,000 on this machine's MariaDB), and the drain starts before it
    /// has. Returns how many.
    async fn burst(&self, conn: &mut Conn) -> u64 {
        let rows = self.size.burst_rows;
        self.insert(conn, rows).await;
        conn.query_drop(
            "UPDATE myjob_jobs SET status = 'done', attempts = 1, batch_id = 1, \
             claimed_at = NOW(6), finished_at = NOW(6) \
             WHERE queue = 'bench' AND status = 'pending'",
        )
        .await
        .unwrap();
        rows as u64
    }
}

/// What a drain runs behind.
#[derive(Clone, Copy)]
pub(crate) enum Behind {
    /// `backlog_rows` jobs of its own queue not yet due, inserted just before by plain SQL as a
    /// producer would (a campaign for tomorrow).
    Future,
    /// The same, and as many due jobs of a queue no instance serves.
    FutureAndOther,
    /// `burst_rows` jobs of its own queue finished at once just before.
    Burst,
}
