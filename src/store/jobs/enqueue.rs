//! A producer's insert of one job (`myjob enqueue`).

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};

use super::JobId;

/// A job to insert.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub queue: String,
    pub payload: Vec<u8>,
    pub priority: i16,
    pub max_attempts: Option<u32>,
    pub delay: Duration,
    pub unique_key: Option<String>,
    /// At most the queue's `key_limit` jobs of one key run at once; None is no limit.
    pub concurrency_key: Option<String>,
}

/// What `enqueue` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row.
    Inserted(JobId),
    /// A pending job had the same unique key: its payload and run time were replaced.
    Replaced(JobId),
    /// A job with the same unique key is running now, or waits as a suspect; nothing was changed.
    Running(JobId),
}

/// Inserts a job. With a unique key held by a pending job, the later payload and run time
/// win and the old id is returned; held by a running job, nothing changes.
pub async fn enqueue(conn: &mut Conn, job: &NewJob) -> anyhow::Result<Enqueued> {
    let mut tx = conn
        .start_transaction(TxOpts::default())
        .await
        .context("starting the enqueue transaction")?;
    // `id = LAST_INSERT_ID(id)` makes the existing row's id the one the client reads back.
    // A delayed job is `scheduled`, out of the claim's range until it is due; a job with a
    // concurrency key is `blocked` until the gate admits it into a slot. The assignments read
    // the old status, so it is assigned before the key and after the rest; a pending job
    // replaced with the same key keeps its slot (it is next anyway), one whose key changed
    // waits for a slot of its new key.
    let status = match (job.delay.is_zero(), &job.concurrency_key) {
        (false, _) => "scheduled",
        (true, Some(_)) => "blocked",
        (true, None) => "pending",
    };
    tx.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload, priority, max_attempts, run_at, unique_key, \
             concurrency_key, status) \
         VALUES (?, ?, ?, ?, NOW(6) + INTERVAL ? MICROSECOND, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id), \
             payload = IF(status IN ('pending', 'scheduled', 'blocked'), VALUES(payload), payload), \
             run_at = IF(status IN ('pending', 'scheduled', 'blocked'), VALUES(run_at), run_at), \
             status = IF(status IN ('pending', 'scheduled', 'blocked'), \
                         IF(status = 'pending' AND VALUES(status) = 'blocked' \
                              AND concurrency_key <=> VALUES(concurrency_key), \
                            'pending', VALUES(status)), \
                         status), \
             concurrency_key = IF(status IN ('pending', 'scheduled', 'blocked'), \
                                  VALUES(concurrency_key), concurrency_key)",
        (
            &job.queue,
            &job.payload,
            job.priority,
            job.max_attempts,
            job.delay.as_micros() as u64,
            &job.unique_key,
            &job.concurrency_key,
            status,
        ),
    )
    .await
    .context("inserting the job")?;
    let inserted = tx.affected_rows() == 1;
    let id = tx
        .last_insert_id()
        .context("the server returned no job id")?;
    let status: Option<String> = tx
        .exec_first("SELECT status FROM myjob_jobs WHERE id = ?", (id,))
        .await
        .context("reading the job back")?;
    let id = JobId::new(id);
    let result = match status.as_deref() {
        _ if inserted => Enqueued::Inserted(id),
        Some("pending" | "scheduled" | "blocked") => Enqueued::Replaced(id),
        _ => Enqueued::Running(id),
    };
    tx.commit().await.context("committing the job")?;
    Ok(result)
}
