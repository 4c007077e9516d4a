//! The claim of a rate-limited queue (`rate_limit = "N/PERIOD"`): the starts it may take are
//! reserved from the queue's budget in `myjob_queues` and the jobs claimed in one
//! transaction, so a budget taken is a budget used, across every instance and host. Jobs
//! over the limit stay pending, due, unclaimed; the consumer leaves the queue alone until
//! the budget has a start again, rather than asking for it at every turn.

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::config::RateLimit;
use crate::store::jobs::{self, Claimer};
use crate::store::queues;

/// What a rate-limited claim got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub claimed: usize,
    /// The budget ran out before the queue did: ask again after this long.
    pub wait: Option<Duration>,
}

/// Claims up to `want` jobs of `queue` within its rate limit, in batch `batch_id`.
pub async fn claim(
    conn: &mut Conn,
    batch_id: u64,
    queue: &str,
    rate: &RateLimit,
    want: usize,
    who: &Claimer<'_>,
) -> anyhow::Result<Limited> {
    conn.query_drop("START TRANSACTION").await?;
    let claimed = async {
        let reserved = queues::reserve(conn, queue, rate, want).await?;
        if reserved.granted == 0 {
            return Ok(Limited {
                claimed: 0,
                wait: Some(micros(reserved.wait_us)),
            });
        }
        let n = jobs::claim(conn, batch_id, queue, reserved.granted, who).await?;
        queues::settle(conn, queue, &reserved, n).await?;
        // Fewer jobs than the budget allowed: the queue is drained, as for any claim. As
        // many as it allowed, fewer than wanted: the next start is free once the arrival
        // time is back within the burst.
        let budget_spent = n == reserved.granted && n < want;
        let next = reserved.after(n)
            - reserved.interval_us * (i64::from(rate.burst) - 1)
            - reserved.now_us;
        Ok(Limited {
            claimed: n,
            wait: budget_spent.then(|| micros(next)),
        })
    }
    .await;
    match claimed {
        Ok(limited) => {
            conn.query_drop("COMMIT").await?;
            Ok(limited)
        }
        Err(e) => {
            // A broken connection rolls back by itself.
            let _ = conn.query_drop("ROLLBACK").await;
            Err(e)
        }
    }
}

/// A wait from the database's microseconds, never below a millisecond: a budget refilled
/// this instant is asked for again at the next turn at the soonest.
fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0)).max(Duration::from_millis(1))
}
