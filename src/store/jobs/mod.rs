//! Every statement myjob sends about `myjob_jobs`, and nothing else: the worker's and the
//! producer's here, the operator commands' in [`admin`], the deletion of finished jobs in
//! [`purge`]. Values are always bound as parameters; only the number of `?` in an `IN (…)`
//! list varies.
//!
//! Every write about a claimed job is fenced by its `batch_id`: the reaper clears `batch_id`
//! when it puts a job back, and a new claim stamps a new one, so a late write from the old
//! owner matches no row and changes nothing.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, TxOpts, Value};

use crate::store::queues;

pub use keys::KeySlot;

pub mod admin;
pub mod keys;
pub mod purge;
pub mod undated;

/// A claimed job's payload, as the read-back left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Loaded(Vec<u8>),
    /// Larger than the worker's `max_payload_bytes`: its length, its bytes left unread.
    TooBig(u64),
}

/// A job as the claim hands it out.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: u64,
    pub queue: String,
    pub payload: Payload,
    /// This attempt's number, counting from 1 (the claim adds one to `attempts`).
    pub attempt: u32,
    /// The job's own limit; NULL means the queue's.
    pub max_attempts: Option<u32>,
    /// From due (run_at) to the claim, by the database's clock: the metrics' wait.
    pub due_to_claim: std::time::Duration,
    /// When the batch was read back, by this host's clock: the rest of the wait is from here.
    pub read_at: tokio::time::Instant,
    /// The slot of its concurrency key it holds, if it has a key.
    pub slot: Option<KeySlot>,
}

/// Who claims: written into the claimed rows for the reaper and for people reading the table.
pub struct Claimer<'a> {
    pub owner_server: &'a str,
    pub worker: &'a str,
}

/// A fresh batch id: random, so claimers on different hosts need no coordination, and never
/// 0 so it cannot be mistaken for a missing one.
pub fn new_batch_id() -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return id;
        }
    }
}

/// `?, ?, …` for `n` values, with `n` rounded up to a power of two (the list is padded by
/// repeating its last value, which changes nothing in an `IN`). A few sizes of statement stay
/// in the driver's prepared-statement cache instead of one per batch length.
pub(crate) fn in_list<T: Clone + Into<Value>>(values: &[T]) -> (String, Vec<Value>) {
    let n = values.len().max(1).next_power_of_two();
    let mut bound: Vec<Value> = values.iter().cloned().map(Into::into).collect();
    while bound.len() < n {
        bound.push(bound.last().cloned().unwrap_or(Value::NULL));
    }
    (vec!["?"; n].join(", "), bound)
}

/// The claim statement (see [`claim`]); public so that the benchmark can EXPLAIN it. Its
/// walk of the claim index starts at the place [`CLAIM_FROM`] read: the condition on
/// `priority` and `id` is the index's own order past that place, two ranges of it.
pub const CLAIM: &str = "UPDATE myjob_jobs FORCE INDEX (myjob_jobs_claim) \
     SET status = 'claimed', batch_id = ?, owner_conn = CONNECTION_ID(), owner_server = ?, \
         worker = ?, claimed_at = NOW(6), attempts = LEAST(attempts + 1, 4294967295) \
     WHERE status = 'pending' AND queue = ? AND run_at <= NOW(6) \
       AND (priority < ? OR (priority = ? AND id >= ?)) \
     ORDER BY status, queue, priority DESC, id LIMIT ?";

/// The place of a queue's first due job in the claim index, read without a lock. A locking
/// walk of the index locks and unlocks each entry that a finished job left delete-marked in
/// the `pending` range until InnoDB's purge removes it, and a burst of finished jobs leaves
/// that range full of them (bench item 21: a drain 5.6 times as long right after 300,000
/// jobs finished at once); a read without a lock passes them over. A job that becomes due
/// before that place after this read waits for the next claim, as it would had it come just
/// after the claim. The ORDER BY leaves out the constant prefix the UPDATE names: MariaDB
/// 10.11 sorts every pending row of the queue for a SELECT that names it.
const CLAIM_FROM: &str = "SELECT priority, id FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
     WHERE status = 'pending' AND queue = ? AND run_at <= NOW(6) \
     ORDER BY priority DESC, id LIMIT 1";

/// The head of a queue as a lane sees it (see [`claim`]): its first due jobs in run order,
/// read without a lock, each with the hash that says its lane and how long it has waited
/// ([`Age`]: 2 past [`HELP_AFTER`], 1 past [`STEAL_AFTER`]). Ordered as [`CLAIM_FROM`] is.
const LANE_WINDOW: &str = "SELECT id, CRC32(id), \
         CASE WHEN run_at <= NOW(6) - INTERVAL ? MICROSECOND THEN 2 \
              WHEN run_at <= NOW(6) - INTERVAL ? MICROSECOND THEN 1 ELSE 0 END \
     FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
     WHERE status = 'pending' AND queue = ? AND run_at <= NOW(6) \
     ORDER BY priority DESC, id LIMIT ?";

/// How long a due job of another lane waits for its own instance before a lane's claim takes
/// it: two of the default poll intervals, so that an idle instance has seen its jobs by then.
pub const STEAL_AFTER: Duration = Duration::from_secs(1);

/// How long a due job of the next lane waits behind a backlog before a lane that found none
/// of its own takes it (see [`pick`]): its instance claims, but cannot keep up. Longer than
/// a lane that is merely behind the others makes its jobs wait in a burst (bench item 20).
pub const HELP_AFTER: Duration = Duration::from_secs(5);

/// How many rows of the head a lane's claim of `limit` reads: twice its share and at least
/// 64, so that a lane finds its own jobs there however they fall, and a bound on what one
/// claim reads.
fn window(limit: usize, of: u32) -> usize {
    (limit * of as usize * 2).clamp(64, 4_000)
}

/// Whose a job of the head is, to the lane that read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kin {
    /// The lane's own.
    Own,
    /// The next lane's (`part + 1`, round the lanes), which this lane helps.
    Next,
    /// Another lane's.
    Other,
}

/// How long a job of the head has been due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Age {
    Fresh,
    /// Past [`STEAL_AFTER`].
    Waiting,
    /// Past [`HELP_AFTER`].
    Stuck,
}

impl From<u8> for Age {
    fn from(code: u8) -> Self {
        match code {
            0 => Age::Fresh,
            1 => Age::Waiting,
            _ => Age::Stuck,
        }
    }
}

/// A row of the head as a lane read it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    id: u64,
    kin: Kin,
    age: Age,
}

