//! The operator commands' statements about `myjob_jobs`: counts, listings, and the state
//! changes an operator asks for (retry, cancel). Each change is one named transition, guarded
//! by the states it may start from, so that a command racing a worker changes nothing the
//! worker owns: a claim is fenced by its status, and a cancelled claim is the worker's cue
//! to stop its handler.

use std::collections::BTreeMap;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Row, Value};
use serde::Serialize;

use super::{in_list, JobId};

/// The states a job can be in, as the `status` column spells them.
pub const STATUSES: &[&str] = &[
    "pending",
    "blocked",
    "suspect",
    "scheduled",
    "claimed",
    "done",
    "failed",
    "cancelled",
];

/// One queue's counts, as `myjob stats` prints them.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct QueueStats {
    pub queue: String,
    /// Due now: pending, and scheduled jobs whose time has come but that the stager has not
    /// moved yet.
    pub pending: u64,
    /// Due, but waiting for a slot of their concurrency key (`key_limit`).
    pub blocked: u64,
    /// Held at two deaths of their workers: due, run one per instance in a quarantine slot
    /// (see migration 8).
    pub suspect: u64,
    /// Waiting for their run_at, retries in backoff included.
    pub scheduled: u64,
    pub claimed: u64,
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// How long the oldest due job has waited past its run_at, in whole seconds; 0 for none.
    pub oldest_pending_age_s: u64,
    pub paused: bool,
}

/// Counts by queue and status, with the wait of each queue's oldest due job, from indexes
/// alone (no row is read), in three steps:
/// - every job counted from the claim index `(status, queue, …)`, grouped in its order: as
///   large as the table, read once;
/// - the stager's two small ranges of the due index `(status, run_at, id, queue)`, pending jobs
///   not due yet and scheduled ones due already, which correct the first counts: due is
///   pending, give or take those;
/// - for each queue with due jobs, the first due entry of that queue in the due index, in
///   run_at order: as far in as the other queues' older due jobs go.
///
/// With `finished` false, done and cancelled jobs are not counted (left at 0): the index
/// ranges of the states still to act on are walked, not the history retention keeps, so the
/// cost follows the backlog rather than the table (what the metrics' queue gauges read).
pub async fn stats(
    conn: &mut Conn,
    finished: bool,
) -> anyhow::Result<BTreeMap<String, QueueStats>> {
    let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
    // Each name as the table holds it, which a name that is not UTF-8 would not survive.
    let mut raw: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let counts: Vec<(Vec<u8>, String, u64)> = conn
        .query(if finished {
            "SELECT queue, status, COUNT(*) FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
             GROUP BY status, queue"
        } else {
            "SELECT queue, status, COUNT(*) FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
             WHERE status IN ('pending', 'blocked', 'suspect', 'scheduled', 'claimed', 'failed') \
             GROUP BY status, queue"
        })
        .await
        .context("counting jobs")?;
    for (queue, status, n) in counts {
        let q = entry(&mut by_queue, &queue);
        raw.insert(q.queue.clone(), queue);
        match status.as_str() {
            "pending" => q.pending = n,
            "blocked" => q.blocked = n,
            "suspect" => q.suspect = n,
            "scheduled" => q.scheduled = n,
            "claimed" => q.claimed = n,
            "done" => q.done = n,
            "failed" => q.failed = n,
            "cancelled" => q.cancelled = n,
            _ => {}
        }
    }
    let unstaged: Vec<(Vec<u8>, String, u64)> = conn
        .query(
            "SELECT queue, status, COUNT(*) FROM myjob_jobs FORCE INDEX (myjob_jobs_due) \
             WHERE (status = 'scheduled' AND run_at <= NOW(6)) \
                OR (status = 'pending' AND run_at > NOW(6)) \
             GROUP BY queue, status",
        )
        .await
        .context("counting jobs the stager has not moved yet")?;
    for (queue, status, n) in unstaged {
        let q = entry(&mut by_queue, &queue);
        raw.insert(q.queue.clone(), queue);
        if status == "scheduled" {
            q.scheduled = q.scheduled.saturating_sub(n);
            q.pending += n;
        } else {
            q.pending = q.pending.saturating_sub(n);
            q.scheduled += n;
        }
    }
    for q in by_queue.values_mut().filter(|q| q.pending > 0) {
        let name = raw.get(&q.queue).cloned().unwrap_or_default();
        let age: Option<Option<i64>> = conn
            .exec_first(
                "SELECT TIMESTAMPDIFF(SECOND, MIN(run_at), NOW(6)) FROM ( \
                   (SELECT run_at FROM myjob_jobs FORCE INDEX (myjob_jobs_due) \
                    WHERE status = 'pending' AND run_at <= NOW(6) AND queue = ? \
                    ORDER BY run_at LIMIT 1) \
                   UNION ALL \
                   (SELECT run_at FROM myjob_jobs FORCE INDEX (myjob_jobs_due) \
                    WHERE status = 'scheduled' AND run_at <= NOW(6) AND queue = ? \
                    ORDER BY run_at LIMIT 1) \
                 ) AS oldest",
                (&name, &name),
            )
            .await
            .with_context(|| format!("finding the oldest due job of queue {}", q.queue))?;
        q.oldest_pending_age_s = age.flatten().unwrap_or(0).max(0) as u64;
    }
    Ok(by_queue)
}

