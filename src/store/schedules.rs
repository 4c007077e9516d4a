//! Every statement about `myjob_schedule_ticks` (migration 13): which tick each schedule is
//! on, and a tick's job enqueued once. Times are microseconds since the Unix epoch, read and
//! written through `'1970-01-01' + INTERVAL`, in the sessions' UTC.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use crate::db::{self, Failure, Refusal};
use crate::store::jobs::JobId;

/// A schedule's latest tick, the definition that made it, and the job it enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastTick {
    pub schedule: String,
    pub tick_us: i64,
    pub definition: String,
    pub job_id: Option<u64>,
}

/// A row of [`last_ticks`]: schedule, tick (microseconds), definition, job id.
type LastTickRow = (Vec<u8>, Option<i64>, Vec<u8>, Option<u64>);

/// The latest tick of each of `schedules` that has one: one statement, each arm the last
/// entry of one schedule's range of the primary key.
pub async fn last_ticks(conn: &mut Conn, schedules: &[&str]) -> anyhow::Result<Vec<LastTick>> {
    if schedules.is_empty() {
        return Ok(Vec::new());
    }
    let arm =
        "(SELECT schedule, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', tick), definition, job_id \
               FROM myjob_schedule_ticks WHERE schedule = ? ORDER BY tick DESC LIMIT 1)";
    let sql = vec![arm; schedules.len()].join(" UNION ALL ");
    let params: Vec<Value> = schedules.iter().map(|s| (*s).into()).collect();
    // A tick no time can be made of (a zero date an UPDATE of the user's left there) reads
    // NULL, and is passed over.
    let rows: Vec<LastTickRow> = conn
        .exec(sql, Params::Positional(params))
        .await
        .context("reading the schedules' last ticks")?;
    Ok(rows
        .into_iter()
        .filter_map(|(schedule, tick_us, definition, job_id)| {
            Some(LastTick {
                schedule: String::from_utf8_lossy(&schedule).into_owned(),
                tick_us: tick_us?,
                definition: String::from_utf8_lossy(&definition).into_owned(),
                job_id,
            })
        })
        .collect())
}

/// The database's clock, in microseconds since the Unix epoch (UTC).
pub async fn now_us(conn: &mut Conn) -> anyhow::Result<i64> {
    let now: Option<i64> = conn
        .query_first("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))")
        .await
        .context("reading the database's clock")?;
    now.context("the database returned no time")
}

/// A tick's job, as the schedule says it.
pub struct TickJob<'a> {
    pub schedule: &'a str,
    pub definition: &'a str,
    pub tick_us: i64,
    pub queue: &'a str,
    pub payload: &'a [u8],
    pub priority: i16,
}

/// What [`enqueue_tick`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Tick {
    /// This instance enqueued the tick: its job's id.
    Enqueued(JobId),
    /// Another instance has the tick's row.
    Taken,
    /// A race lost (a deadlock, a lock wait, on Galera a certification conflict): nothing was
    /// written, and whether another instance enqueued the tick is not known; ask again.
    Retry,
}

/// Enqueues a tick's job, once: the tick's row first (1062: another instance has it, and
/// nothing is written; a loser inserts no job), then the job, due at the tick, then the
/// row's job id, in one transaction. The UPDATE assigns `tick` its own value: on a server
/// whose `explicit_defaults_for_timestamp` is off, `tick`, the table's first TIMESTAMP
/// column, auto-updates, and only an explicit assignment keeps it (MySQL and MariaDB alike).
/// Served by the primary key.
pub async fn enqueue_tick(conn: &mut Conn, t: &TickJob<'_>) -> anyhow::Result<Tick> {
    conn.query_drop("BEGIN")
        .await
        .context("starting a tick's transaction")?;
    let result = async {
        conn.exec_drop(
            "INSERT INTO myjob_schedule_ticks (schedule, tick, definition) \
             VALUES (?, '1970-01-01' + INTERVAL ? MICROSECOND, ?)",
            (t.schedule, t.tick_us, t.definition),
        )
        .await
        .context("recording a tick")?;
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload, priority, run_at) \
             VALUES (?, ?, ?, '1970-01-01' + INTERVAL ? MICROSECOND)",
            (t.queue, t.payload, t.priority, t.tick_us),
        )
        .await
        .context("inserting a tick's job")?;
        let id = conn
            .last_insert_id()
            .context("the server returned no job id")?;
        conn.exec_drop(
            "UPDATE myjob_schedule_ticks SET job_id = ?, tick = tick \
             WHERE schedule = ? AND tick = '1970-01-01' + INTERVAL ? MICROSECOND",
            (id, t.schedule, t.tick_us),
        )
        .await
        .context("recording a tick's job")?;
        conn.query_drop("COMMIT")
            .await
            .context("committing a tick")?;
        anyhow::Ok(id)
    }
    .await;
    match result {
        Ok(id) => Ok(Tick::Enqueued(JobId::new(id))),
        Err(e) => {
            // A transaction left open on a live connection would be committed by the next
            // BEGIN, its job with it: a connection that cannot roll back is given up.
            // The error carries no server code, whatever the server said: the caller keeps a
            // connection that answered with one, and this one must go.
            if let Err(r) = conn.query_drop("ROLLBACK").await {
                return Err(anyhow::anyhow!(
                    "rolling a tick's transaction back: {}",
                    crate::error::chain(&r)
                ));
            }
            if db::classify(&e) == Failure::Refused(Refusal::Duplicate) {
                Ok(Tick::Taken)
            } else if matches!(db::classify(&e), Failure::Conflict(_)) {
                Ok(Tick::Retry)
            } else {
                Err(e)
            }
        }
    }
}

/// Every schedule that has ticks, with its latest, in microseconds: those of schedules no
/// longer in the config too, to prune. Served by the primary key (a loose scan: one entry
/// per schedule).
pub async fn heads(conn: &mut Conn) -> anyhow::Result<Vec<(String, i64)>> {
    let rows: Vec<(Vec<u8>, Option<i64>)> = conn
        .query(
            "SELECT schedule, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', MAX(tick)) \
             FROM myjob_schedule_ticks GROUP BY schedule",
        )
        .await
        .context("reading which schedules have ticks")?;
    Ok(rows
        .into_iter()
        .filter_map(|(schedule, tick)| {
            Some((String::from_utf8_lossy(&schedule).into_owned(), tick?))
        })
        .collect())
}

/// Deletes a schedule's ticks before `before_us` that were also enqueued before
/// `enqueued_before_us` (a batch at most); the caller keeps the latest, which says which tick
/// the schedule is on. A row lives by its own age too: another instance's pass that read an
/// older latest tick may be about to catch up the same old ticks, and their rows must still
/// say they are taken. Served by the primary key's range.
pub async fn prune(
    conn: &mut Conn,
    schedule: &str,
    before_us: i64,
    enqueued_before_us: i64,
) -> anyhow::Result<u64> {
    conn.exec_drop(
        "DELETE FROM myjob_schedule_ticks \
         WHERE schedule = ? AND tick < '1970-01-01' + INTERVAL ? MICROSECOND \
           AND enqueued_at < '1970-01-01' + INTERVAL ? MICROSECOND \
         ORDER BY tick LIMIT 1000",
        (schedule, before_us, enqueued_before_us),
    )
    .await
    .with_context(|| format!("deleting old ticks of schedule {schedule}"))?;
    Ok(conn.affected_rows())
}