/// What a lane's claim takes of the head it read: its own jobs in run order; when it found
/// none of its own there, the next lane's (`part + 1`, round the lanes) that have waited past
/// [`HELP_AFTER`] (its instance claims but cannot keep up); and when the head was shorter
/// than the window (the lane ran dry, the queue is nearly drained), any other lane's that
/// waited past [`STEAL_AFTER`]. The others' are taken the last first: their own lane's
/// claim takes them from the first, and the two meet only when the lane has fewer left than
/// both want.
///
/// Each rule was measured with bench item 20 (conflicts per 1,000 jobs, 4 instances over 3
/// nodes): a lane that took any lane's waited jobs whenever it had room met the others at
/// the same last rows of the head (3.9, against 0.2); one that took the next lane's only,
/// whenever it had room, still met their owner (3.5), and when it found none of its own,
/// after a second, 1.9 against 0.6; any lane's that waited 5 s, whenever it had room, 3.3
/// against 1.2. A lane that helped none behind a backlog sat idle while a slow instance,
/// still claiming and so still one of the lanes, held the head with its waiting jobs. What
/// this leaves: a lane that finds even one of its own does not help, so a slow lane's
/// backlog may grow to a window before the lane before it helps; and only that lane helps.
fn pick(head: &[Seen], limit: usize, window: usize) -> Vec<u64> {
    let dry = head.len() < window;
    let starved = !head.iter().any(|s| s.kin == Kin::Own);
    let own = head.iter().filter(|s| s.kin == Kin::Own);
    let taken = |s: &&Seen| match s.kin {
        Kin::Own => false,
        Kin::Next if starved && s.age == Age::Stuck => true,
        Kin::Next | Kin::Other => dry && s.age >= Age::Waiting,
    };
    own.chain(head.iter().rev().filter(taken))
        .map(|s| s.id)
        .take(limit)
        .collect()
}

/// Which part of a queue's head a claim takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// All of it: not a Galera node, or the only instance that claims from the queue.
    Whole,
    /// The jobs whose `CRC32(id) % of` is `part`, and the others' that waited too long: one
    /// of `of` instances that claim from the queue through Galera nodes. A hash, not `id %
    /// of`: Galera's auto-increment gives the rows one node inserts ids a cluster size
    /// apart, all in one residue.
    Part { of: u32, part: u32 },
    /// None of its own yet, only the others' that waited too long: other instances claim
    /// from the queue through Galera nodes and have not seen this one yet. Claiming the
    /// whole head would race each of their lanes.
    Joining,
}

impl Lane {
    /// Whose a job whose `CRC32(id)` is `crc` is, to this lane.
    fn kin(self, crc: u32) -> Kin {
        match self {
            Lane::Whole => Kin::Own,
            Lane::Part { of, part } if crc % of == part => Kin::Own,
            Lane::Part { of, part } if crc % of == (part + 1) % of => Kin::Next,
            Lane::Part { .. } | Lane::Joining => Kin::Other,
        }
    }
}

/// Claims up to `limit` due jobs of one queue with the batch_id pattern: the UPDATE stamps
/// them, [`read_batch`] reads them back. Returns how many it claimed. One queue per statement:
/// the claim index `(status, queue, priority DESC, id)` then walks only this queue's pending
/// rows, in run order, and stops after `limit`, whatever other queues hold. FORCE INDEX: left
/// alone, the optimizer may pick another index with `status` in it and sort every pending
/// row. `run_at <= NOW(6)` skips the few rows a producer inserted with a future run_at that
/// the stager has not moved to `scheduled` yet. The ORDER BY names the index's whole prefix,
/// constant as status and queue are: MariaDB's UPDATE follows the index only then, and sorts
/// every pending row of the queue otherwise.
///
/// With a [`Lane::Part`] (or [`Lane::Joining`]), the lane reads the head's first rows without a lock and claims by
/// primary key its own jobs, and those of other lanes that waited (see [`pick`]). Two
/// instances through two Galera nodes then seldom write one row, which would be a
/// certification conflict. And the claim locks only what it takes: an UPDATE that walks the
/// claim index keeps, until it commits, its lock on the index entry of every row it walks
/// past (another lane's) even at READ COMMITTED, which releases only the row's own, and a
/// node's applier that must change such a row aborts the local claim that holds it.
pub async fn claim(
    conn: &mut Conn,
    batch_id: u64,
    queue: &str,
    limit: usize,
    who: &Claimer<'_>,
    lane: Lane,
) -> anyhow::Result<usize> {
    let of = match lane {
        Lane::Whole => {
            let first: Option<(i16, u64)> = conn
                .exec_first(CLAIM_FROM, (queue,))
                .await
                .with_context(|| format!("reading queue {queue}'s first due job"))?;
            let Some((priority, id)) = first else {
                return Ok(0);
            };
            conn.exec_drop(
                CLAIM,
                (
                    batch_id,
                    who.owner_server,
                    who.worker,
                    queue,
                    priority,
                    priority,
                    id,
                    limit as u64,
                ),
            )
            .await
            .with_context(|| format!("claiming jobs of queue {queue}"))?;
            return Ok(conn.affected_rows() as usize);
        }
        Lane::Part { of, .. } => of,
        Lane::Joining => 1,
    };
    let stuck = HELP_AFTER.as_micros() as u64;
    let waited = STEAL_AFTER.as_micros() as u64;
    let window = window(limit, of);
    let head: Vec<(u64, u32, u8)> = conn
        .exec(LANE_WINDOW, (stuck, waited, queue, window as u64))
        .await
        .with_context(|| format!("reading queue {queue}'s head for its {lane}"))?;
    let head: Vec<Seen> = head
        .into_iter()
        .map(|(id, crc, age)| Seen {
            id,
            kin: lane.kin(crc),
            age: Age::from(age),
        })
        .collect();
    claim_ids(conn, batch_id, queue, &pick(&head, limit, window), who)
        .await
        .with_context(|| format!("claiming jobs of queue {queue}'s {lane}"))
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lane::Whole => write!(f, "whole head"),
            Lane::Part { of, part } => write!(f, "lane {part} of {of}"),
            Lane::Joining => write!(f, "lane to come"),
        }
    }
}

