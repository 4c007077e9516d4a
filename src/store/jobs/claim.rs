//! The claim: a queue's first due jobs stamped with a batch id, and read back.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use super::*;
use crate::store::queues;

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
/// primary key its own jobs, and those of other lanes that waited (see `head::pick`). Two
/// instances through two Galera nodes then seldom write one row, which would be a
/// certification conflict. And the claim locks only what it takes: an UPDATE that walks the
/// claim index keeps, until it commits, its lock on the index entry of every row it walks
/// past (another lane's) even at READ COMMITTED, which releases only the row's own, and a
/// node's applier that must change such a row aborts the local claim that holds it.
pub async fn claim(
    conn: &mut Conn,
    batch_id: BatchId,
    queue: &str,
    limit: usize,
    who: &Claimer<'_>,
    lane: Lane,
) -> anyhow::Result<usize> {
    match lane {
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
            Ok(conn.affected_rows() as usize)
        }
        Lane::Part { .. } | Lane::Joining => {
            head::claim_lane(conn, batch_id, queue, limit, who, lane).await
        }
    }
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
    batch_id: BatchId,
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
    batch_id: BatchId,
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
                    id: JobId::new(id),
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
