//! Item 20: a Galera cluster, 4 instances over its 3 nodes (two through the first), each build
//! in turn against myjob before the storage's second design. The no-op handler on 20,000 jobs
//! a producer inserts through the nodes in turn while the instances run: the certification
//! conflicts the nodes counted per 1,000 jobs, and the producer's INSERTs that lost. Then the
//! flash sale (examples/flash-sale, 1,000 orders, PHP): the recipe's tries lost to a conflict.
//! The cluster's nodes are named in MYJOB_BENCH_GALERA (`bench/run` starts the cluster).

use std::path::{Path, PathBuf};
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

use crate::harness::{mark, median, migrated_by, wait_queue_done, Bench, Workers, BIN};

/// The node each of the 4 instances claims through.
const SPREAD: [usize; 4] = [0, 1, 2, 0];

/// One build's run of the no-op handler.
#[derive(Clone, Copy)]
struct Conflicts {
    /// Certification failures and brute-force aborts over every node, per 1,000 jobs.
    per_1000: f64,
    /// Of them, the brute-force aborts: local transactions a node rolled back for a write set
    /// it applied (they met on a lock), rather than ones that failed certification.
    aborts_per_1000: f64,
    /// The producer's INSERTs of 1,000 rows that lost to another node's write.
    inserts_lost: u64,
}

impl Bench {
    pub(crate) async fn galera_item(&mut self) {
        let nodes: Vec<String> = std::env::var("MYJOB_BENCH_GALERA")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let old = std::env::var_os("MYJOB_BENCH_STORAGE_BASELINE_BIN").map(PathBuf::from);
        let (3, Some(old)) = (nodes.len(), old) else {
            self.line("| Galera | (no cluster in MYJOB_BENCH_GALERA, or no baseline build) | | ✗ missed |");
            return;
        };
        let jobs = self.size.jobs;
        let (mut new_runs, mut old_runs) = (vec![], vec![]);
        for _ in 0..self.size.repeats {
            new_runs.push(self.conflict_run(Path::new(BIN), &nodes, jobs).await);
            old_runs.push(self.conflict_run(&old, &nodes, jobs).await);
        }
        let new = median(new_runs.iter().map(|r| r.per_1000).collect());
        let was = median(old_runs.iter().map(|r| r.per_1000).collect());
        let aborts = |runs: &[Conflicts]| median(runs.iter().map(|r| r.aborts_per_1000).collect());
        let lost = |runs: &[Conflicts]| each_run(runs.iter().map(|r| r.inserts_lost));
        self.line(&format!(
            "| Galera, 4 instances over 3 nodes, {jobs} jobs: certification conflicts per 1,000 jobs | {new:.1} | before the second design: {was:.1} | ≤ 1 {} |",
            mark(new <= 1.0)
        ));
        self.line(&format!(
            "| the same: of them brute-force aborts (a lock met, not a failed certification) | {:.1} | before: {:.1} | |",
            aborts(&new_runs),
            aborts(&old_runs)
        ));
        self.line(&format!(
            "| the same: producer's INSERTs of 1,000 rows lost, each run | {} | before: {} | 0 {} |",
            lost(&new_runs),
            lost(&old_runs),
            mark(new_runs.iter().all(|r| r.inserts_lost == 0))
        ));
        if !has_php() {
            self.line("| Galera: the flash sale | (no php) | | ✗ missed |");
            return;
        }
        let (mut new_sales, mut old_sales) = (vec![], vec![]);
        for _ in 0..self.size.repeats {
            new_sales.push(self.flash_sale(Path::new(BIN), &nodes).await);
            old_sales.push(self.flash_sale(&old, &nodes).await);
        }
        self.line(&format!(
            "| Galera: the flash sale's tries lost, 1,000 orders, 4 instances over 3 nodes, each run | {} | before: {} | 0 {} |",
            each_run(new_sales.iter()),
            each_run(old_sales.iter()),
            mark(new_sales.iter().all(|&n| n == 0))
        ));
    }