/// The claim of jobs a lane picked from its window, by their primary keys: it locks only the
/// rows it stamps. A job another claim took since it was read is no longer pending
/// and is left alone. Served by the primary key, forced: an optimizer that chose the claim
/// index for `status` and `queue` would walk it and lock the other lanes' entries again.
async fn claim_ids(
    conn: &mut Conn,
    batch_id: u64,
    queue: &str,
    ids: &[u64],
    who: &Claimer<'_>,
) -> anyhow::Result<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let (list, ids) = in_list(ids);
    let mut params: Vec<Value> = vec![batch_id.into(), who.owner_server.into(), who.worker.into()];
    params.extend(ids);
    params.push(queue.into());
    conn.exec_drop(
        format!(
            "UPDATE myjob_jobs FORCE INDEX (PRIMARY) \
             SET status = 'claimed', batch_id = ?, owner_conn = CONNECTION_ID(), \
                 owner_server = ?, worker = ?, claimed_at = NOW(6), \
                 attempts = LEAST(attempts + 1, 4294967295) \
             WHERE id IN ({list}) AND status = 'pending' AND queue = ? AND run_at <= NOW(6)"
        ),
        Params::Positional(params),
    )
    .await?;
    Ok(conn.affected_rows() as usize)
}

/// The claim of one suspect into an instance's quarantine slot (see [`claim_suspect`]).
const CLAIM_SUSPECT: &str = "UPDATE myjob_jobs FORCE INDEX (myjob_jobs_claim) \
     SET status = 'claimed', batch_id = ?, owner_conn = CONNECTION_ID(), owner_server = ?, \
         worker = ?, claimed_at = NOW(6), attempts = LEAST(attempts + 1, 4294967295) \
     WHERE status = 'suspect' AND queue = ? \
     ORDER BY status, queue, priority DESC, id LIMIT 1";

/// Claims the first suspect of `queue` (a job held at two deaths of its workers; see
/// migration 8) under its own `batch_id`, to run in the instance's quarantine slot: one
/// suspect per instance at a time, so that a death of the instance names it. Returns whether
/// it got one. Served by the claim index, on the `'suspect'` range: a few rows at most.
pub async fn claim_suspect(
    conn: &mut Conn,
    batch_id: u64,
    queue: &str,
    who: &Claimer<'_>,
) -> anyhow::Result<bool> {
    conn.exec_drop(
        CLAIM_SUSPECT,
        (batch_id, who.owner_server, who.worker, queue),
    )
    .await
    .with_context(|| format!("claiming a suspect of queue {queue}"))?;
    Ok(conn.affected_rows() == 1)
}

/// What a consumer's probe found (see [`probe`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// The queues asked about that have pending jobs, paused or not.
    pub busy: Vec<String>,
    /// Every paused queue, when asked for.
    pub paused: Option<Vec<String>>,
    /// A queue of those asked about for suspects that has one, if any.
    pub suspects: Option<String>,
    /// Whether a queue asked about has blocked jobs (waiting for a concurrency-key slot).
    pub blocked: bool,
}

/// Which of `queues` have pending jobs, with `pauses` which queues are paused, and which of
/// `suspects` (the queues an instance with a free quarantine slot may take a suspect from)
/// has a suspect: one statement however many queues an instance serves, so that an idle
/// instance asks once per poll rather than once per queue. Each pending arm reads the first
/// entry of one queue's range of the claim index `(status, queue, …)`, so the answer costs
/// one index dive per queue whatever the backlogs hold; the suspects' arm reads the first
/// entry of the `'suspect'` range for those queues; the paused queues are a few rows of
/// `myjob_queues`; the blocked arm reads the first non-NULL entry of the queues' ranges of
/// the blocked index `(queue, blocked_key, …)`. It does not look at `run_at`: a pending job not yet due (a row whose
/// run_at an UPDATE moved later) is rare and short-lived, and costs one empty claim at most.
pub async fn probe(
    conn: &mut Conn,
    queues: &[&str],
    pauses: bool,
    suspects: &[&str],
) -> anyhow::Result<Probe> {
    const PENDING: u8 = 0;
    const SUSPECT: u8 = 2;
    const BLOCKED: u8 = 3;
    let arm = "(SELECT queue, 0 FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
               WHERE status = 'pending' AND queue = ? LIMIT 1)";
    let mut arms: Vec<String> = vec![arm.to_owned(); queues.len()];
    if pauses {
        arms.push(format!(
            "(SELECT queue, 1 FROM ({}) AS paused)",
            queues::PAUSED
        ));
    }
    let mut params: Vec<Value> = queues.iter().map(|q| (*q).into()).collect();
    if !queues.is_empty() {
        let (list, values) = in_list(queues);
        arms.push(format!(
            "(SELECT queue, 3 FROM myjob_jobs FORCE INDEX (myjob_jobs_blocked) \
              WHERE queue IN ({list}) AND blocked_key IS NOT NULL LIMIT 1)"
        ));
        params.extend(values);
    }
    if !suspects.is_empty() {
        let (list, values) = in_list(suspects);
        arms.push(format!(
            "(SELECT queue, 2 FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
              WHERE status = 'suspect' AND queue IN ({list}) LIMIT 1)"
        ));
        params.extend(values);
    }
    if arms.is_empty() {
        return Ok(Probe::default());
    }
    let rows: Vec<(Vec<u8>, u8)> = conn
        .exec(arms.join(" UNION ALL "), Params::Positional(params))
        .await
        .context("asking which queues have pending jobs")?;
    let mut probe = Probe {
        busy: Vec::new(),
        paused: pauses.then(Vec::new),
        suspects: None,
        blocked: false,
    };
    for (queue, kind) in rows {
        // The column is binary: no name may make the conversion fail.
        let queue = String::from_utf8_lossy(&queue).into_owned();
        match (kind, probe.paused.as_mut()) {
            (PENDING, _) => probe.busy.push(queue),
            (SUSPECT, _) => probe.suspects = Some(queue),
            (BLOCKED, _) => probe.blocked = true,
            (_, Some(paused)) => paused.push(queue),
            (_, None) => {}
        }
    }
    Ok(probe)
}

