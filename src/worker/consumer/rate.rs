//! The claim of a rate-limited queue (`rate_limit = "N/PERIOD"`): the starts it may take are
//! reserved from the queue's budget in `myjob_queues` (see [`queues::reserve`]), the jobs
//! claimed as for any queue, and the starts it did not use given back. Jobs over the limit
//! stay pending, due, unclaimed; the consumer leaves the queue alone until the budget has a
//! start again, rather than asking for it at every turn.

use std::time::Duration;

use mysql_async::Conn;
use tracing::debug;

use crate::config::RateLimit;
use crate::db::{self, Failure, Race};
use crate::error::chain;
use crate::store::jobs::{self, BatchId, Claimer, Lane};
use crate::store::queues;

/// After a race for the budget lost to another instance: ask again this long after.
const LOST_RACE: Duration = Duration::from_millis(5);

/// What a rate-limited claim got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub claimed: usize,
    /// The budget ran out before the queue did: ask again after this long.
    pub wait: Option<Duration>,
}

/// Claims up to `want` jobs of `queue` within its rate limit, in batch `batch_id`. Every
/// statement commits by itself: a claim that fails is the claim's failure, as for any
/// queue.
pub async fn claim(
    conn: &mut Conn,
    batch_id: BatchId,
    queue: &str,
    rate: &RateLimit,
    want: usize,
    who: &Claimer<'_>,
    lane: Lane,
) -> anyhow::Result<Limited> {
    let reserved = match queues::reserve(conn, queue, rate, want).await {
        Ok(reserved) => reserved,
        // Another node's instance wrote the budget first (Galera's certification), or held
        // its row: nothing was taken.
        Err(e) if matches!(db::classify(&e), Failure::Conflict(_)) => {
            return Ok(Limited {
                claimed: 0,
                wait: Some(LOST_RACE),
            })
        }
        Err(e) => return Err(e),
    };
    if reserved.granted == 0 {
        let wait = match reserved.wait_us {
            ..=0 => LOST_RACE,
            us => micros(us),
        };
        return Ok(Limited {
            claimed: 0,
            wait: Some(wait),
        });
    }
    let n = match jobs::claim(conn, batch_id, queue, reserved.granted, who, lane).await {
        Ok(n) => n,
        Err(e) => {
            // A claim that lost a race (Galera's certification against another node's claim,
            // a lock wait) rolled back for sure: its starts go back to the budget, or every
            // such loss would cost the queue its share of the limit. One that broke off may
            // have committed, so its starts stay spent.
            if matches!(db::classify(&e), Failure::Conflict(_)) {
                give_back(conn, queue, rate, &reserved, reserved.granted).await;
            }
            return Err(e);
        }
    };
    if n < reserved.granted {
        // The queue had fewer due jobs: drained, as for any claim. A refund that fails
        // leaves the budget under-used, and the claim stands.
        give_back(conn, queue, rate, &reserved, reserved.granted - n).await;
        return Ok(Limited {
            claimed: n,
            wait: None,
        });
    }
    // As many as the budget allowed, fewer than wanted: it is spent.
    let wait = (n < want).then(|| micros(reserved.wait_us));
    Ok(Limited { claimed: n, wait })
}

/// Gives back `unused` starts of `reserved` (see [`queues::refund`]), once more if that
/// lost a race for the budget's row itself (1213: on a Galera cluster another node's claim
/// may write it at the same moment). Not after a lock wait (1205): the claim's time bound,
/// one lock wait and a little more, has no room for a second. A refund that fails leaves
/// the budget under-used, never over: said at debug level, the claim's own outcome stands.
async fn give_back(
    conn: &mut Conn,
    queue: &str,
    rate: &RateLimit,
    reserved: &queues::Reservation,
    unused: usize,
) {
    let mut refunded = queues::refund(conn, queue, rate, reserved, unused).await;
    if matches!(&refunded, Err(e) if db::classify(e) == Failure::Conflict(Race::Deadlock)) {
        refunded = queues::refund(conn, queue, rate, reserved, unused).await;
    }
    if let Err(e) = refunded {
        debug!(
            queue,
            unused,
            "rate-limited starts not given back: {}",
            chain(&*e)
        );
    }
}

/// A wait from the database's microseconds, never below a millisecond: a budget refilled
/// this instant is asked for again at the next turn at the soonest.
fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0)).max(Duration::from_millis(1))
}