fn entry<'a>(map: &'a mut BTreeMap<String, QueueStats>, queue: &[u8]) -> &'a mut QueueStats {
    // The column is binary: no name may make the conversion fail.
    let name = String::from_utf8_lossy(queue).into_owned();
    map.entry(name.clone()).or_insert_with(|| QueueStats {
        queue: name,
        ..QueueStats::default()
    })
}

/// One job as `myjob list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub id: JobId,
    pub queue: String,
    pub status: String,
    /// Its concurrency key, if it has one.
    pub concurrency_key: Option<String>,
    /// The slot of its key it holds (pending, claimed or suspect), if any.
    pub slot: Option<u16>,
    pub priority: i16,
    pub attempts: u32,
    /// NULL: the queue's.
    pub max_attempts: Option<u32>,
    pub run_at: String,
    pub created_at: String,
    pub finished_at: Option<String>,
    pub worker: Option<String>,
    /// The first line of `last_error`.
    pub error: Option<String>,
    pub payload_bytes: u64,
}

/// Times as UTC ISO 8601 with microseconds (sessions run in UTC: see `db::connect`).
fn iso(column: &str) -> String {
    format!("DATE_FORMAT({column}, '%Y-%m-%dT%H:%i:%s.%fZ')")
}

/// Which jobs `myjob list` shows.
pub struct ListFilter<'a> {
    pub queue: Option<&'a str>,
    pub status: Option<&'a str>,
    pub limit: u64,
}

/// Jobs in run order when they wait (pending by priority then id, the claim's order;
/// scheduled by run_at), newest first otherwise. With a status, served by the claim index
/// (pending, and any status with a queue) or the due index (scheduled); without one, by
/// the primary key backwards.
pub async fn list(conn: &mut Conn, filter: &ListFilter<'_>) -> anyhow::Result<Vec<Listed>> {
    let mut sql = format!(
        "SELECT id, queue, status, priority, attempts, max_attempts, {}, {}, {}, worker, \
             SUBSTRING_INDEX(last_error, '\\n', 1), LENGTH(payload), concurrency_key, slot_live \
         FROM myjob_jobs WHERE 1 = 1",
        iso("run_at"),
        iso("created_at"),
        iso("finished_at"),
    );
    let mut params: Vec<Value> = Vec::new();
    if let Some(q) = filter.queue {
        sql += " AND queue = ?";
        params.push(q.into());
    }
    if let Some(s) = filter.status {
        sql += " AND status = ?";
        params.push(s.into());
    }
    sql += match filter.status {
        Some("pending" | "suspect" | "blocked") => " ORDER BY priority DESC, id",
        Some("scheduled") => " ORDER BY run_at, id",
        _ => " ORDER BY id DESC",
    };
    sql += " LIMIT ?";
    params.push(filter.limit.into());
    // Text columns as bytes: queue is binary, and no row may make a conversion fail. Read
    // by position, each a NULL when it cannot convert: more columns than a tuple holds.
    let rows: Vec<Row> = conn
        .exec(sql, Params::Positional(params))
        .await
        .context("listing jobs")?;
    fn col<T: mysql_async::prelude::FromValue>(r: &mut Row, i: usize) -> Option<T> {
        r.take_opt::<Option<T>, _>(i).and_then(Result::ok).flatten()
    }
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    Ok(rows
        .into_iter()
        .map(|mut r| Listed {
            id: JobId::new(col(&mut r, 0).unwrap_or(0)),
            queue: col(&mut r, 1).map(text).unwrap_or_default(),
            status: col(&mut r, 2).map(text).unwrap_or_default(),
            priority: col(&mut r, 3).unwrap_or(0),
            attempts: col(&mut r, 4).unwrap_or(0),
            max_attempts: col(&mut r, 5),
            run_at: col(&mut r, 6).map(text).unwrap_or_default(),
            created_at: col(&mut r, 7).map(text).unwrap_or_default(),
            finished_at: col(&mut r, 8).map(text),
            worker: col(&mut r, 9).map(text),
            error: col(&mut r, 10).map(text),
            payload_bytes: col(&mut r, 11).unwrap_or(0),
            concurrency_key: col(&mut r, 12).map(text),
            slot: col(&mut r, 13),
        })
        .collect())
}