/// The jobs a claim stamped with `batch_id`, in run order, their payloads up to
/// `max_payload` bytes: a larger one is left on the server, and its length said instead (a
/// producer may write 16 MiB into every row). Served by the batch_id index.
pub async fn read_batch(
    conn: &mut Conn,
    batch_id: u64,
    max_payload: u64,
) -> anyhow::Result<Vec<ClaimedJob>> {
    // The queue as bytes: the column is binary, and no row may make the conversion panic.
    type Row = (
        u64,
        Vec<u8>,
        Option<Vec<u8>>,
        u64,
        u32,
        Option<u32>,
        Option<i64>,
        Option<Vec<u8>>,
        Option<u16>,
    );
    let rows: Vec<Row> = conn
        .exec(
            "SELECT id, queue, IF(LENGTH(payload) <= ?, payload, NULL), LENGTH(payload), \
                    attempts, max_attempts, \
                    TIMESTAMPDIFF(MICROSECOND, run_at, claimed_at), concurrency_key, slot \
             FROM myjob_jobs \
             WHERE batch_id = ? AND status = 'claimed' ORDER BY priority DESC, id",
            (max_payload, batch_id),
        )
        .await
        .context("reading the claimed batch")?;
    let read_at = tokio::time::Instant::now();
    Ok(rows
        .into_iter()
        .map(
            |(id, queue, payload, length, attempt, max_attempts, waited, key, slot)| {
                let queue = String::from_utf8_lossy(&queue).into_owned();
                ClaimedJob {
                    id,
                    // A keyed job admitted by the gate has its slot; one a producer inserted
                    // as pending itself has none, and holds nothing to hand on.
                    slot: key.zip(slot).map(|(key, slot)| KeySlot {
                        queue: queue.clone(),
                        key,
                        slot,
                    }),
                    queue,
                    payload: match payload {
                        Some(bytes) => Payload::Loaded(bytes),
                        None => Payload::TooBig(length),
                    },
                    attempt,
                    max_attempts,
                    // A suspect's run_at is its first due time; a job claimed early never is.
                    due_to_claim: std::time::Duration::from_micros(
                        waited.unwrap_or(0).max(0) as u64
                    ),
                    read_at,
                }
            },
        )
        .collect())
}

/// The most rows one stager statement moves; it repeats while it moves that many.
const STAGE_CHUNK: u64 = 1000;
/// The most statements of [`STAGE_CHUNK`] rows one call of [`stage`] sends.
const STAGE_CHUNKS: usize = 10;

/// What one call of [`stage`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Staged {
    pub moved: u64,
    /// It stopped at its bound with rows perhaps left to move: call again at once.
    pub more: bool,
}

/// The stager: moves due `scheduled` jobs to `pending` (to `blocked` when they have a
/// concurrency key: the gate admits them), and jobs a producer inserted as `pending` with a
/// future run_at to `scheduled` (and blocked ones whose run_at an UPDATE moved later), so
/// that the claim's and the gate's ranges hold due jobs only. Three ranges of the `(status,
/// run_at)` index: when nothing is due, a read of an entry
/// or two. The UPDATE repeats while it moves a whole chunk, a bounded number of times, so
/// that a stager's connection is never busy for long. With a `lag`, only the scheduled jobs
/// due for longer than that move: what a stager without the lock does when the one with it
/// has fallen behind (see `stager`).
pub async fn stage(conn: &mut Conn, lag: Duration) -> anyhow::Result<Staged> {
    let lag = lag.as_micros() as u64;
    // A plain read first, which takes no lock: an UPDATE's range scan locks the first row
    // past each range, a claimed row that outcome writes and claims are busy with, and when
    // nothing is due (nearly always) there is nothing to change anyway.
    let due: Option<u8> = conn
        .exec_first(
            "SELECT 1 FROM myjob_jobs FORCE INDEX (myjob_jobs_due) \
             WHERE (status = 'scheduled' AND run_at <= NOW(6) - INTERVAL ? MICROSECOND) \
                OR (status IN ('pending', 'blocked') AND run_at > NOW(6)) \
             LIMIT 1",
            (lag,),
        )
        .await
        .context("looking for jobs to stage")?;
    if due.is_none() {
        return Ok(Staged::default());
    }
    let mut staged = Staged::default();
    for _ in 0..STAGE_CHUNKS {
        conn.exec_drop(
            "UPDATE myjob_jobs FORCE INDEX (myjob_jobs_due) \
             SET status = IF(status = 'scheduled', \
                              IF(concurrency_key IS NULL, 'pending', 'blocked'), 'scheduled') \
             WHERE (status = 'scheduled' AND run_at <= NOW(6) - INTERVAL ? MICROSECOND) \
                OR (status IN ('pending', 'blocked') AND run_at > NOW(6)) \
             LIMIT ?",
            (lag, STAGE_CHUNK),
        )
        .await
        .context("staging scheduled jobs")?;
        let n = conn.affected_rows();
        staged.moved += n;
        staged.more = n == STAGE_CHUNK;
        if !staged.more {
            break;
        }
    }
    Ok(staged)
}

/// Of the claims `(id, batch_id)`, those the reaper has not put back. Served by the batch_id
/// index.
pub async fn still_claimed(conn: &mut Conn, claims: &[(u64, u64)]) -> anyhow::Result<Vec<u64>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let mut batches: Vec<u64> = claims.iter().map(|c| c.1).collect();
    batches.sort_unstable();
    batches.dedup();
    let (list, params) = in_list(&batches);
    let rows: Vec<(u64, u64)> = conn
        .exec(
            format!(
                "SELECT id, batch_id FROM myjob_jobs \
                 WHERE batch_id IN ({list}) AND status = 'claimed'"
            ),
            Params::Positional(params),
        )
        .await
        .context("reading which claims are still held")?;
    Ok(claims
        .iter()
        .filter(|c| rows.contains(c))
        .map(|c| c.0)
        .collect())
}

/// Of the jobs claimed in `batch_ids`, those an operator cancelled since (`myjob cancel`
/// turns a claimed job `cancelled` in place, batch_id and all). The consumer asks once a
/// second while it has jobs running, in place of the keepalive's ping. Served by the batch_id
/// index.
pub async fn cancelled(conn: &mut Conn, batch_ids: &[u64]) -> anyhow::Result<Vec<u64>> {
    let (list, params) = in_list(batch_ids);
    conn.exec(
        format!("SELECT id FROM myjob_jobs WHERE batch_id IN ({list}) AND status = 'cancelled'"),
        Params::Positional(params),
    )
    .await
    .context("asking which running jobs were cancelled")
}

/// What became of one finished job, and so what to write about it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The handler succeeded.
    Done,
    /// `scheduled`, due again after `delay`.
    Retry { delay: Duration, error: String },
    /// Out of attempts, or a permanent failure.
    Fail { error: String },
    /// Back to `pending` at once, and the attempt does not count: the job was cut short by a
    /// shutdown, not by anything it did.
    Release,
    /// An operator cancelled the job while it ran, and its handler was stopped: the row says
    /// `cancelled` already; the write only says the handler has stopped (see [`CANCEL_SEEN`]).
    Cancelled,
}

/// One job's outcome, with the batch that fences its write.
#[derive(Debug, Clone)]
pub struct Completion {
    pub job_id: u64,
    pub batch_id: u64,
    pub outcome: Outcome,
    /// The concurrency-key slot the job held, handed on once the outcome is written.
    pub slot: Option<KeySlot>,
}

