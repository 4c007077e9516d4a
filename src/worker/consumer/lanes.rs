//! Lanes: on a Galera cluster, which part of each queue's head this instance claims first.
//!
//! Two nodes that claim the head of one queue at once want the same rows, and a row written
//! through two nodes at once is a certification conflict: one claim is rolled back and tried
//! again (two instances on one node meet in lock waits and deadlocks instead). So each
//! instance that claims from a queue says so in `myjob_lanes` (see [`crate::store::lanes`]),
//! and the instances seen lately split the head between them: instance `k` of `n`, in the
//! order of their node and name, takes first the jobs whose `CRC32(id) % n` is `k`.
//!
//! Only an instance that tried to claim jobs of a queue since its last refresh says so: one
//! whose slots are all busy, or whose link is down, drops out of the others' lanes within about
//! ten seconds (its last stamp up to a [`REFRESH`] after its last claim, counted for
//! [`SEEN_WITHIN`], read at their next refresh), and they split its part. Until then, its jobs
//! are taken by the lane before its own, when it finds none of its own, once they wait past
//! `jobs::HELP_AFTER`, and by any lane that runs dry once they wait past `jobs::STEAL_AFTER`
//! (see `jobs::pick`). An instance the
//! others have not seen yet takes only such jobs, and stamps at its first claim, so that it
//! does not race every lane for the whole head. Two instances that see the lanes differently
//! for a moment only meet as they would without lanes: the lanes spare conflicts, they guard
//! nothing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mysql_async::Conn;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::db::{self, Failure, ServerId};
use crate::error::chain;
use crate::store::jobs::Lane;
use crate::store::lanes::{self, Claimer};

/// How often the lanes are read again, and this instance's rows stamped.
pub const REFRESH: Duration = Duration::from_secs(2);

/// A row younger than this is not written again (see [`lanes::stamp`]): less than
/// [`REFRESH`], so that each refresh of an instance still claiming moves its rows on.
const STAMP_FRESH: Duration = Duration::from_secs(1);

/// An instance counts as claiming from a queue while its row is younger than this: a few
/// refreshes, so that one late stamp does not reshuffle the lanes.
pub const SEEN_WITHIN: Duration = Duration::from_secs(6);

/// How often an instance deletes the lanes not seen for [`PRUNE_AGE`].
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Only lanes seen within seconds count: any age well past that will do.
const PRUNE_AGE: Duration = Duration::from_secs(24 * 3600);

/// After the server refused the lanes' statements (the account lacks its grant on
/// `myjob_lanes`), how long before they are tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(300);

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
    next_prune: Instant,
    /// The queues claimed from since the last refresh: the ones stamped at the next.
    claimed: HashSet<String>,
}

impl Lanes {
    pub fn new(now: Instant) -> Self {
        Lanes {
            state: State::Whole,
            next: now,
            next_prune: now + PRUNE_EVERY,
            claimed: HashSet::new(),
        }
    }

    /// Whether to refresh now.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// The lane `queue`'s next claim takes.
    pub fn of(&self, queue: &str) -> Lane {
        match &self.state {
            State::Split(lanes) => lanes.get(queue).copied().unwrap_or(Lane::Whole),
            State::Whole | State::Refused => Lane::Whole,
        }
    }

    /// A claim of `queue` was made. Called at every claim: the name is copied only the first
    /// time in a refresh.
    pub fn claimed(&mut self, queue: &str) {
        if !self.claimed.contains(queue) {
            self.claimed.insert(queue.to_owned());
            // Not one of the lanes yet, it takes almost nothing: stamped at once, it has its
            // own lane at this refresh, and in the others' at their next.
            if self.of(queue) == Lane::Joining {
                self.next = Instant::now();
            }
        }
    }