/// Every column of one job, as `myjob show` prints them, in table order; times in UTC ISO
/// 8601, the payload apart.
pub struct Shown {
    pub columns: Vec<(&'static str, Option<String>)>,
    pub payload: Vec<u8>,
}

/// The columns `show` reads, and how: times formatted, the rest as text.
const SHOWN: &[(&str, bool)] = &[
    ("id", false),
    ("queue", false),
    ("status", false),
    ("priority", false),
    ("attempts", false),
    ("max_attempts", false),
    ("rescues", false),
    ("suspicion", false),
    ("run_at", true),
    ("unique_key", false),
    ("concurrency_key", false),
    ("slot", false),
    ("batch_id", false),
    ("owner_conn", false),
    ("owner_server", false),
    ("worker", false),
    ("claimed_at", true),
    ("finished_at", true),
    ("created_at", true),
    ("last_error", false),
];

/// One job, or None when there is no such job. Served by the primary key.
pub async fn show(conn: &mut Conn, id: JobId) -> anyhow::Result<Option<Shown>> {
    let columns: Vec<String> = SHOWN
        .iter()
        .map(|&(c, time)| if time { iso(c) } else { c.to_owned() })
        .collect();
    let sql = format!(
        "SELECT {}, payload FROM myjob_jobs WHERE id = ?",
        columns.join(", ")
    );
    let row: Option<Row> = conn
        .exec_first(sql, (id,))
        .await
        .with_context(|| format!("reading job {id}"))?;
    let Some(mut row) = row else {
        return Ok(None);
    };
    let mut shown = Vec::new();
    for (i, &(name, _)) in SHOWN.iter().enumerate() {
        let v: Value = row.take(i).unwrap_or(Value::NULL);
        let text = match v {
            Value::NULL => None,
            Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            Value::Int(n) => Some(n.to_string()),
            Value::UInt(n) => Some(n.to_string()),
            other => Some(other.as_sql(true)),
        };
        shown.push((name, text));
    }
    let payload: Option<Vec<u8>> = row.take(SHOWN.len());
    Ok(Some(Shown {
        columns: shown,
        payload: payload.unwrap_or_default(),
    }))
}

/// Why an operator's change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("job {0}: no such job")]
    NoSuchJob(JobId),
    #[error("job {id}: is {status}, {why}")]
    State {
        id: JobId,
        status: String,
        why: &'static str,
    },
    #[error("job {id}: its unique key {key:?} is held by job {holder}, which is not finished")]
    UniqueKey {
        id: JobId,
        key: String,
        holder: JobId,
    },
}