/// The most bytes of a handler's reason `last_error` keeps. The column is TEXT (65,535
/// bytes), and a persistent handler may answer with 64 KiB, each control byte cleaned into
/// the three of U+FFFD: a reason the column cannot hold would make the server refuse the
/// outcome's write, and a retry end as a failure.
const LAST_ERROR_MAX: usize = 16 * 1024;
/// What ends a reason cut to [`LAST_ERROR_MAX`].
const CUT_MARK: &str = " … (cut to 16 KiB)";

/// `error` as `last_error` keeps it: whole when it fits in [`LAST_ERROR_MAX`] bytes, else its
/// beginning, cut on a character boundary, and a mark that says so.
pub fn fit_error(error: &str) -> String {
    if error.len() <= LAST_ERROR_MAX {
        return error.to_owned();
    }
    let mut end = LAST_ERROR_MAX - CUT_MARK.len();
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT_MARK}", &error[..end])
}

/// The transition a worker writes when the handler of a job cancelled while it ran has
/// stopped: the claim's owner is cleared (batch_id and worker stay, for the record). Until
/// then the cancelled row is what tells the worker to stop the handler, so a purge keeps it
/// (see `purge::purge_batch`). Served by the primary key.
const CANCEL_SEEN: &str = "UPDATE myjob_jobs SET owner_conn = NULL, owner_server = NULL, \
         claimed_at = NULL, slot = NULL \
     WHERE id = ? AND batch_id = ? AND status = 'cancelled'";

/// The most `done` outcomes one statement writes (see [`write_outcomes`]).
const DONE_CHUNK: usize = 4096;

/// One fenced UPDATE about finished jobs.
struct Statement {
    sql: String,
    params: Vec<Value>,
    /// The claims it writes about, `(job id, batch_id)`, so that a short count can be traced
    /// to its jobs.
    claims: Vec<(u64, u64)>,
}

/// The outcomes [`write_outcomes`] did not write, because their job was no longer claimed
/// under its batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unwritten {
    /// The claim was reaped and the job put back meanwhile: it is someone else's now. As
    /// `(job id, batch_id)`: the same job may be this instance's again, under a new batch.
    pub lost: Vec<(u64, u64)>,
    /// The handler finished the job itself, in its own transaction, under the same batch (the
    /// exactly-once recipe): nothing left to write.
    pub finished: Vec<u64>,
}

/// Writes a set of outcomes: one statement for every `done` (the common case), whatever
/// batches they came from, one per job for the rest (retries and failures carry their own
/// error text; releases happen only at a shutdown); in one transaction when there is more
/// than one statement. Returns the jobs whose write matched no row, and why.
pub async fn write_outcomes(
    conn: &mut Conn,
    completions: &[Completion],
) -> anyhow::Result<Unwritten> {
    let mut statements: Vec<Statement> = Vec::new();
    let mut done: Vec<(u64, u64)> = Vec::new();
    for c in completions {
        let (sql, params): (&str, Vec<Value>) = match &c.outcome {
            Outcome::Cancelled => (CANCEL_SEEN, Vec::new()),
            Outcome::Done => {
                done.push((c.job_id, c.batch_id));
                continue;
            }
            // Scheduled, out of the claim's range until the stager finds it due. A job that
            // ended by itself is not what brought a worker down: its suspicion is cleared.
            Outcome::Retry { delay, error } => (
                "UPDATE myjob_jobs SET status = 'scheduled', \
                     run_at = NOW(6) + INTERVAL ? MICROSECOND, \
                     last_error = ?, batch_id = NULL, owner_conn = NULL, owner_server = NULL, \
                     worker = NULL, claimed_at = NULL, suspicion = 0, slot = NULL \
                 WHERE id = ? AND batch_id = ? AND status = 'claimed'",
                vec![(delay.as_micros() as u64).into(), fit_error(error).into()],
            ),
            Outcome::Fail { error } => (
                "UPDATE myjob_jobs SET status = 'failed', finished_at = NOW(6), last_error = ?, \
                     slot = NULL \
                 WHERE id = ? AND batch_id = ? AND status = 'claimed'",
                vec![fit_error(error).into()],
            ),
            // A suspect goes back to waiting for a quarantine slot.
            Outcome::Release => (
                "UPDATE myjob_jobs SET status = IF(suspicion >= 2, 'suspect', 'pending'), \
                     attempts = GREATEST(attempts, 1) - 1, \
                     batch_id = NULL, owner_conn = NULL, owner_server = NULL, worker = NULL, \
                     claimed_at = NULL \
                 WHERE id = ? AND batch_id = ? AND status = 'claimed'",
                Vec::new(),
            ),
        };
        let mut params = params;
        params.extend([c.job_id.into(), c.batch_id.into()]);
        statements.push(Statement {
            sql: sql.to_owned(),
            params,
            claims: vec![(c.job_id, c.batch_id)],
        });
    }
    // A job whose outcome came under two batches (reaped, then claimed here again) goes into
    // a statement of its own, so that each row's fence names one batch.
    // At most DONE_CHUNK a statement: three placeholders each, padded, stay well under the
    // protocol's 65,535.
    while !done.is_empty() {
        let mut ids = std::collections::HashSet::new();
        let mut once: Vec<(u64, u64)> = Vec::new();
        done.retain(|&(id, batch_id)| {
            if once.len() < DONE_CHUNK && ids.insert(id) {
                once.push((id, batch_id));
                return false;
            }
            true
        });
        statements.push(done_statement(&once));
    }

    // One statement commits by itself; several share a transaction (one commit, one fsync).
    // On an error the caller drops the connection, and the server rolls the rest back.
    let several = statements.len() > 1;
    if several {
        conn.query_drop("BEGIN")
            .await
            .context("starting the outcome transaction")?;
    }
    let mut unwritten = Unwritten::default();
    for st in statements {
        conn.exec_drop(&st.sql, Params::Positional(st.params))
            .await
            .context("writing outcomes")?;
        if (conn.affected_rows() as usize) == st.claims.len() {
            continue;
        }
        // Rare: tell the jobs whose handler finished them under their batch from those whose
        // claim was reaped (the reaper clears batch_id). Served by the primary key.
        let ids: Vec<u64> = st.claims.iter().map(|c| c.0).collect();
        let (list, params) = in_list(&ids);
        let rows: Vec<(u64, Option<u64>, String)> = conn
            .exec(
                format!("SELECT id, batch_id, status FROM myjob_jobs WHERE id IN ({list})"),
                Params::Positional(params),
            )
            .await
            .context("reading which jobs lost their claim")?;
        for (id, batch_id) in st.claims {
            let row = rows.iter().find(|r| r.0 == id && r.1 == Some(batch_id));
            // As before: a job this statement wrote reads as finished too, which is as good.
            match row.map(|r| r.2.as_str()) {
                Some("cancelled") => {
                    // A job cancelled while its handler ran on to its end: the handler has
                    // stopped.
                    conn.exec_drop(CANCEL_SEEN, (id, batch_id))
                        .await
                        .context("saying a cancelled job's handler has stopped")?;
                    unwritten.finished.push(id);
                }
                Some("done" | "failed") => unwritten.finished.push(id),
                _ => unwritten.lost.push((id, batch_id)),
            }
        }
    }
    if several {
        conn.query_drop("COMMIT")
            .await
            .context("committing outcomes")?;
    }
    Ok(unwritten)
}

