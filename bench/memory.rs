//! Item 18: myjob's memory against the size of its jobs' payloads. One instance at
//! concurrency 8 runs jobs of one payload size on the minimal persistent handler (which
//! reads each payload whole), and its peak RSS is set against what the payloads of the jobs
//! running at once weigh (8 × the size) and against the bound the docs give, 1.5 × (8 + 100)
//! × `max_payload_bytes` plus 20 MiB. Last, payloads over `max_payload_bytes`: they fail
//! unread, and the peak stays where it is without them.

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::harness::{mark, peak_rss_kib, Bench, Handler, Workers};

const CONCURRENCY: usize = 8;
const MIB: f64 = 1024.0 * 1024.0;
/// The column's limit, and so the largest `max_payload_bytes`.
const MAX: u64 = myjob::config::MAX_PAYLOAD_BYTES as u64;

impl Bench {
    pub(crate) async fn memory_item(&mut self) {
        let smoke = self.size.jobs < 1000;
        let (sizes, jobs): (&[u64], usize) = if smoke {
            (&[1024, 1 << 20], 8)
        } else {
            (&[1024, 1 << 20, 4 << 20, 15 << 20], 48)
        };
        let base_kib = self.peak_with(1, 0, MAX).await;
        self.line(&format!(
            "| peak RSS, concurrency 8, no job run, MiB | {:.1} | 1 | |",
            base_kib as f64 / 1024.0
        ));
        for &size in sizes {
            let peak = self.peak_with(size, jobs, MAX).await;
            let running = CONCURRENCY as u64 * size;
            let bound = 1.5 * (CONCURRENCY + 100) as f64 * size as f64 / MIB + 20.0;
            let mib = peak as f64 / 1024.0;
            self.line(&format!(
                "| peak RSS, {jobs} jobs of {}, minimal persistent handler, MiB | {mib:.1} | above no job run: {:.2} × 8 payloads ({}) | ≤ documented bound ({bound:.0}) {} |",
                size_name(size),
                (mib - base_kib as f64 / 1024.0).max(0.0) * MIB / running as f64,
                size_name(running),
                mark(mib <= bound)
            ));
        }
        // Over the limit: they fail unread.
        let big = *sizes.last().unwrap_or(&1024);
        let limit = (big / 16).max(1);
        let peak = self.peak_with(big, jobs, limit).await;
        self.line(&format!(
            "| peak RSS, {jobs} jobs of {} over max_payload_bytes = {}, failed unread, MiB | {:.1} | {:.2} of no job run | ≤ 1.25 {} |",
            size_name(big),
            size_name(limit),
            peak as f64 / 1024.0,
            peak as f64 / base_kib as f64,
            mark(peak as f64 <= 1.25 * base_kib as f64)
        ));
    }

    /// The peak RSS in KiB of an instance that finished `jobs` jobs of `size` bytes with
    /// `max_payload_bytes = limit`.
    async fn peak_with(&self, size: u64, jobs: usize, limit: u64) -> u64 {
        let mut conn = self.fresh().await;
        insert_sized(&mut conn, size, jobs).await;
        let config = self.config(CONCURRENCY, &Handler::minimal_persistent(), "100ms");
        let text = std::fs::read_to_string(&config).unwrap().replace(
            "[worker]\n",
            &format!("[worker]\nmax_payload_bytes = {limit}\n"),
        );
        std::fs::write(&config, text).unwrap();
        let workers = Workers(vec![self.start(&config, 1)]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        loop {
            let left: u64 = conn
                .query_first(
                    "SELECT COUNT(*) FROM myjob_jobs WHERE status NOT IN ('done', 'failed')",
                )
                .await
                .unwrap()
                .unwrap();
            if left == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "jobs left after 600 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // Give the instance its first claim's worth of time when there were no jobs.
        if jobs == 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let failed: u64 = conn
            .query_first("SELECT COUNT(*) FROM myjob_jobs WHERE status = 'failed'")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(failed > 0, size > limit, "only jobs over the limit fail");
        let peak = peak_rss_kib(workers.0[0].id());
        workers.stop();
        peak
    }
}

/// `jobs` pending jobs of `size` bytes each, made on the server (the INSERTs stay small).
async fn insert_sized(conn: &mut Conn, size: u64, jobs: usize) {
    for _ in 0..jobs {
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload) VALUES ('bench', REPEAT('x', ?))",
            (size,),
        )
        .await
        .unwrap();
    }
}

fn size_name(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
