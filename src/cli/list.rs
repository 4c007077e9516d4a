//! `myjob list`: jobs, filtered by queue and status; the "peek" at what runs next.

use std::path::Path;

use clap::Args;
use serde::Serialize;

use crate::cli::table::{self, or_dash};
use crate::config::Settings;
use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::admin::{self, ListFilter, Listed, STATUSES};

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only this queue's jobs.
    #[arg(long, value_parser = super::queue_name)]
    queue: Option<String>,
    /// Only jobs in this state.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(STATUSES))]
    status: Option<String>,
    /// At most this many jobs.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    limit: u64,
    /// One JSON document: {"jobs": [...]}.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Document {
    jobs: Vec<Listed>,
}

pub async fn run(config: &Path, args: ListArgs) -> Result<(), Error> {
    let (settings, mut conn) = super::open(config).await?;
    let filter = ListFilter {
        queue: args.queue.as_deref(),
        status: args.status.as_deref(),
        limit: args.limit,
    };
    let jobs = admin::list(&mut conn, &filter)
        .await
        .or_exit(ExitCode::Unavailable)?;
    let _ = conn.disconnect().await;
    if args.json {
        return table::print_json(&Document { jobs });
    }
    // The KEY column only when a job shown has a concurrency key: most queues have none.
    let keys = jobs.iter().any(|j| j.concurrency_key.is_some());
    let mut rows: Vec<Vec<String>> = jobs.iter().map(|j| row(j, &settings)).collect();
    let mut header = vec![
        "ID", "QUEUE", "STATUS", "PRI", "ATTEMPTS", "RUN AT", "CREATED", "FINISHED", "WORKER",
        "BYTES", "ERROR",
    ];
    if keys {
        header.insert(3, "KEY");
        for (r, j) in rows.iter_mut().zip(&jobs) {
            r.insert(3, key(j));
        }
    }
    table::print(&header, &rows)
}

/// A job's concurrency key, and the slot it holds: `sku-42 #1`.
fn key(j: &Listed) -> String {
    match (&j.concurrency_key, j.slot) {
        (None, _) => "-".to_owned(),
        (Some(k), None) => k.clone(),
        (Some(k), Some(s)) => format!("{k} #{s}"),
    }
}

fn row(j: &Listed, settings: &Settings) -> Vec<String> {
    // A job without its own limit has its queue's, when this config knows the queue.
    let max = j
        .max_attempts
        .or_else(|| settings.queue(&j.queue).map(|q| q.max_attempts))
        .map_or_else(|| "?".to_owned(), |m| m.to_string());
    vec![
        j.id.to_string(),
        j.queue.clone(),
        j.status.clone(),
        j.priority.to_string(),
        format!("{}/{max}", j.attempts),
        table::time(&j.run_at),
        table::time(&j.created_at),
        or_dash(j.finished_at.as_deref().map(table::time).as_deref()),
        or_dash(j.worker.as_deref()),
        j.payload_bytes.to_string(),
        or_dash(j.error.as_deref()),
    ]
}