/// The one UPDATE for the `done` outcomes of `claims` `(job id, batch_id)`, each id once: the
/// primary key's range over the ids, each row fenced by its own batch (a CASE on the id,
/// which both servers evaluate per row). Both lists are padded to a power of two by repeating
/// their last value, so that a few sizes of statement stay prepared.
fn done_statement(claims: &[(u64, u64)]) -> Statement {
    let ids: Vec<u64> = claims.iter().map(|c| c.0).collect();
    let (list, mut params) = in_list(&ids);
    let arms = claims.len().max(1).next_power_of_two();
    // CAST: MySQL types a parameter once, at PREPARE, and a CASE of parameters alone might
    // compare with the BIGINT UNSIGNED column as a DOUBLE, which cannot tell apart two random
    // batch ids close to each other.
    let cases = vec!["WHEN ? THEN CAST(? AS UNSIGNED)"; arms].join(" ");
    for i in 0..arms {
        let (id, batch_id) = claims[i.min(claims.len() - 1)];
        params.extend([id.into(), batch_id.into()]);
    }
    Statement {
        sql: format!(
            "UPDATE myjob_jobs SET status = 'done', finished_at = NOW(6), slot = NULL \
             WHERE id IN ({list}) AND status = 'claimed' AND batch_id = CASE id {cases} END"
        ),
        params,
        claims: claims.to_vec(),
    }
}

/// After a reconnect: marks this worker's live claims as owned by the new connection, so the
/// reaper does not take them from handlers that are still running; so too the jobs cancelled
/// while they ran whose handlers have not been seen to stop (their concurrency-key slot is
/// held until then). Fenced by batch_id: a batch
/// the reaper already put back is not taken again.
pub async fn adopt(conn: &mut Conn, batch_ids: &[u64], owner_server: &str) -> anyhow::Result<u64> {
    if batch_ids.is_empty() {
        return Ok(0);
    }
    let (list, values) = in_list(batch_ids);
    let mut params: Vec<Value> = vec![owner_server.into()];
    params.extend(values);
    conn.exec_drop(
        format!(
            "UPDATE myjob_jobs SET owner_conn = CONNECTION_ID(), owner_server = ? \
             WHERE batch_id IN ({list}) \
               AND (status = 'claimed' OR (status = 'cancelled' AND owner_conn IS NOT NULL))"
        ),
        Params::Positional(params),
    )
    .await
    .context("adopting claims after a reconnect")?;
    Ok(conn.affected_rows())
}

/// A claim older than the reaper's threshold, with what it needs to judge it.
#[derive(Debug, Clone)]
pub struct OldClaim {
    pub id: u64,
    pub batch_id: Option<u64>,
    pub owner_conn: Option<u64>,
    pub owner_server: Option<String>,
    pub attempts: u32,
    /// Rescues so far: deaths of its worker while it ran in quarantine.
    pub rescues: u32,
    /// Deaths of its workers it was held at, up to 2 (see migration 8): at 2 it was claimed
    /// as a suspect, into its instance's quarantine slot.
    pub suspicion: u8,
    /// `host:pid:instance` of the claimer.
    pub worker: Option<String>,
    /// Its queue, for the lines about it.
    pub queue: String,
}

type OldClaimRow = (
    u64,
    Option<u64>,
    Option<u64>,
    Option<String>,
    u32,
    u32,
    u8,
    Option<String>,
    Vec<u8>,
);

fn old_claim(row: OldClaimRow) -> OldClaim {
    let (id, batch_id, owner_conn, owner_server, attempts, rescues, suspicion, worker, queue) = row;
    // VARBINARY: any bytes an UPDATE of the user's left there, shown as text.
    let queue = String::from_utf8_lossy(&queue).into_owned();
    OldClaim {
        id,
        batch_id,
        owner_conn,
        owner_server,
        attempts,
        rescues,
        suspicion,
        worker,
        queue,
    }
}

/// Where a page of [`held`] ended: the next page starts after it, in the order of the index
/// the page was read from.
#[derive(Debug, Clone)]
pub enum ClaimCursor {
    /// Claimed jobs, in the claim index's order `(queue, priority DESC, id)` within its
    /// `'claimed'` range.
    Head {
        queue: Vec<u8>,
        priority: i16,
        id: u64,
    },
    /// Cancelled jobs that name a claimer, in the cancels index's order: by id.
    Cancel { id: u64 },
}

/// Which rows hold a claim the reaper judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Claimed jobs.
    Claimed,
    /// Jobs cancelled while they ran whose worker has not said their handler stopped (their
    /// owner and claimed_at are cleared when it does): each holds its concurrency-key slot
    /// until then, and a worker that died never says so.
    Cancelled,
}

/// One page of [`held`].
#[derive(Debug, Default)]
pub struct HeldPage {
    /// The claims made more than the given time ago: the reaper judges them.
    pub old: Vec<OldClaim>,
    /// The claims with no time, or one more than [`undated::AHEAD`] ahead of the server's
    /// clock: only a producer writes them, and the reaper dates them (see [`undated`]).
    pub undated: Vec<u64>,
    /// Where the next page starts, when this one was full.
    pub next: Option<ClaimCursor>,
}

/// What a page of [`held`] reads of each row: an [`OldClaimRow`], where the row sits in the
/// claim index, whether its claim is older than the bound `?` µs, and whether it is undated.
const HELD_COLUMNS: &str = "id, batch_id, owner_conn, owner_server, attempts, rescues, \
     suspicion, worker, queue, priority, \
     COALESCE(claimed_at < NOW(6) - INTERVAL ? MICROSECOND, FALSE), \
     claimed_at IS NULL OR claimed_at > NOW(6) + INTERVAL ";

