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
//! an owner and no time is a producer's, which would hold its key's slot for ever: dated the
//! same way.
//!
//! The reaper finds them as it reads the claims it judges (see [`super::held`]).

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params};

use super::{in_list, JobId};

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

/// Dates now the claims among `ids` that are still undated (as [`super::held`] found
/// them). Returns how many changed. Served by the primary key.
pub async fn date(conn: &mut Conn, ids: &[JobId]) -> anyhow::Result<u64> {
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
