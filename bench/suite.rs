//! Which items a run measures, in order, and the flags that pick one item alone.

use std::time::Instant;

use crate::backlog::Behind;
use crate::harness::Bench;

impl Bench {
    pub(crate) async fn run(&mut self, smoke: bool) {
        let alone = |flag: &str| std::env::args().any(|a| a == flag);
        if alone("--latency-only") {
            // For looking at the latency figure alone: three runs of item 4.
            for _ in 0..3 {
                let (p50, p99, poll) = self.latency().await;
                println!(
                    "pickup latency: p50 {p50:.0} ms, p99 {p99:.0} ms (poll_interval {poll} ms)"
                );
            }
            return;
        }
        if alone("--growth-only") {
            // For working on item 6: the claim's cost as finished rows grow, alone.
            for (rows, ms) in self.table_growth().await {
                println!("claim of 100 with {rows} done rows: p50 {ms:.2} ms");
            }
            return;
        }
        if alone("--backlog-only") {
            // For working on item 8: the claim behind a backlog alone.
            let (clean, behind) = self.backlog(1, Behind::FutureAndOther).await;
            println!(
                "drain of {} due jobs: clean {clean:.2} s, behind the backlog {behind:.2} s = {:.2} of clean",
                self.size.backlog_jobs,
                behind / clean
            );
            return;
        }
        let head = "| what | figure | ratio | target |\n|---|---|---|---|";
        if alone("--burst-only") {
            // For working on item 21 alone.
            self.line(head);
            self.burst_item().await;
            return;
        }
        if alone("--persistent-only") {
            // For working on item 9 alone, with the spawn ceiling it is compared to.
            let (spawn, _, _) = self.spawn_ceiling().await;
            self.line(head);
            self.persistent(spawn).await;
            return;
        }
        if alone("--purge-only") {
            // For working on item 10 alone.
            self.line(head);
            self.purge().await;
            return;
        }
        if alone("--queues-only") {
            // For working on item 11 alone.
            self.line(head);
            self.queues_item().await;
            return;
        }
        if alone("--scheduled-only") {
            // For working on item 12 alone.
            self.line(head);
            self.scheduled_item().await;
            return;
        }
        if alone("--idle-only") {
            // For working on item 5 alone.
            self.line(head);
            self.idle_item().await;
            return;
        }
        if alone("--heal-only") {
            // For working on item 13 alone.
            self.line(head);
            self.heal_item().await;
            // 14. What a fleet costs the server.
            self.capacity_item().await;
            return;
        }
        if alone("--capacity-only") {
            // For working on item 14 alone.
            self.line(head);
            self.capacity_item().await;
            return;
        }
        if alone("--metrics-only") {
            // For working on item 15 alone.
            self.line(head);
            self.metrics_item().await;
            return;
        }
        if alone("--logging-only") {
            // For working on item 16 alone.
            self.line(head);
            self.logging_item().await;
            return;
        }
        if alone("--flow-only") {
            // For working on item 17 alone.
            self.line(head);
            self.flow_item().await;
            return;
        }
        if alone("--memory-only") {
            // For working on item 18 alone.
            self.line(head);
            self.memory_item().await;
            return;
        }
        if alone("--storage-only") {
            // For working on item 19 alone.
            self.line(head);
            self.storage_item().await;
            return;
        }
        if alone("--galera-only") {
            // For working on item 20 alone.
            self.line(head);
            self.galera_item().await;
            return;
        }
        if alone("--cat-only") {
            // For working on item 2: the spawn ceiling, then `cat` per job at concurrency 32,
            // with where the CPU goes.
            let (spawn, spawn_cpu, inflight) = self.spawn_ceiling().await;
            println!("ceiling: {spawn:.0} cat spawns/s, {spawn_cpu:.0} µs CPU per spawn");
            for (instances, cat) in [(1, "/bin/cat"), (2, "/bin/cat"), (1, "cat")] {
                let run = self.throughput(instances, 32, cat, inflight).await;
                println!(
                    "{cat}, {instances} instance(s) x 32: {:.0} jobs/s = {:.2} of spawn; CPU µs per job {:.0} (myjob {:.0}, MariaDB {:.0}); spawn's / job's {:.2}",
                    run.rate,
                    run.of_spawn,
                    run.cpu.all,
                    run.cpu.myjob,
                    run.cpu.db,
                    spawn_cpu / run.cpu.all
                );
            }
            return;
        }
        let started = Instant::now();
        self.line(&format!(
            "# myjob benchmark{}\n\n{} cores, {}, MariaDB {}; {} jobs of 200 bytes per throughput run; medians of {}.\n",
            if smoke { " (smoke run: small sizes, figures not meaningful)" } else { "" },
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::fs::read_to_string("/proc/cpuinfo")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .unwrap_or("?")
                .trim(),
            self.server_version().await,
            self.size.jobs,
            self.size.repeats,
        ));

        // 1. Ceilings first; 2, 3 and 7. throughput against them.
        let ceilings = self.ceilings().await;
        self.throughput_items(&ceilings).await;
        // 4. Pickup latency; 5. idle cost; 6. table growth; 8. the claim behind a backlog.
        self.latency_item().await;
        self.idle_item().await;
        self.growth_item().await;
        self.backlog_item().await;
        // 9. Persistent handlers; 10. operations on a million rows.
        self.persistent(ceilings.spawn).await;
        self.purge().await;
        // 11. Several queues; 12. bulk scheduling; 13. a crash's heal under systemd.
        self.queues_item().await;
        self.scheduled_item().await;
        self.heal_item().await;
        // 14. What a fleet costs the server.
        self.capacity_item().await;
        // 15. What the metrics cost; 16. what the log costs.
        self.metrics_item().await;
        self.logging_item().await;
        // 17. What concurrency keys cost; 18. memory against payload size.
        self.flow_item().await;
        self.memory_item().await;
        // 19. The storage's hot path against myjob before its second design.
        self.storage_item().await;
        // 20. A Galera cluster's conflicts, against myjob before its second design.
        self.galera_item().await;
        // 21. A drain right after a burst of finished jobs.
        self.burst_item().await;

        self.line(&format!(
            "\nThe claim, as EXPLAIN shows it:\n\n```\n{}\n```",
            self.explain().await
        ));
        self.line(&format!(
            "\nMeasured in {:.0} s by `bench/run{}`.",
            started.elapsed().as_secs_f64(),
            if smoke { " --smoke" } else { "" }
        ));
        self.save();
    }
}
