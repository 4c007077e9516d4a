//! Item 5: what an idle instance costs the server and the machine.

use std::time::{Duration, Instant};

use mysql_async::prelude::*;

use crate::harness::{cpu_ticks, mark, ticks_us, Bench, Handler, Workers};

impl Bench {
    /// Queries/s and CPU of an idle instance at concurrency 64, serving 1 queue and 10.
    pub(crate) async fn idle_item(&mut self) {
        for queues in [1, 10] {
            let (qps, cpu) = self.idle(queues).await;
            self.line(&format!(
                "| idle, concurrency 64, {queues} queue(s): queries/s | {qps:.1} | | ≤ 5 {} |",
                mark(qps <= 5.0)
            ));
            self.line(&format!(
                "| idle, concurrency 64, {queues} queue(s): CPU % of a core | {cpu:.2} | | < 1 {} |",
                mark(cpu < 1.0)
            ));
        }
    }

    /// An idle instance at concurrency 64 serving `queues` queues: the queries/s it sends
    /// (the server's Questions, less this probe's own) and its CPU, over `idle_secs`.
    pub(crate) async fn idle(&self, queues: usize) -> (f64, f64) {
        let mut conn = self.fresh().await;
        let handler = Handler {
            other_queues: queues - 1,
            ..Handler::from("/bin/cat")
        };
        let config = self.config(64, &handler, "500ms");
        let workers = Workers(vec![self.start(&config, 1)]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pid = workers.0[0].id();
        let questions = |rows: Vec<(String, u64)>| rows[0].1;
        let q0 = questions(
            conn.query("SHOW GLOBAL STATUS LIKE 'Questions'")
                .await
                .unwrap(),
        );
        let (c0, t0) = (cpu_ticks(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs_f64(self.size.idle_secs)).await;
        let q1 = questions(
            conn.query("SHOW GLOBAL STATUS LIKE 'Questions'")
                .await
                .unwrap(),
        );
        let (c1, secs) = (cpu_ticks(pid), t0.elapsed().as_secs_f64());
        workers.stop();
        // The probe's second SHOW STATUS is counted in q1; anything else is the worker's.
        let qps = (q1 - q0 - 1) as f64 / secs;
        let cpu = ticks_us(c1 - c0) / 1e6 / secs * 100.0;
        (qps, cpu)
    }
}