/// Locks the rows of `ids` and returns each one's status, in the order of `ids`; the first
/// missing job is refused. Served by the primary key.
async fn lock_states(
    conn: &mut Conn,
    ids: &[JobId],
) -> anyhow::Result<Result<Vec<(JobId, String)>, Refused>> {
    let (list, params) = in_list(ids);
    let rows: Vec<(u64, String)> = conn
        .exec(
            format!("SELECT id, status FROM myjob_jobs WHERE id IN ({list}) FOR UPDATE"),
            Params::Positional(params),
        )
        .await
        .context("reading the jobs' states")?;
    let mut states = Vec::new();
    for &id in ids {
        match rows.iter().find(|r| r.0 == id.get()) {
            Some(r) => states.push((id, r.1.clone())),
            None => return Ok(Err(Refused::NoSuchJob(id))),
        }
    }
    Ok(Ok(states))
}

/// The transition `failed → pending`: each job of `ids` is due now, with its attempts (and
/// rescues and suspicion) counted from 0 again; its last_error stays until the next attempt. All or
/// nothing: a job that is missing or not failed refuses the whole change. Returns how many
/// jobs changed.
pub async fn retry(conn: &mut Conn, ids: &[JobId]) -> anyhow::Result<Result<u64, Refused>> {
    in_transaction(conn, async |conn: &mut Conn| {
        let states = match lock_states(conn, ids).await? {
            Ok(s) => s,
            Err(r) => return Ok(Err(r)),
        };
        if let Some((id, status)) = states.into_iter().find(|s| s.1 != "failed") {
            return Ok(Err(Refused::State {
                id,
                status,
                why: "not failed; only a failed job can be retried",
            }));
        }
        // A failed job's unique key is free, and may have been taken since.
        if let Some(r) = unique_clash(conn, ids).await? {
            return Ok(Err(r));
        }
        Ok(Ok(to_pending(conn, ids, "UPDATE").await?))
    })
    .await
}

/// The transition itself, `failed → pending` (`→ blocked` for a job with a concurrency
/// key, which the gate admits into a free slot), for those of `ids` still failed: due now,
/// attempts, rescues and suspicion from 0, the claim's columns cleared, last_error kept. `update` is
/// `UPDATE` or `UPDATE IGNORE`. Returns how many rows changed. Served by the primary key.
async fn to_pending(conn: &mut Conn, ids: &[JobId], update: &str) -> anyhow::Result<u64> {
    let (sql, params) = to_pending_statement(ids, update);
    conn.exec_drop(sql, Params::Positional(params))
        .await
        .context("retrying failed jobs")?;
    Ok(conn.affected_rows())
}

/// The statement of [`to_pending`], and its parameters; public so that a test can hold it in
/// an open transaction.
pub fn to_pending_statement(ids: &[JobId], update: &str) -> (String, Vec<Value>) {
    let (list, params) = in_list(ids);
    (
        format!(
            "{update} myjob_jobs SET status = IF(concurrency_key IS NULL, 'pending', 'blocked'), \
                 attempts = 0, rescues = 0, suspicion = 0, \
                 run_at = NOW(6), finished_at = NULL, batch_id = NULL, owner_conn = NULL, \
                 owner_server = NULL, worker = NULL, claimed_at = NULL \
             WHERE id IN ({list}) AND status = 'failed'"
        ),
        params,
    )
}

/// The first of `ids` whose unique key a live job of its queue holds. Served by the unique
/// index `(unique_queue, unique_live)`.
async fn unique_clash(conn: &mut Conn, ids: &[JobId]) -> anyhow::Result<Option<Refused>> {
    let (list, params) = in_list(ids);
    let clash: Option<(u64, String, u64)> = conn
        .exec_first(
            format!(
                "SELECT f.id, f.unique_key, l.id FROM myjob_jobs f \
                 JOIN myjob_jobs l ON l.unique_queue = f.queue AND l.unique_live = f.unique_key \
                 WHERE f.id IN ({list}) AND f.unique_key IS NOT NULL ORDER BY f.id LIMIT 1"
            ),
            Params::Positional(params),
        )
        .await
        .context("looking for unique keys taken since")?;
    Ok(clash.map(|(id, key, holder)| Refused::UniqueKey {
        id: JobId::new(id),
        key,
        holder: JobId::new(holder),
    }))
}

