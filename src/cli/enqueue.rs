//! `myjob enqueue`: checks a job's fields, inserts it, and says which id it got. Applications
//! can as well INSERT into `myjob_jobs` themselves; this is the same thing from a shell.

use std::io::Read;
use std::time::Duration;

use anyhow::anyhow;
use mysql_async::prelude::*;
use tracing::warn;

use crate::config::{check_queue_name, Settings};
use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::{self, Enqueued, JobId, NewJob};
use crate::store::schema;

/// The largest payload the column holds (MEDIUMBLOB: 16 MiB less one byte).
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024 - 1;
/// Room in a packet for the statement and the other values besides the payload.
const PACKET_OVERHEAD: u64 = 4096;
/// The unique_key column's size, in characters.
pub const MAX_UNIQUE_KEY: usize = 191;
/// The concurrency_key column's size, in bytes (VARBINARY).
pub const MAX_CONCURRENCY_KEY: usize = 191;

/// The job as given on the command line, before it is checked.
#[derive(Debug, Clone)]
pub struct Request {
    pub queue: String,
    pub delay: Option<String>,
    pub priority: i16,
    pub max_attempts: Option<u32>,
    pub unique_key: Option<String>,
    pub concurrency_key: Option<String>,
    /// The payload; `-` reads it from stdin; none is an empty payload.
    pub payload: Option<String>,
}

/// Checks the request, reading stdin for `-`. Every problem is a data error (exit 65).
pub fn check(req: Request, stdin: impl Read) -> Result<NewJob, Error> {
    let bad = |m: String| Error::new(ExitCode::Data, anyhow!(m));
    check_queue_name(&req.queue).map_err(|m| bad(format!("--queue: {m}")))?;
    let delay = match &req.delay {
        None => Duration::ZERO,
        Some(text) => humantime::parse_duration(text.trim()).map_err(|_| {
            bad(format!(
                "--delay: {text:?} is not a duration like \"30s\" or \"5m\""
            ))
        })?,
    };
    if delay > Duration::from_secs(10 * 365 * 24 * 3600) {
        return Err(bad("--delay: longer than ten years".into()));
    }
    if req.max_attempts == Some(0) {
        return Err(bad("--max-attempts: must be at least 1".into()));
    }
    if let Some(key) = &req.unique_key {
        if key.is_empty() || key.chars().count() > MAX_UNIQUE_KEY {
            return Err(bad(format!(
                "--unique-key: must be 1 to {MAX_UNIQUE_KEY} characters"
            )));
        }
    }
    if let Some(key) = &req.concurrency_key {
        if key.is_empty() || key.len() > MAX_CONCURRENCY_KEY {
            return Err(bad(format!(
                "--concurrency-key: must be 1 to {MAX_CONCURRENCY_KEY} bytes"
            )));
        }
    }
    let payload = match req.payload.as_deref() {
        None => Vec::new(),
        Some("-") => {
            // An empty or closed stdin is an empty payload. Read one byte past the limit to
            // tell "at the limit" from "over it" without reading an endless stream.
            let mut buf = Vec::new();
            stdin
                .take(MAX_PAYLOAD as u64 + 1)
                .read_to_end(&mut buf)
                .map_err(|e| bad(format!("payload: cannot read stdin: {e}")))?;
            buf
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    if payload.len() > MAX_PAYLOAD {
        return Err(bad(format!(
            "payload: larger than {MAX_PAYLOAD} bytes (16 MiB)"
        )));
    }
    Ok(NewJob {
        queue: req.queue,
        payload,
        priority: req.priority,
        max_attempts: req.max_attempts,
        delay,
        unique_key: req.unique_key,
        concurrency_key: req.concurrency_key,
    })
}

/// Inserts the job and returns its id.
pub async fn enqueue(settings: &Settings, job: &NewJob) -> Result<JobId, Error> {
    if !settings.queues.is_empty() && settings.queue(&job.queue).is_none() {
        warn!(
            "queue {:?} is not in {}: workers using this file will not run it",
            job.queue,
            settings.path.display()
        );
    }
    // A worker of this config would fail it unread: say so now, to the producer.
    let most = settings.worker.max_payload_bytes;
    if job.payload.len() as u64 > most {
        return Err(Error::new(
            ExitCode::Data,
            anyhow!(
                "payload: {} bytes are over worker.max_payload_bytes ({most}) of {}: its workers would fail the job unread (raise the limit there)",
                job.payload.len(),
                settings.path.display()
            ),
        ));
    }
    let mut conn = schema::connect_checked(&settings.database).await?;
    // The payload travels in one packet: past the server's max_allowed_packet the driver
    // only reports "packets out of sync", so say what is wrong before sending.
    let limit: Option<u64> = conn
        .query_first("SELECT @@max_allowed_packet")
        .await
        .or_exit(ExitCode::Unavailable)?;
    let limit = limit.unwrap_or(u64::MAX);
    if job.payload.len() as u64 + PACKET_OVERHEAD > limit {
        let _ = conn.disconnect().await;
        return Err(Error::new(
            ExitCode::Data,
            anyhow!(
                "payload: {} bytes do not fit the server's max_allowed_packet of {limit} bytes (raise it on the server to enqueue payloads this large)",
                job.payload.len()
            ),
        ));
    }
    // A refusal of the server (a constraint, a value, a trigger's SIGNAL) is the job's fault;
    // anything else (a connection lost mid-insert) is the database's.
    let result = jobs::enqueue(&mut conn, job).await.map_err(|e| {
        let code = match crate::db::classify(&e) {
            crate::db::Failure::Refused(_) => ExitCode::Data,
            _ => ExitCode::Unavailable,
        };
        Error::new(code, e)
    });
    let _ = conn.disconnect().await;
    match result? {
        Enqueued::Inserted(id) | Enqueued::Replaced(id) => Ok(id),
        Enqueued::Running(id) => Err(Error::new(
            ExitCode::TempFail,
            anyhow!(
                "job {id} with unique key {:?} is running now; its payload was not replaced (try again when it has finished)",
                job.unique_key.as_deref().unwrap_or("")
            ),
        )),
    }
}
