//! `myjob purge`: deletes finished jobs older than an age, gently (see `reaper::retention`).

use std::path::Path;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::table;
use crate::config::parse_age;
use crate::error::{Error, ExitCode, OrExit};
use crate::reaper::retention::{self, Purged};

#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Only this queue's jobs.
    #[arg(long, value_parser = super::queue_name)]
    queue: Option<String>,
    /// Delete done jobs that finished longer ago than AGE (e.g. 12h, 7d; 0s for all).
    #[arg(long, value_name = "AGE", value_parser = age)]
    done_older_than: Option<Age>,
    /// Delete failed jobs that finished longer ago than AGE.
    #[arg(long, value_name = "AGE", value_parser = age)]
    failed_older_than: Option<Age>,
    /// Delete cancelled jobs that were cancelled longer ago than AGE.
    #[arg(long, value_name = "AGE", value_parser = age)]
    cancelled_older_than: Option<Age>,
    /// One JSON document: {"done": N, "failed": N, "cancelled": N, "total": N}.
    #[arg(long)]
    json: bool,
}

/// An age given on the command line; "forever" is accepted (and purges nothing), as in the
/// config.
#[derive(Debug, Clone, Copy)]
struct Age(Option<Duration>);

fn age(s: &str) -> Result<Age, String> {
    parse_age(s).map(Age)
}

#[derive(Serialize)]
struct Document {
    done: u64,
    failed: u64,
    cancelled: u64,
    total: u64,
}

pub async fn run(config: &Path, args: PurgeArgs) -> Result<(), Error> {
    let (settings, mut conn) = super::open(config).await?;
    let given = [
        ("done", args.done_older_than),
        ("failed", args.failed_older_than),
        ("cancelled", args.cancelled_older_than),
    ];
    // No age given: the config's [retention], as the reaper applies it, but now.
    let ages: Vec<(&'static str, Duration)> = if given.iter().all(|g| g.1.is_none()) {
        settings.retention.ages()
    } else {
        given
            .into_iter()
            .filter_map(|(status, age)| Some((status, age?.0?)))
            .collect()
    };
    // Stopped by a signal, it has deleted whole batches only; nothing needs undoing.
    let never = CancellationToken::new();
    let purged = retention::purge(&mut conn, &ages, args.queue.as_deref(), None, &never).await;
    let _ = conn.disconnect().await;
    let Purged {
        done,
        failed,
        cancelled,
        ..
    } = purged.or_exit(ExitCode::Unavailable)?;
    let total = done + failed + cancelled;
    if args.json {
        return table::print_json(&Document {
            done,
            failed,
            cancelled,
            total,
        });
    }
    println!("deleted {total} job(s): {done} done, {failed} failed, {cancelled} cancelled");
    Ok(())
}