/// Claimed jobs, a page in the claim index's order. Served by its `'claimed'` range: every
/// running job, a few rows per slot of the fleet, read once per pass of the reaper (each page
/// starts where the last ended); the times are read in the rows. No index on the claim's
/// time: each claim and each end of a job would move its entry there (migration 18).
const HELD_CLAIMED: &str = "FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
     WHERE status = 'claimed'";
/// The next page of [`HELD_CLAIMED`] after `(queue, priority, id)`: the claim index's order,
/// priority descending.
const AFTER_HEAD: &str = " AND (queue > ? OR (queue = ? AND (priority < ? \
     OR (priority = ? AND id > ?))))";
const HEAD_ORDER: &str = " ORDER BY status, queue, priority DESC, id LIMIT ?";

/// Cancelled jobs that still name a claimer or a claim time, a page by id. Served by the
/// cancels index over `cancel_owner`, which is NULL for every job not cancelled: only these
/// few rows are read.
const HELD_CANCELLED: &str = "FROM myjob_jobs FORCE INDEX (myjob_jobs_cancels) \
     WHERE cancel_owner = 1";
const AFTER_CANCEL: &str = " AND id > ?";
const CANCEL_ORDER: &str = " ORDER BY cancel_owner, id LIMIT ?";

/// One page of the rows of kind `of` (at most `limit`, from `after` on): the claims made more
/// than `older_than` ago, the undated ones, and the cursor of the next page. Each page
/// starts where the last ended, in its index's order, so long-running claims never hide the
/// ones behind them.
pub async fn held(
    conn: &mut Conn,
    of: Held,
    older_than: Duration,
    after: Option<&ClaimCursor>,
    limit: usize,
) -> anyhow::Result<HeldPage> {
    let (from, order) = match of {
        Held::Claimed => (HELD_CLAIMED, HEAD_ORDER),
        Held::Cancelled => (HELD_CANCELLED, CANCEL_ORDER),
    };
    let mut params: Vec<Value> = vec![(older_than.as_micros() as u64).into()];
    let range = match after {
        None => "",
        Some(ClaimCursor::Head {
            queue,
            priority,
            id,
        }) => {
            params.extend([
                queue.clone().into(),
                queue.clone().into(),
                (*priority).into(),
                (*priority).into(),
                (*id).into(),
            ]);
            AFTER_HEAD
        }
        Some(ClaimCursor::Cancel { id }) => {
            params.push((*id).into());
            AFTER_CANCEL
        }
    };
    params.push((limit as u64).into());
    type Row = (
        u64,
        Option<u64>,
        Option<u64>,
        Option<String>,
        u32,
        u32,
        u8,
        Option<String>,
        Vec<u8>,
        i16,
        bool,
        bool,
    );
    let rows: Vec<Row> = conn
        .exec(
            format!(
                "SELECT {HELD_COLUMNS}{} {from}{range}{order}",
                undated::AHEAD
            ),
            Params::Positional(params),
        )
        .await
        .context("reading claims")?;
    let full = rows.len() >= limit;
    let mut page = HeldPage::default();
    for row in rows {
        let (id, queue, priority, old, dated_wrong) = (row.0, row.8, row.9, row.10, row.11);
        page.next = Some(match of {
            Held::Claimed => ClaimCursor::Head {
                queue: queue.clone(),
                priority,
                id,
            },
            Held::Cancelled => ClaimCursor::Cancel { id },
        });
        if dated_wrong {
            page.undated.push(id);
        } else if old {
            let claim = (id, row.1, row.2, row.3, row.4, row.5, row.6, row.7, queue);
            page.old.push(old_claim(claim));
        }
    }
    if !full {
        page.next = None;
    }
    Ok(page)
}

/// The worker of a job cancelled while it ran is gone, and its handler with it: the claim's
/// owner is cleared, as the worker would have done on seeing the handler stop (see
/// [`CANCEL_SEEN`]), which frees the job's concurrency-key slot. Fenced by the batch and
/// owner the reaper saw. Returns whether the row changed. Served by the primary key.
pub async fn forget_cancel(conn: &mut Conn, claim: &OldClaim) -> anyhow::Result<bool> {
    conn.exec_drop(
        "UPDATE myjob_jobs SET owner_conn = NULL, owner_server = NULL, claimed_at = NULL, \
             slot = NULL \
         WHERE id = ? AND batch_id <=> ? AND owner_conn <=> ? AND owner_server <=> ? \
           AND status = 'cancelled'",
        (
            claim.id,
            claim.batch_id,
            claim.owner_conn,
            &claim.owner_server,
        ),
    )
    .await
    .context("clearing a dead worker's cancelled claim")?;
    Ok(conn.affected_rows() == 1)
}

/// The claims of workers named `host:<any pid>:instance`, however recent (at most `limit`).
/// Read on the claim index's claimed range (every running job, a few rows per slot), the
/// name matched with LIKE, its wildcards escaped; the caller checks the name exactly.
pub async fn claims_of(
    conn: &mut Conn,
    host: &str,
    instance: &str,
    limit: usize,
) -> anyhow::Result<Vec<OldClaim>> {
    let escape = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    };
    let pattern = format!("{}:%:{}", escape(host), escape(instance));
    let rows: Vec<OldClaimRow> = conn
        .exec(
            "SELECT id, batch_id, owner_conn, owner_server, attempts, rescues, suspicion, worker, \
                 queue \
             FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
             WHERE status = 'claimed' AND worker LIKE ? LIMIT ?",
            (pattern, limit as u64),
        )
        .await
        .context("reading an instance's claims")?;
    Ok(rows.into_iter().map(old_claim).collect())
}

/// What [`rescue`] did with a dead owner's claim.
#[derive(Debug, PartialEq, Eq)]
pub enum Rescued {
    /// Back to `pending`, due at once, the attempt given back: held at one death so far.
    Pending,
    /// Back as a `suspect`, to run in a quarantine slot; `charged` when it died there (the
    /// rescue counted against `max_rescues`).
    Suspect { charged: bool },
    /// Failed: its worker died while running it in quarantine `max_rescues` times.
    Failed,
    /// The row had changed meanwhile (adopted, finished, or rescued by another reaper).
    Gone,
}