/// The most failed jobs one statement of [`retry_queue`] retries.
const RETRY_CHUNK: u64 = 1000;

/// Retries every failed job of `queue`, a thousand at a time, oldest first; a job whose
/// unique key a live job holds stays failed. Returns how many were retried and how many
/// stayed. The ids come from the claim index `(status, queue, …)`, the change from the
/// primary key.
pub async fn retry_queue(conn: &mut Conn, queue: &str) -> anyhow::Result<(u64, u64)> {
    let (mut retried, mut stayed) = (0, 0);
    let mut after = 0u64;
    loop {
        let ids: Vec<JobId> = conn
            .exec_map(
                "SELECT id FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
                 WHERE status = 'failed' AND queue = ? AND id > ? ORDER BY id LIMIT ?",
                (queue, after, RETRY_CHUNK),
                JobId::new,
            )
            .await
            .with_context(|| format!("reading the failed jobs of queue {queue}"))?;
        let Some(&last) = ids.last() else {
            break;
        };
        after = last.get();
        // IGNORE: a row whose unique key is taken keeps its status instead of failing the
        // statement.
        let n = to_pending(conn, &ids, "UPDATE IGNORE")
            .await
            .with_context(|| format!("queue {queue}"))?;
        retried += n;
        stayed += ids.len() as u64 - n.min(ids.len() as u64);
        if (ids.len() as u64) < RETRY_CHUNK {
            break;
        }
    }
    Ok((retried, stayed))
}

/// What [`cancel`] did to one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cancelled {
    pub id: JobId,
    /// Its state before: pending, blocked, suspect, scheduled or claimed. A claimed job's worker stops its
    /// handler.
    pub was: String,
}

/// The transition `pending | blocked | suspect | scheduled | claimed → cancelled`: final, and the job's unique
/// key is free again. A claimed job keeps its batch_id, by which its worker learns of the
/// cancel at its next keepalive, and its owner, which holds its concurrency-key slot until
/// the worker says the handler has stopped (see migration 11); the worker's own outcome write, fenced by `status =
/// 'claimed'`, then matches nothing. A job that had not come due gets run_at now, so that
/// the age of a finished job is read from one index. All or nothing: a job that is missing
/// or finished refuses the whole change.
pub async fn cancel(
    conn: &mut Conn,
    ids: &[JobId],
) -> anyhow::Result<Result<Vec<Cancelled>, Refused>> {
    in_transaction(conn, async |conn: &mut Conn| {
        let states = match lock_states(conn, ids).await? {
            Ok(s) => s,
            Err(r) => return Ok(Err(r)),
        };
        if let Some((id, status)) = states
            .iter()
            .find(|s| {
                !["pending", "blocked", "suspect", "scheduled", "claimed"].contains(&s.1.as_str())
            })
            .cloned()
        {
            return Ok(Err(Refused::State {
                id,
                status,
                why: "finished already",
            }));
        }
        let (list, params) = in_list(ids);
        conn.exec_drop(
            format!(
                "UPDATE myjob_jobs SET status = 'cancelled', finished_at = NOW(6), \
                     run_at = LEAST(run_at, NOW(6)) \
                 WHERE id IN ({list}) \
                   AND status IN ('pending', 'blocked', 'suspect', 'scheduled', 'claimed')"
            ),
            Params::Positional(params),
        )
        .await
        .context("cancelling jobs")?;
        Ok(Ok(states
            .into_iter()
            .map(|(id, was)| Cancelled { id, was })
            .collect()))
    })
    .await
}

/// Runs `f` in a transaction that commits when it returns `Ok(Ok(_))` and rolls back
/// otherwise.
async fn in_transaction<T, R>(
    conn: &mut Conn,
    f: impl AsyncFnOnce(&mut Conn) -> anyhow::Result<Result<T, R>>,
) -> anyhow::Result<Result<T, R>> {
    conn.query_drop("BEGIN")
        .await
        .context("starting a transaction")?;
    let result = f(conn).await;
    let end = match &result {
        Ok(Ok(_)) => "COMMIT",
        _ => "ROLLBACK",
    };
    conn.query_drop(end)
        .await
        .with_context(|| format!("{end} of the change"))?;
    result
}
