//! `myjob stats`: one row per queue that is configured, paused, or has jobs in the table.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::cli::table;
use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::admin::{self, QueueStats};
use crate::store::queues;

#[derive(Serialize)]
struct Document {
    queues: Vec<QueueStats>,
}

pub async fn run(config: &Path, json: bool) -> Result<(), Error> {
    let (settings, mut conn) = super::open(config).await?;
    let mut by_queue = admin::stats(&mut conn, true)
        .await
        .or_exit(ExitCode::Unavailable)?;
    let paused = queues::paused(&mut conn)
        .await
        .or_exit(ExitCode::Unavailable)?;
    let _ = conn.disconnect().await;
    let configured = settings.queues.iter().map(|q| q.name.clone());
    for name in configured.chain(paused.iter().cloned()) {
        by_queue.entry(name.clone()).or_insert_with(|| QueueStats {
            queue: name,
            ..QueueStats::default()
        });
    }
    for name in &paused {
        if let Some(q) = by_queue.get_mut(name) {
            q.paused = true;
        }
    }
    let queues: Vec<QueueStats> = by_queue.into_values().collect();
    if json {
        return table::print_json(&Document { queues });
    }
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let age = match q.oldest_pending_age_s {
                0 => "-".to_owned(),
                s => humantime::format_duration(Duration::from_secs(s)).to_string(),
            };
            vec![
                q.queue.clone(),
                q.pending.to_string(),
                q.blocked.to_string(),
                q.suspect.to_string(),
                q.scheduled.to_string(),
                q.claimed.to_string(),
                q.done.to_string(),
                q.failed.to_string(),
                q.cancelled.to_string(),
                age,
                if q.paused { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    table::print(
        &[
            "QUEUE",
            "PENDING",
            "BLOCKED",
            "SUSPECT",
            "SCHEDULED",
            "CLAIMED",
            "DONE",
            "FAILED",
            "CANCELLED",
            "OLDEST PENDING",
            "PAUSED",
        ],
        &rows,
    )
}
