//! What became of claimed jobs: their outcomes written, fenced by batch id, and the
//! claims still held or cancelled.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use super::*;

/// A job claimed under a batch: what every write about it is fenced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    pub job_id: JobId,
    pub batch_id: BatchId,
}

/// Of `claims`, those the reaper has not put back; their job ids. Served by the batch_id
/// index.
pub async fn still_claimed(conn: &mut Conn, claims: &[Claim]) -> anyhow::Result<Vec<JobId>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let mut batches: Vec<BatchId> = claims.iter().map(|c| c.batch_id).collect();
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
        .filter(|c| rows.contains(&(c.job_id.get(), c.batch_id.get())))
        .map(|c| c.job_id)
        .collect())
}

/// Of the jobs claimed in `batch_ids`, those an operator cancelled since (`myjob cancel`
/// turns a claimed job `cancelled` in place, batch_id and all). The consumer asks once a
/// second while it has jobs running, in place of the keepalive's ping. Served by the batch_id
/// index.
pub async fn cancelled(conn: &mut Conn, batch_ids: &[BatchId]) -> anyhow::Result<Vec<JobId>> {
    let (list, params) = in_list(batch_ids);
    conn.exec_map(
        format!("SELECT id FROM myjob_jobs WHERE batch_id IN ({list}) AND status = 'cancelled'"),
        Params::Positional(params),
        JobId::new,
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
    pub job_id: JobId,
    pub batch_id: BatchId,
    pub outcome: Outcome,
    /// The concurrency-key slot the job held, handed on once the outcome is written.
    pub slot: Option<KeySlot>,
}

impl AsRef<Completion> for Completion {
    fn as_ref(&self) -> &Completion {
        self
    }
}

impl Completion {
    pub fn claim(&self) -> Claim {
        Claim {
            job_id: self.job_id,
            batch_id: self.batch_id,
        }
    }
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
    /// The claims it writes about, so that a short count can be traced to its jobs.
    claims: Vec<Claim>,
}

/// The outcomes [`write_outcomes`] did not write, because their job was no longer claimed
/// under its batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unwritten {
    /// The claim was reaped and the job put back meanwhile: it is someone else's now. A
    /// claim, not a job: the same job may be this instance's again, under a new batch.
    pub lost: Vec<Claim>,
    /// The handler finished the job itself, in its own transaction, under the same batch (the
    /// exactly-once recipe): nothing left to write.
    pub finished: Vec<JobId>,
}

/// Writes a set of outcomes: one statement for every `done` (the common case), whatever
/// batches they came from, one per job for the rest (retries and failures carry their own
/// error text; releases happen only at a shutdown); in one transaction when there is more
/// than one statement. Returns the jobs whose write matched no row, and why.
pub async fn write_outcomes(
    conn: &mut Conn,
    completions: &[impl AsRef<Completion>],
) -> anyhow::Result<Unwritten> {
    let statements = statements(completions);
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
        let ids: Vec<JobId> = st.claims.iter().map(|c| c.job_id).collect();
        let (list, params) = in_list(&ids);
        let rows: Vec<(u64, Option<u64>, String)> = conn
            .exec(
                format!("SELECT id, batch_id, status FROM myjob_jobs WHERE id IN ({list})"),
                Params::Positional(params),
            )
            .await
            .context("reading which jobs lost their claim")?;
        for claim in st.claims {
            let Claim {
                job_id: id,
                batch_id,
            } = claim;
            let row = rows
                .iter()
                .find(|r| r.0 == id.get() && r.1 == Some(batch_id.get()));
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
                _ => unwritten.lost.push(claim),
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

/// The fenced UPDATEs that write `completions`: one for every `done`, whatever batches they
/// came from, in chunks of [`DONE_CHUNK`], and one per job for the rest.
fn statements(completions: &[impl AsRef<Completion>]) -> Vec<Statement> {
    let mut statements: Vec<Statement> = Vec::new();
    let mut done: Vec<Claim> = Vec::new();
    for c in completions.iter().map(AsRef::as_ref) {
        let (sql, params): (&str, Vec<Value>) = match &c.outcome {
            Outcome::Cancelled => (CANCEL_SEEN, Vec::new()),
            Outcome::Done => {
                done.push(c.claim());
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
            claims: vec![c.claim()],
        });
    }
    // A job whose outcome came under two batches (reaped, then claimed here again) goes into
    // a statement of its own, so that each row's fence names one batch.
    // At most DONE_CHUNK a statement: three placeholders each, padded, stay well under the
    // protocol's 65,535.
    while !done.is_empty() {
        let mut ids = std::collections::HashSet::new();
        let mut once: Vec<Claim> = Vec::new();
        done.retain(|&claim| {
            if once.len() < DONE_CHUNK && ids.insert(claim.job_id) {
                once.push(claim);
                return false;
            }
            true
        });
        statements.push(done_statement(&once));
    }
    statements
}

/// The one UPDATE for the `done` outcomes of `claims`, each job once: the
/// primary key's range over the ids, each row fenced by its own batch (a CASE on the id,
/// which both servers evaluate per row). Both lists are padded to a power of two by repeating
/// their last value, so that a few sizes of statement stay prepared.
fn done_statement(claims: &[Claim]) -> Statement {
    let ids: Vec<JobId> = claims.iter().map(|c| c.job_id).collect();
    let (list, mut params) = in_list(&ids);
    let arms = claims.len().max(1).next_power_of_two();
    // CAST: MySQL types a parameter once, at PREPARE, and a CASE of parameters alone might
    // compare with the BIGINT UNSIGNED column as a DOUBLE, which cannot tell apart two random
    // batch ids close to each other.
    let cases = vec!["WHEN ? THEN CAST(? AS UNSIGNED)"; arms].join(" ");
    for i in 0..arms {
        let c = claims[i.min(claims.len() - 1)];
        params.extend([c.job_id.into(), c.batch_id.into()]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_done_under_two_batches_gets_a_statement_for_each() {
        let c = |job_id, batch_id, outcome| Completion {
            job_id: JobId::new(job_id),
            batch_id: BatchId::new(batch_id),
            outcome,
            slot: None,
        };
        let claim = |job_id, batch_id| Claim {
            job_id: JobId::new(job_id),
            batch_id: BatchId::new(batch_id),
        };
        let fail = Outcome::Fail { error: "x".into() };
        let st = statements(&[
            c(1, 10, Outcome::Done),
            c(2, 10, Outcome::Done),
            c(1, 11, Outcome::Done),
            c(3, 10, fail),
        ]);
        // The failure alone; then one statement for the done jobs, each job once in it.
        assert_eq!(st.len(), 3);
        assert_eq!(st[0].claims, [claim(3, 10)]);
        assert_eq!(st[1].claims, [claim(1, 10), claim(2, 10)]);
        assert_eq!(st[2].claims, [claim(1, 11)]);
    }

    #[test]
    fn one_done_statement_fences_each_row_by_its_own_batch() {
        let claims = [(10, 1), (11, 2), (12, 2)].map(|(job_id, batch_id)| Claim {
            job_id: JobId::new(job_id),
            batch_id: BatchId::new(batch_id),
        });
        let st = done_statement(&claims);
        // Three ids and three arms, each padded to four.
        assert_eq!(st.sql.matches("WHEN ? THEN CAST(? AS UNSIGNED)").count(), 4);
        assert_eq!(st.params.len(), 4 + 2 * 4);
        assert_eq!(st.params[4..6], [Value::from(10u64), Value::from(1u64)]);
        assert_eq!(st.params[10..12], [Value::from(12u64), Value::from(2u64)]);
        assert_eq!(st.claims, claims);
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
}
