//! Item 4: pickup latency, from a job's INSERT to its handler's start, on an idle instance.

use std::time::{Duration, Instant};

use mysql_async::prelude::*;

use crate::harness::{chmod_x, mark, median, percentile, wait_queue_done, Bench, Workers};

impl Bench {
    /// The medians of `repeats` runs' p50 and p99, against the poll interval.
    pub(crate) async fn latency_item(&mut self) {
        let mut runs = Vec::new();
        for _ in 0..self.size.repeats {
            runs.push(self.latency().await);
        }
        let poll = runs[0].2;
        let p50 = median(runs.iter().map(|r| r.0).collect());
        let p99 = median(runs.iter().map(|r| r.1).collect());
        self.line(&format!(
            "| pickup latency p50, ms (poll_interval {poll} ms) | {p50:.0} | {:.2} of poll | ≤ 0.60 {} |",
            p50 / poll,
            mark(p50 <= 0.6 * poll)
        ));
        self.line(&format!(
            "| pickup latency p99, ms | {p99:.0} | {:.2} of poll | ≤ poll + 20 ms {} |",
            p99 / poll,
            mark(p99 <= poll + 20.0)
        ));
    }

    /// Idle workers; a job every 50 ms; the time from INSERT (created_at) to the handler's
    /// start (a timestamp it writes). Returns p50 and p99 in ms, and the poll interval.
    pub(crate) async fn latency(&self) -> (f64, f64, f64) {
        let poll_ms = 500.0; // the default poll_interval
        let mut conn = self.fresh().await;
        let record = self.dir.join("starts");
        let handler = self.dir.join("stamp.sh");
        std::fs::write(
            &handler,
            format!(
                "#!/bin/sh\necho \"$MYJOB_JOB_ID $(date +%s.%N)\" >> {}\n",
                record.display()
            ),
        )
        .unwrap();
        chmod_x(&handler);
        let _ = std::fs::remove_file(&record);
        let config = self.config(8, &handler.to_str().unwrap().into(), "500ms");
        let workers = Workers(vec![self.start(&config, 1)]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let end = Instant::now() + Duration::from_secs_f64(self.size.latency_secs);
        let mut n = 0u64;
        while Instant::now() < end {
            conn.query_drop("INSERT INTO myjob_jobs (queue, payload) VALUES ('bench', 'x')")
                .await
                .unwrap();
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        wait_queue_done(&mut conn, "bench", n).await;
        workers.stop();
        let created: Vec<(u64, f64)> = conn
            .query("SELECT id, UNIX_TIMESTAMP(created_at) FROM myjob_jobs")
            .await
            .unwrap();
        let starts = std::fs::read_to_string(&record).unwrap();
        let mut lat: Vec<f64> = starts
            .lines()
            .filter_map(|l| {
                let (id, t) = l.split_once(' ')?;
                let id: u64 = id.parse().ok()?;
                let t: f64 = t.parse().ok()?;
                let c = created.iter().find(|c| c.0 == id)?.1;
                Some((t - c) * 1000.0)
            })
            .collect();
        assert_eq!(lat.len() as u64, n, "every job started once");
        lat.sort_by(f64::total_cmp);
        (percentile(&lat, 0.50), percentile(&lat, 0.99), poll_ms)
    }
}
