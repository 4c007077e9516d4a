//! `myjob retry`: failed jobs become due now, with all their attempts again.

use std::path::Path;

use anyhow::anyhow;
use clap::Args;

use super::job_ids;
use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::admin;

#[derive(Args, Debug)]
pub struct RetryArgs {
    /// The failed jobs' ids.
    #[arg(
        value_name = "ID",
        required_unless_present = "failed",
        conflicts_with = "failed"
    )]
    ids: Vec<u64>,
    /// With --failed: every failed job of this queue.
    #[arg(long, requires = "failed", value_parser = super::queue_name)]
    queue: Option<String>,
    /// Every failed job of --queue.
    #[arg(long, requires = "queue")]
    failed: bool,
}

pub async fn run(config: &Path, args: RetryArgs) -> Result<(), Error> {
    let (_, mut conn) = super::open(config).await?;
    let result = match &args.queue {
        Some(queue) => admin::retry_queue(&mut conn, queue)
            .await
            .map(|(n, stayed)| {
                println!("retried {n} failed job(s) of queue {queue}");
                if stayed > 0 {
                    println!(
                        "{stayed} stayed failed: a job that is not finished holds their unique key"
                    );
                }
                Ok(())
            }),
        None => admin::retry(&mut conn, &job_ids(&args.ids)).await.map(|r| {
            r.map(|n| println!("retried {n} job(s)"))
                .map_err(|refused| anyhow!("{refused}; nothing was retried"))
        }),
    };
    let _ = conn.disconnect().await;
    result
        .or_exit(ExitCode::Unavailable)?
        .or_exit(ExitCode::Data)
}
