//! Claims with a time no claim of myjob's has: none at all, or more than [`AHEAD`] ahead of
//! the server's clock. A producer can write such a row (anyone who can INSERT can write any
//! column); myjob's claim always stamps the server's `NOW(6)`. The reaper judges a claim
//! only once it is older than `stale_after`, so an undated one would stay claimed for ever
//! (one dated 2038, until then), holding its unique key and its concurrency slot. The reaper
//! dates such claims now instead, and judges them as any other once `stale_after` has
//! passed: a live owner's is kept, a dead one's put back.
//!
//! A cancelled job keeps its claim's owner until its worker has seen the handler stop, and
//! its concurrency slot with it; then the owner and the time are cleared together. One with
//! an owner and no time is a producer's, which would hold its key's slot for ever: found by
//! [`cancelled_page`], a page at a time, and dated the same way.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params};

use super::in_list;

/// How far ahead of the server's clock a claim's time may be and still count: the clocks of
/// a cluster's nodes disagree by far less. Dating a live claim is safe (it only puts off its
/// judgement, which asks the processlist all the same), so a server whose clock was set
/// back costs a write per claim, once.
pub const AHEAD: &str = "1 MINUTE";

/// A claim without a time, or with one too far ahead (see the module's text).
const UNDATED: &str = "((status = 'claimed' AND claimed_at IS NULL) \
     OR (status IN ('claimed', 'cancelled') AND claimed_at > NOW(6) + INTERVAL 1 MINUTE))";
/// A cancelled job's claim without a time but with an owner.
const UNDATED_CANCEL: &str =
    "(status = 'cancelled' AND claimed_at IS NULL AND owner_conn IS NOT NULL)";

/// At most `limit` undated claims, and at most `limit` cancelled jobs' claims dated too far
/// ahead (a cancelled job's claim time is cleared when its handler is seen to stop, so no
/// time is its normal state). The claimed ones on the claim index's `'claimed'` range (every
/// running job, their times checked in the rows, as [`super::old_claims`] reads them), the
/// cancelled ones on the cancels index's range past `NOW(6) + AHEAD`, an index dive when it
/// is empty, which it nearly always is.
pub async fn undated(conn: &mut Conn, limit: usize) -> anyhow::Result<Vec<u64>> {
    conn.exec(
        format!(
            "(SELECT id FROM myjob_jobs FORCE INDEX (myjob_jobs_claim) \
              WHERE status = 'claimed' \
                AND (claimed_at IS NULL OR claimed_at > NOW(6) + INTERVAL {AHEAD}) LIMIT ?) \
             UNION ALL \
             (SELECT id FROM myjob_jobs FORCE INDEX (myjob_jobs_cancels) \
              WHERE cancel_owner = 1 AND cancel_at > NOW(6) + INTERVAL {AHEAD} LIMIT ?)"
        ),
        (limit as u64, limit as u64),
    )
    .await
    .context("reading claims without a time")
}

/// The most index entries one page of [`cancelled_page`] reads.
pub const SWEEP_PAGE: u64 = 10_000;

/// One page of the sweep of cancelled jobs without a claim time but with an owner: the ids
/// after `after` in that range of the cancels index `(cancel_owner, cancel_at)`, whose
/// entries end with the id, at most [`SWEEP_PAGE`] of them. Returns them, and where the next
/// page starts (None at the end of the range). Only rows a producer wrote are there: a
/// worker clears a cancelled job's owner and time together.
pub async fn cancelled_page(
    conn: &mut Conn,
    after: u64,
) -> anyhow::Result<(Vec<u64>, Option<u64>)> {
    let rows: Vec<(u64, bool)> = conn
        .exec(
            "SELECT id, owner_conn IS NOT NULL FROM myjob_jobs FORCE INDEX (myjob_jobs_cancels) \
             WHERE cancel_owner = 1 AND cancel_at IS NULL AND id > ? \
             ORDER BY cancel_owner, cancel_at, id LIMIT ?",
            (after, SWEEP_PAGE),
        )
        .await
        .context("sweeping cancelled jobs without a claim time")?;
    let next = match rows.last() {
        Some((id, _)) if rows.len() as u64 >= SWEEP_PAGE => Some(*id),
        _ => None,
    };
    Ok((rows.iter().filter(|r| r.1).map(|r| r.0).collect(), next))
}

/// Dates now the claims among `ids` that are still undated (as [`undated`] or
/// [`cancelled_page`] found them). Returns how many changed. Served by the primary key.
pub async fn date(conn: &mut Conn, ids: &[u64]) -> anyhow::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let (list, params) = in_list(ids);
    conn.exec_drop(
        format!(
            "UPDATE myjob_jobs SET claimed_at = NOW(6) \
             WHERE id IN ({list}) AND ({UNDATED} OR {UNDATED_CANCEL})"
        ),
        Params::Positional(params),
    )
    .await
    .context("dating claims without a time")?;
    Ok(conn.affected_rows())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_statement_says_what_the_doc_says() {
        assert!(super::UNDATED.contains(&format!("INTERVAL {}", super::AHEAD)));
    }
}