/// Rescues a dead owner's claim, and the attempt is given back: it never reported a result,
/// which is the worker's failure, not the job's (the same rule as a handler cut short by a
/// shutdown). Which of a dead worker's jobs brought it down is unknown, so a death charges
/// none of them but raises their suspicion (see migration 8): at its first death a job goes
/// back to `pending`, due at once; from its second it is a `suspect`, run one per instance in
/// a quarantine slot. Only a suspect that dies in quarantine, where its instance ran no other
/// suspect, is charged a rescue, and the one that reaches `max_rescues` fails the job
/// instead: a job that brings its worker down must not run for ever, and the jobs running
/// beside it are never failed for it. Fenced by the batch_id and owner the reaper saw, so a
/// claim that its worker's new connection adopted meanwhile is left alone. Served by the
/// primary key.
pub async fn rescue(
    conn: &mut Conn,
    claim: &OldClaim,
    why: &str,
    max_rescues: u32,
) -> anyhow::Result<Rescued> {
    // Claimed at suspicion 2, it was claimed as a suspect: into quarantine.
    let charged = claim.suspicion >= 2;
    // The counters are a producer's to write too: they saturate, in Rust as in SQL.
    let rescues = claim.rescues.saturating_add(1);
    let last_straw = charged && rescues >= max_rescues;
    let suspicion = claim.suspicion.saturating_add(1).min(2);
    let fence = "WHERE id = ? AND batch_id <=> ? AND owner_conn <=> ? AND owner_server <=> ? \
                 AND status = 'claimed'";
    if last_straw {
        let error =
            format!("its worker died while running it in quarantine {rescues} times (last: {why})");
        conn.exec_drop(
            format!(
                "UPDATE myjob_jobs SET status = 'failed', finished_at = NOW(6), last_error = ?, \
                     rescues = LEAST(rescues + 1, 4294967295), slot = NULL {fence}"
            ),
            (
                error,
                claim.id,
                claim.batch_id,
                claim.owner_conn,
                &claim.owner_server,
            ),
        )
        .await
    } else {
        let status = if suspicion >= 2 { "suspect" } else { "pending" };
        conn.exec_drop(
            format!(
                "UPDATE myjob_jobs SET status = ?, suspicion = ?, \
                     attempts = GREATEST(attempts, 1) - 1, run_at = NOW(6), last_error = ?, \
                     batch_id = NULL, owner_conn = NULL, owner_server = NULL, worker = NULL, \
                     claimed_at = NULL, rescues = LEAST(rescues + ?, 4294967295) {fence}"
            ),
            (
                status,
                suspicion,
                why,
                u32::from(charged),
                claim.id,
                claim.batch_id,
                claim.owner_conn,
                &claim.owner_server,
            ),
        )
        .await
    }
    .context("rescuing a stale claim")?;
    Ok(match (conn.affected_rows() == 1, last_straw, suspicion) {
        (false, _, _) => Rescued::Gone,
        (true, true, _) => Rescued::Failed,
        (true, false, 2) => Rescued::Suspect { charged },
        (true, false, _) => Rescued::Pending,
    })
}

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
    Inserted(u64),
    /// A pending job had the same unique key: its payload and run time were replaced.
    Replaced(u64),
    /// A job with the same unique key is running now, or waits as a suspect; nothing was changed.
    Running(u64),
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
    let result = match status.as_deref() {
        _ if inserted => Enqueued::Inserted(id),
        Some("pending" | "scheduled" | "blocked") => Enqueued::Replaced(id),
        _ => Enqueued::Running(id),
    };
    tx.commit().await.context("committing the job")?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_lists_come_in_few_sizes() {
        let (sql, v) = in_list(&[1u64, 2, 3]);
        assert_eq!(sql, "?, ?, ?, ?");
        assert_eq!(v.len(), 4);
        assert_eq!(v[3], Value::from(3u64));
        assert_eq!(in_list(&[7u64]).0, "?");
    }

    #[test]
    fn one_done_statement_fences_each_row_by_its_own_batch() {
        let st = done_statement(&[(10, 1), (11, 2), (12, 2)]);
        // Three ids and three arms, each padded to four.
        assert_eq!(st.sql.matches("WHEN ? THEN CAST(? AS UNSIGNED)").count(), 4);
        assert_eq!(st.params.len(), 4 + 2 * 4);
        assert_eq!(st.params[4..6], [Value::from(10u64), Value::from(1u64)]);
        assert_eq!(st.params[10..12], [Value::from(12u64), Value::from(2u64)]);
        assert_eq!(st.claims, vec![(10, 1), (11, 2), (12, 2)]);
    }

    #[test]
    fn a_long_reason_is_cut_on_a_character_boundary() {
        assert_eq!(fit_error("short"), "short");
        let fits = "x".repeat(LAST_ERROR_MAX);
        assert_eq!(fit_error(&fits), fits);
        // Three-byte characters: the cut falls inside one and moves back to its start.
        let long = "\u{FFFD}".repeat(20_000);
        let cut = fit_error(&long);
        assert!(cut.len() <= LAST_ERROR_MAX, "{}", cut.len());
        assert!(cut.len() > LAST_ERROR_MAX - CUT_MARK.len() - 3);
        assert!(cut.starts_with('\u{FFFD}') && cut.ends_with(CUT_MARK));
    }

    #[test]
    fn a_lane_takes_its_own_jobs_then_the_others_that_waited() {
        let seen = |id, kin, age| Seen { id, kin, age };
        use Age::{Fresh, Stuck, Waiting};
        use Kin::{Next, Other, Own};
        let head = [
            seen(1, Next, Fresh),
            seen(2, Own, Fresh),
            seen(3, Next, Stuck),
            seen(4, Other, Waiting),
            seen(5, Own, Waiting),
            seen(6, Next, Waiting),
            seen(7, Own, Fresh),
            seen(8, Other, Stuck),
        ];
        assert_eq!(
            pick(&head, 10, 8),
            vec![2, 5, 7],
            "behind a backlog: its own only"
        );
        assert_eq!(
            pick(&head, 10, 9),
            vec![2, 5, 7, 8, 6, 4, 3],
            "dry: and the others' that waited, the last first"
        );
        assert_eq!(
            pick(&head, 2, 8),
            vec![2, 5],
            "its own first, up to the limit"
        );
        let starved: Vec<Seen> = head.iter().copied().filter(|s| s.kin != Own).collect();
        assert_eq!(
            pick(&starved, 10, 5),
            vec![3],
            "none of its own behind a backlog: the next lane's stuck only"
        );
        assert!(
            pick(&[seen(1, Next, Waiting)], 10, 1).is_empty(),
            "the next lane's job, waiting but not stuck"
        );
        assert_eq!(window(100, 4), 800);
        assert_eq!(window(1_000, 16), 4_000, "bounded");
        assert_eq!(window(2, 2), 64, "at least 64");
    }
}
