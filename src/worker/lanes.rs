//! Lanes: on a Galera cluster, which part of each queue's head this instance claims first.
//!
//! Two nodes that claim the head of one queue at once want the same rows, and a row written
//! through two nodes at once is a certification conflict: one claim is rolled back and tried
//! again (two instances on one node meet in lock waits and deadlocks instead). So each
//! instance that claims from a queue says so in `myjob_lanes` (see [`crate::store::lanes`]),
//! and the instances seen lately split the head between them: instance `k` of `n`, in the
//! order of their node and name, takes first the jobs whose `CRC32(id) % n` is `k`. Only
//! instances that claim from the queue count, so no part is left to nobody; a lane that runs
//! dry is topped up from the whole head (see `jobs::claim`), and an instance that stops
//! claiming drops out within [`SEEN_WITHIN`]. Two instances that see the lanes differently for
//! a moment only meet as they would without lanes: the lanes spare conflicts, they guard
//! nothing.

use std::collections::HashMap;
use std::time::Duration;

use mysql_async::Conn;
use tokio::time::Instant;
use tracing::warn;

use crate::db::{self, Failure, ServerId};
use crate::error::chain;
use crate::store::jobs::Lane;
use crate::store::lanes::{self, Claimer};

/// How often the lanes are read again, and this node's rows stamped.
pub const REFRESH: Duration = Duration::from_secs(2);
/// A node's row is written again once it is this old (see [`lanes::stamp`]).
const STAMP_FRESH: Duration = Duration::from_secs(1);
/// A node counts as claiming from a queue while its row is younger than this: a few
/// refreshes, so that one late stamp does not reshuffle the lanes.
pub const SEEN_WITHIN: Duration = Duration::from_secs(6);
/// After the server refused the lanes' statements (the account lacks its grant on
/// `myjob_lanes`), how long before they are tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(300);

/// The server's code for a statement the account may not run on a table.
const DENIED: u16 = 1142;

/// Where the lanes stand.
enum State {
    /// Not a Galera node (or not asked yet): every claim takes the whole head.
    Whole,
    /// A Galera node: each queue's lane as last read.
    Split(HashMap<String, Lane>),
    /// The server refused the lanes' statements: whole heads until the retry.
    Refused,
}

/// This instance's lanes, and when to read them again.
pub struct Lanes {
    state: State,
    next: Instant,
}

impl Lanes {
    pub fn new(now: Instant) -> Self {
        Lanes {
            state: State::Whole,
            next: now,
        }
    }

    /// Whether to refresh now.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// The lane `queue`'s claims take.
    pub fn of(&self, queue: &str) -> Lane {
        match &self.state {
            State::Split(lanes) => lanes.get(queue).copied().unwrap_or(Lane::Whole),
            State::Whole | State::Refused => Lane::Whole,
        }
    }

    /// Stamps this instance's rows for `queues` and reads each queue's lanes, when `server`
    /// (the node this instance, `worker`, claims through) is a Galera node. A refusal for want of a grant leaves
    /// whole heads (logged once), a lost race the lanes as they were; any other error is the
    /// caller's to handle.
    pub async fn refresh(
        &mut self,
        conn: &mut Conn,
        server: &str,
        worker: &str,
        queues: &[&str],
    ) -> anyhow::Result<()> {
        let now = Instant::now();
        self.next = now + REFRESH;
        if ServerId::parse(server).and_then(|s| s.galera).is_none() {
            self.state = State::Whole;
            return Ok(());
        }
        let me = Claimer {
            server: server.to_owned(),
            worker: worker.to_owned(),
        };
        let mut split = HashMap::new();
        for queue in queues {
            let read = async {
                lanes::stamp(conn, queue, &me, STAMP_FRESH).await?;
                lanes::seen(conn, queue, SEEN_WITHIN).await
            };
            let seen = match read.await {
                Ok(seen) => seen,
                // A lost race: the lanes stand as they were.
                Err(e) if db::classify(&e) == Failure::Conflict => return Ok(()),
                Err(e) if db::server_code(&e) == Some(DENIED) => {
                    if !matches!(self.state, State::Refused) {
                        warn!("consumer: {}; claiming whole queues on this Galera node (GRANT SELECT, INSERT, UPDATE, DELETE ON the database's myjob_lanes to this account)", chain(&*e));
                    }
                    self.state = State::Refused;
                    self.next = now + REFUSED_RETRY;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            split.insert((*queue).to_owned(), lane_of(&seen, &me));
        }
        self.state = State::Split(split);
        Ok(())
    }
}

/// The lane of `me` among the instances `seen` claiming from a queue, in order.
fn lane_of(seen: &[Claimer], me: &Claimer) -> Lane {
    match (seen.len(), seen.iter().position(|s| s == me)) {
        (of @ 2.., Some(part)) => Lane::Part {
            of: of as u32,
            part: part as u32,
        },
        _ => Lane::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_takes_its_place_among_those_seen() {
        let who = |server: &str, worker: &str| Claimer {
            server: server.into(),
            worker: worker.into(),
        };
        let seen = [who("a", "1"), who("a", "2"), who("b", "1")];
        assert_eq!(
            lane_of(&seen, &who("a", "2")),
            Lane::Part { of: 3, part: 1 }
        );
        assert_eq!(
            lane_of(&seen[..1], &who("a", "1")),
            Lane::Whole,
            "alone: the whole head"
        );
        assert_eq!(
            lane_of(&seen, &who("c", "1")),
            Lane::Whole,
            "not seen: the whole head"
        );
    }
}
