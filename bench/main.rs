//! The benchmark: `bench/run` (or `cargo bench --features bench --bench myjob -- [--smoke]
//! [--rows-10m] [--latency-only] [--cat-only] [--backlog-only] [--growth-only]
//! [--persistent-only] [--purge-only] [--idle-only] [--queues-only] [--scheduled-only]
//! [--heal-only] [--capacity-only] [--metrics-only] [--logging-only] [--flow-only]
//! [--memory-only] [--storage-only] [--galera-only] [--burst-only]`).
//! Every figure is measured next to a ceiling of this machine measured in the same run, and
//! reported as a ratio to it; the table goes to stdout and to bench/results/<date>.md. Every
//! run's jobs are real rows, verified at the end (all done, each claimed once).
//!
//! One file per item, as `src/` has one per concern: [`suite`] runs them in order;
//! [`harness`] holds what they share.
//!
//! Under `cargo test` (no `--bench` argument) it does nothing: timings are not tests.

mod backlog;
mod capacity;
mod ceilings;
mod explain;
mod flow;
mod galera;
mod growth;
mod harness;
mod heal;
mod idle;
mod latency;
mod logging;
mod memory;
mod metrics;
mod persistent;
mod purge;
mod queues;
mod storage;
mod suite;
mod throughput;

use harness::{Bench, Size};
use persistent::{serve_ok, PERSISTENT_OK};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == PERSISTENT_OK) {
        serve_ok();
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("myjob bench: run it with bench/run (cargo bench --features bench --bench myjob)");
        return;
    }
    let smoke = args.iter().any(|a| a == "--smoke");
    let mut growth = vec![10_000, 1_000_000];
    if args.iter().any(|a| a == "--rows-10m") {
        growth.push(10_000_000);
    }
    let size = if smoke {
        Size {
            jobs: 500,
            spawn_secs: 0.3,
            latency_secs: 1.0,
            idle_secs: 1.0,
            repeats: 1,
            growth: vec![10_000, 50_000],
            backlog_jobs: 200,
            backlog_rows: 5_000,
            burst_rows: 5_000,
            purge_rows: 20_000,
            quiet_secs: 2.0,
        }
    } else {
        Size {
            jobs: 20_000,
            spawn_secs: 2.0,
            latency_secs: 30.0,
            idle_secs: 30.0,
            repeats: 3,
            growth,
            backlog_jobs: 3_000,
            backlog_rows: 200_000,
            burst_rows: 300_000,
            purge_rows: 1_000_000,
            quiet_secs: 20.0,
        }
    };
    let server = std::env::var("MYJOB_BENCH_SERVER")
        .or_else(|_| std::env::var("MYJOB_TEST_SERVER"))
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
    let dir = tempfile::tempdir().unwrap().keep();
    let mut b = Bench {
        url: format!("{server}/myjob_bench"),
        server,
        dir,
        size,
        report: String::new(),
    };
    b.run(smoke).await;
}