    /// Stamps this instance's rows for the queues it claimed from since the last refresh, and
    /// reads the lanes of `queues`, when `server` (the node this instance, `worker`, claims
    /// through) is a Galera node: two statements. A refusal for want of a grant leaves whole
    /// heads (logged once), a lost race the lanes as they were; any other error is the
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
        let claimed: Vec<&str> = queues
            .iter()
            .copied()
            .filter(|q| self.claimed.contains(*q))
            .collect();
        let galera = ServerId::parse(server).and_then(|s| s.galera).is_some();
        if !galera || queues.is_empty() {
            self.state = State::Whole;
            self.claimed.clear();
            return Ok(());
        }
        let me = Claimer {
            server: server.to_owned(),
            worker: worker.to_owned(),
        };
        let read = async {
            if !claimed.is_empty() {
                lanes::stamp(conn, &claimed, &me, STAMP_FRESH).await?;
            }
            lanes::seen(conn, queues, SEEN_WITHIN).await
        };
        let seen = match read.await {
            Ok(seen) => seen,
            Err(e) if matches!(db::classify(&e), Failure::Conflict(_)) => return Ok(()),
            Err(e) if db::classify(&e) == Failure::Denied => {
                if !matches!(self.state, State::Refused) {
                    warn!("consumer: {}; claiming whole queues on this Galera node (GRANT SELECT, INSERT, UPDATE, DELETE ON the database's myjob_lanes to this account)", chain(&*e));
                }
                self.state = State::Refused;
                self.next = now + REFUSED_RETRY;
                // What was claimed before the wait says nothing of what is claimed after it.
                self.claimed.clear();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.claimed.clear();
        let split = queues
            .iter()
            .map(|q| ((*q).to_owned(), lane_of(&seen, q, &me)))
            .collect();
        self.state = State::Split(split);
        if now >= self.next_prune {
            self.next_prune = now + PRUNE_EVERY;
            self.prune(conn).await?;
        }
        Ok(())
    }

    /// Deletes a batch of the lanes not seen for [`PRUNE_AGE`]. Housekeeping: an error the
    /// server answered with (a lost race, a grant without DELETE, a read-only node) is said at
    /// debug level and changes nothing, and only a broken connection is the caller's.
    async fn prune(&mut self, conn: &mut Conn) -> anyhow::Result<()> {
        match lanes::prune(conn, PRUNE_AGE).await {
            Ok(n) => debug!(lanes = n, "consumer: forgot lanes not seen for a day"),
            Err(e) if db::classify(&e) != Failure::Lost => {
                debug!("consumer: {}; the old lanes stay", chain(&*e))
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// The lane of `me` among the instances `seen` claiming from `queue`, in order.
fn lane_of(seen: &[lanes::Seen], queue: &str, me: &Claimer) -> Lane {
    let of_queue: Vec<&Claimer> = seen
        .iter()
        .filter(|s| s.queue == queue)
        .map(|s| &s.claimer)
        .collect();
    match (of_queue.len(), of_queue.iter().position(|c| *c == me)) {
        (of @ 2.., Some(part)) => Lane::Part {
            of: of as u32,
            part: part as u32,
        },
        (1.., None) => Lane::Joining,
        _ => Lane::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(queue: &str, server: &str, worker: &str) -> lanes::Seen {
        lanes::Seen {
            queue: queue.into(),
            claimer: Claimer {
                server: server.into(),
                worker: worker.into(),
            },
        }
    }

    #[test]
    fn a_joining_instance_refreshes_at_its_first_claim() {
        let mut lanes = Lanes::new(Instant::now());
        lanes.next = Instant::now() + REFRESH;
        lanes.state = State::Split([("q".to_owned(), Lane::Joining)].into());
        lanes.claimed("q");
        assert!(lanes.due(Instant::now()));
    }

    #[test]
    fn an_instance_takes_its_place_among_those_seen_on_its_queue() {
        let all = [
            seen("q", "a", "1"),
            seen("q", "a", "2"),
            seen("q", "b", "1"),
            seen("r", "a", "2"),
        ];
        let me = |server: &str, worker: &str| seen("", server, worker).claimer;
        assert_eq!(
            lane_of(&all, "q", &me("a", "2")),
            Lane::Part { of: 3, part: 1 }
        );
        assert_eq!(
            lane_of(&all, "r", &me("a", "2")),
            Lane::Whole,
            "alone: the whole head"
        );
        assert_eq!(
            lane_of(&all, "q", &me("c", "1")),
            Lane::Joining,
            "not seen yet beside others: none of its own"
        );
        assert_eq!(
            lane_of(&all, "s", &me("c", "1")),
            Lane::Whole,
            "nobody seen: the whole head"
        );
    }
}
