//! Lanes on a Galera cluster: which part of a queue's head a claim takes, and its claim by
//! primary key.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use super::*;

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
    batch_id: BatchId,
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

/// A lane's claim (see [`super::claim`]): reads the head's first rows without a lock and
/// claims by primary key what [`pick`] takes of them.
pub(super) async fn claim_lane(
    conn: &mut Conn,
    batch_id: BatchId,
    queue: &str,
    limit: usize,
    who: &Claimer<'_>,
    lane: Lane,
) -> anyhow::Result<usize> {
    let of = match lane {
        Lane::Part { of, .. } => of,
        Lane::Whole | Lane::Joining => 1,
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

#[cfg(test)]
mod tests {
    use super::*;

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