    /// A fresh `myjob_bench` on the cluster, migrated by `bin`, and a config per instance
    /// naming its node.
    async fn on_cluster(&self, bin: &Path, nodes: &[String], queue: &str) -> Vec<PathBuf> {
        purged(nodes).await;
        let configs: Vec<PathBuf> = SPREAD
            .iter()
            .enumerate()
            .map(|(i, &node)| {
                let path = self.dir.join(format!("galera-{i}.toml"));
                std::fs::write(
                    &path,
                    format!(
                        "[database]\nurl = \"{}/myjob_bench\"\n[worker]\nconcurrency = 8\n\
                         poll_interval = \"100ms\"\n[retention]\ndone = \"forever\"\n\
                         [metrics]\nlisten = \"\"\n{queue}",
                        nodes[node]
                    ),
                )
                .unwrap();
                path
            })
            .collect();
        let root = Conn::new(Opts::from_url(&nodes[0]).unwrap()).await.unwrap();
        migrated_by(root, bin, &configs[0]).await;
        configs
    }

    /// One run of `bin`'s 4 instances: three warm-up rounds (on the new build, time for each
    /// instance to see the others' lanes), then `jobs` jobs inserted through the nodes in turn.
    async fn conflict_run(&self, bin: &Path, nodes: &[String], jobs: usize) -> Conflicts {
        let queue = "[[queue]]\nname = \"bench\"\ncommand = [\"myjob:noop\"]\n";
        let configs = self.on_cluster(bin, nodes, queue).await;
        let workers = Workers(
            configs
                .iter()
                .enumerate()
                .map(|(i, c)| self.start_of(bin, c, i + 1, "info"))
                .collect(),
        );
        let mut conns = Vec::new();
        for node in nodes {
            conns.push(synced(node).await);
        }
        // Warm-up: rounds of jobs, each followed by a pause shorter than a lane is
        // remembered, so that the instances have seen each other claim.
        let mut done = 0;
        for _ in 0..3 {
            insert_through(&mut conns, 400, 400).await;
            done += 400;
            wait_queue_done(&mut conns[0], "bench", done as u64).await;
            tokio::time::sleep(Duration::from_millis(4500)).await;
        }
        let before = conflicts(&mut conns).await;
        let inserts_lost = insert_through(&mut conns, jobs, 1000).await;
        wait_queue_done(&mut conns[0], "bench", (done + jobs) as u64).await;
        let after = conflicts(&mut conns).await;
        workers.stop();
        // What lost, as the instances said it: on the bench's own output, for reading.
        let mut lost = std::collections::BTreeMap::<String, usize>::new();
        for i in 1..=SPREAD.len() {
            let log = std::fs::read_to_string(self.dir.join(format!("worker-{i}.log")))
                .unwrap_or_default();
            for line in log.lines().filter(|l| l.contains("trying again")) {
                let what = line.split(": ").nth(1).unwrap_or("?").to_owned();
                *lost.entry(what).or_default() += 1;
            }
        }
        eprintln!("galera run of {}: {lost:?}", bin.display());
        let per_1000 = |n: u64| n as f64 * 1000.0 / jobs as f64;
        Conflicts {
            per_1000: per_1000(after.0 + after.1 - before.0 - before.1),
            aborts_per_1000: per_1000(after.1 - before.1),
            inserts_lost,
        }
    }

