//! The reaper's and a reconnected worker's side: claims adopted, held claims listed, and
//! claims of dead owners put back.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use super::*;

/// After a reconnect: marks this worker's live claims as owned by the new connection, so the
/// reaper does not take them from handlers that are still running; so too the jobs cancelled
/// while they ran whose handlers have not been seen to stop (their concurrency-key slot is
/// held until then). Fenced by batch_id: a batch
/// the reaper already put back is not taken again.
pub async fn adopt(
    conn: &mut Conn,
    batch_ids: &[BatchId],
    owner_server: &str,
) -> anyhow::Result<u64> {
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
    pub id: JobId,
    pub batch_id: Option<BatchId>,
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
        id: JobId::new(id),
        batch_id: batch_id.map(BatchId::new),
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
    pub undated: Vec<JobId>,
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
            page.undated.push(JobId::new(id));
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
/// `outcome::CANCEL_SEEN`), which frees the job's concurrency-key slot. Fenced by the batch and
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
