//! Items 2, 3 and 7: jobs/s with a `cat` per job against the spawn ceiling, the no-op
//! handler against the claim ceiling, and the peak RSS of an instance at concurrency 64.

use crate::ceilings::Ceilings;
use crate::harness::{mark, Bench, Cpu};

impl Bench {
    /// `cat` per job, 1 and 2 instances × 8, 32 and 64 slots; the no-op handler at 8, 32 and
    /// 64; the peak RSS of the runs at 64.
    pub(crate) async fn throughput_items(&mut self, c: &Ceilings) {
        // Each run is paired with a spawn ceiling measured just before it: the machine's
        // speed drifts by a third within minutes, and a ratio to a ceiling of another minute
        // would measure the drift.
        let (mut best, mut best_rate) = (0.0f64, 0.0f64);
        let mut best_cpu = Cpu::default();
        let (mut at64, mut at64_rate) = (0.0f64, 0.0f64);
        let mut rss64 = 0u64;
        for instances in [1, 2] {
            for concurrency in [8, 32, 64] {
                let run = self
                    .throughput(instances, concurrency, "/bin/cat", c.inflight)
                    .await;
                let rate = run.rate;
                if run.of_spawn > best {
                    (best, best_rate, best_cpu) = (run.of_spawn, rate, run.cpu);
                }
                if concurrency == 64 {
                    if run.of_spawn > at64 {
                        (at64, at64_rate) = (run.of_spawn, rate);
                    }
                    rss64 = rss64.max(run.peak_kib);
                }
                self.line(&format!(
                    "| `cat` per job: {instances} instance(s) × concurrency {concurrency}, jobs/s | {rate:.0} | {:.2} of spawn | |",
                    run.of_spawn
                ));
            }
        }
        self.line(&format!(
            "| `cat` per job: best | {best_rate:.0} | {best:.2} of spawn | ≥ 0.90 {} |",
            mark(best >= 0.90)
        ));
        // On a machine the spawns keep busy, jobs/s over spawns/s is about the CPU of a spawn
        // over the CPU of a job: what myjob and the server add per job is what the ratio loses.
        self.line(&format!(
            "| `cat` per job: best, CPU µs per job, whole machine (of it myjob / MariaDB) | {:.0} ({:.0} / {:.0}) | {:.2} = spawn's CPU / job's | |",
            best_cpu.all,
            best_cpu.myjob,
            best_cpu.db,
            c.spawn_cpu / best_cpu.all
        ));
        // Configs name handlers as people type them, found on PATH: the same spawns.
        let named = self.throughput(1, 32, "cat", c.inflight).await;
        self.line(&format!(
            "| `cat` per job, named without its path (`command = [\"cat\"]`), 1 × 32, jobs/s (CPU µs per job of myjob) | {:.0} ({:.0}) | {:.2} of spawn | ≥ 0.90 {} |",
            named.rate,
            named.cpu.myjob,
            named.of_spawn,
            mark(named.of_spawn >= 0.90)
        ));
        self.line(&format!(
            "| `cat` per job: concurrency 64 | {at64_rate:.0} | {at64:.2} of spawn | ≥ 0.80 {} |",
            mark(at64 >= 0.80)
        ));
        self.line(&format!(
            "| peak RSS of `myjob run`, concurrency 64, `cat` per job, MiB | {:.1} | | ≤ 20 {} |",
            rss64 as f64 / 1024.0,
            mark(rss64 <= 20 * 1024)
        ));

        // 3. The queue's own cost: the no-op handler.
        let mut core = Vec::new();
        for concurrency in [8, 32, 64] {
            let rate = self.throughput(1, concurrency, "myjob:noop", 0).await.rate;
            core.push(rate);
            self.line(&format!(
                "| no-op handler: 1 instance × concurrency {concurrency}, jobs/s | {rate:.0} | {:.2} of claim | ≥ 0.50 {} |",
                rate / c.claim,
                mark(rate / c.claim >= 0.50)
            ));
        }
        let flat = core[2] / core[0];
        self.line(&format!(
            "| no-op handler: concurrency 64 / concurrency 8 | | {flat:.2} | ≥ 0.80 {} |",
            mark(flat >= 0.80)
        ));
    }
}