    /// The flash sale of tests/flow.rs on the cluster with `bin`: the recipe's tries lost.
    async fn flash_sale(&self, bin: &Path, nodes: &[String]) -> usize {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/flash-sale");
        let queue = format!(
            "[[queue]]\nname = \"orders\"\ncommand = [{:?}]\nkey_limit = 1\npass_env = [\"SHOP_DB\"]\n",
            examples.join("order.php").display().to_string()
        );
        let configs = self.on_cluster(bin, nodes, &queue).await;
        let mut conn = synced(&nodes[0]).await;
        let schema = std::fs::read_to_string(examples.join("schema.sql")).unwrap();
        conn.query_drop(schema).await.unwrap();
        let sale = std::fs::read_to_string(examples.join("sale.sql")).unwrap();
        conn.query_drop(sale).await.unwrap();
        let workers = Workers(
            configs
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut w = self.command_of(bin, c, i + 1, "info");
                    w.env("SHOP_DB", format!("{}/myjob_bench", nodes[SPREAD[i]]));
                    w.spawn().unwrap()
                })
                .collect(),
        );
        // Orders wait blocked behind their product's slot: counted done, not probed.
        let mut done = 0;
        for _ in 0..2400 {
            done = conn
                .query_first("SELECT COUNT(*) FROM myjob_jobs WHERE status = 'done'")
                .await
                .unwrap()
                .unwrap();
            if done == 1000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(done, 1000, "the flash sale's orders handled within 240 s");
        workers.stop();
        let sold: u64 = conn
            .query_first("SELECT COUNT(*) FROM orders WHERE status = 'sold'")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(sold, 100, "the flash sale sold each unit once");
        (1..=SPREAD.len())
            .map(|i| {
                std::fs::read_to_string(self.dir.join(format!("worker-{i}.log")))
                    .unwrap_or_default()
                    .matches("lost to a deadlock")
                    .count()
            })
            .sum()
    }
}

/// Inserts `n` jobs of 200 bytes in INSERTs of `per` rows, through each node in turn, each
/// tried again when it loses to another node's write. Says how many INSERTs lost.
async fn insert_through(conns: &mut [Conn], n: usize, per: usize) -> u64 {
    let payload = "x".repeat(200);
    let mut lost = 0;
    for (i, start) in (0..n).step_by(per).enumerate() {
        let rows = (n - start).min(per);
        let sql = format!(
            "INSERT INTO myjob_jobs (queue, payload) VALUES {}",
            vec!["('bench', ?)"; rows].join(", ")
        );
        let params: Vec<mysql_async::Value> = (0..rows).map(|_| payload.as_str().into()).collect();
        let conn = &mut conns[i % conns.len()];
        while let Err(e) = conn.exec_drop(&sql, params.clone()).await {
            assert!(e.to_string().contains("1213"), "a producer's INSERT: {e}");
            lost += 1;
        }
    }
    lost
}

/// A connection to `myjob_bench` through `node`, whose reads wait for what the cluster
/// committed before them.
async fn synced(node: &str) -> Conn {
    let url = format!("{node}/myjob_bench");
    let mut conn = Conn::new(Opts::from_url(&url).unwrap()).await.unwrap();
    conn.query_drop("SET SESSION wsrep_sync_wait = 1")
        .await
        .unwrap();
    conn
}

/// Waits until InnoDB's purge on every node has caught up with the last run, at most
/// 5 minutes: the DDL of the next run pauses purge, and MariaDB 11.8.9's purge, paused with
/// records of a table with indexed virtual columns in its batch, grows the node by gigabytes
/// until the kernel kills it (docs/servers.md, "A schema change on a busy cluster"). Even a
/// hundred records left were enough.
async fn purged(nodes: &[String]) {
    for node in nodes {
        let mut conn = Conn::new(Opts::from_url(node).unwrap()).await.unwrap();
        for _ in 0..600 {
            let (_, left): (String, u64) = conn
                .query_first("SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'")
                .await
                .unwrap()
                .unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Certification failures and brute-force aborts, each summed over every node.
async fn conflicts(conns: &mut [Conn]) -> (u64, u64) {
    let (mut failed, mut aborted) = (0, 0);
    for conn in conns {
        let rows: Vec<(String, u64)> = conn
            .query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')",
            )
            .await
            .unwrap();
        for (name, v) in rows {
            match name.as_str() {
                "wsrep_local_bf_aborts" => aborted += v,
                _ => failed += v,
            }
        }
    }
    (failed, aborted)
}

/// Whether PHP runs here (the flash sale's handler is PHP).
fn has_php() -> bool {
    std::process::Command::new("php")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A figure of each run, in order: `3, 0, 1`.
fn each_run<T: ToString>(runs: impl Iterator<Item = T>) -> String {
    runs.map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}
