//! Every statement about `myjob_queues`: which queues an operator has paused, and the rate
//! limits' budgets. A few rows, each found by its primary key.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// The paused queues' names, read whole (the primary key, a few rows). Every consumer reads
/// them once per `poll_interval` as part of its probe (see `jobs::probe`).
pub const PAUSED: &str = "SELECT queue FROM myjob_queues WHERE paused_at IS NOT NULL";

/// The paused queues' names.
pub async fn paused(conn: &mut Conn) -> anyhow::Result<Vec<String>> {
    let rows: Vec<Vec<u8>> = conn
        .query(PAUSED)
        .await
        .context("reading the paused queues")?;
    // The column is binary: no name may make the conversion fail.
    Ok(rows
        .into_iter()
        .map(|q| String::from_utf8_lossy(&q).into_owned())
        .collect())
}

/// Pauses `queue`. Returns false when it was paused already (its first pause time is kept).
/// Served by the primary key.
pub async fn pause(conn: &mut Conn, queue: &str) -> anyhow::Result<bool> {
    conn.exec_drop(
        "INSERT INTO myjob_queues (queue, paused_at) VALUES (?, NOW(6)) \
         ON DUPLICATE KEY UPDATE paused_at = COALESCE(paused_at, VALUES(paused_at))",
        (queue,),
    )
    .await
    .with_context(|| format!("pausing queue {queue}"))?;
    // 1 for a new row, 2 for a row changed, 0 for one left as it was.
    Ok(conn.affected_rows() > 0)
}

/// Resumes `queue`. Returns false when it was not paused. Served by the primary key.
pub async fn resume(conn: &mut Conn, queue: &str) -> anyhow::Result<bool> {
    conn.exec_drop(
        "UPDATE myjob_queues SET paused_at = NULL WHERE queue = ? AND paused_at IS NOT NULL",
        (queue,),
    )
    .await
    .with_context(|| format!("resuming queue {queue}"))?;
    Ok(conn.affected_rows() > 0)
}

/// A rate-limited queue's starts taken by [`reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// How many jobs may start now: at most the number asked for; 0 when the budget is
    /// spent, or when another instance changed it between the read and the write.
    pub granted: usize,
    /// How long, once the granted starts are used, until the budget has a start again (µs,
    /// 0 or less: it has one now). 0 when another instance won the race.
    pub wait_us: i64,
    /// The arrival time this reservation wrote (µs since the epoch, the database's clock):
    /// its starts hold the intervals up to it. 0 when nothing was granted.
    pub tat_us: i64,
}

/// The budget's row, and the database's clock: the arrival time (None: never used) and
/// now, in microseconds since the epoch. Served by the primary key.
const BUDGET: &str =
    "SELECT rate_tat, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) \
     FROM myjob_queues WHERE queue = ?";

/// Takes up to `want` starts of `queue` under `rate`: the generic cell rate algorithm, as
/// Oban and River use it. The budget holds `burst` starts and refills one per
/// `interval_us`; its state is one arrival time in the queue's row, by the database's
/// clock, shared by every instance and host. Read, then written back only if nobody wrote
/// it in between (a compare-and-set, autocommit): no lock is held across statements, so
/// an instance cut off mid-claim holds nobody up. On a Galera cluster a write based on a
/// read that missed another node's write fails certification (1213) rather than
/// over-granting. Returns 0 granted, and no wait, when another instance won the race.
/// The row is created the first time. Served by the primary key. Starts granted and not
/// used go back with [`refund`].
pub async fn reserve(
    conn: &mut Conn,
    queue: &str,
    rate: &crate::config::RateLimit,
    want: usize,
) -> anyhow::Result<Reservation> {
    let context = || format!("taking rate-limited starts of queue {queue}");
    let mut row: Option<(Option<i64>, i64)> = conn
        .exec_first(BUDGET, (queue,))
        .await
        .with_context(context)?;
    if row.is_none() {
        conn.exec_drop(
            "INSERT INTO myjob_queues (queue) VALUES (?) ON DUPLICATE KEY UPDATE queue = queue",
            (queue,),
        )
        .await
        .with_context(context)?;
        row = conn
            .exec_first(BUDGET, (queue,))
            .await
            .with_context(context)?;
    }
    let (tat, now_us) = row.with_context(context)?;
    let interval_us = rate.interval_us;
    let span_us = interval_us.saturating_mul(rate.burst.into());
    // A clock that stepped back must not leave the budget far in the future.
    let from_us = tat
        .unwrap_or(now_us)
        .clamp(now_us, now_us.saturating_add(span_us));
    // Starts fit while the arrival time stays within `burst` intervals of now.
    let room = now_us.saturating_add(span_us).saturating_sub(from_us);
    let granted = (room / interval_us).clamp(0, want as i64);
    let tat_us = from_us.saturating_add(interval_us.saturating_mul(granted));
    // The next start is free once the arrival time is back within the burst.
    let wait_us = tat_us
        .saturating_sub(span_us.saturating_sub(interval_us))
        .saturating_sub(now_us);
    if granted == 0 {
        return Ok(Reservation {
            granted: 0,
            wait_us,
            tat_us: 0,
        });
    }
    conn.exec_drop(
        "UPDATE myjob_queues SET rate_tat = ? WHERE queue = ? AND rate_tat <=> ?",
        (tat_us, queue, tat),
    )
    .await
    .with_context(context)?;
    Ok(match conn.affected_rows() {
        1 => Reservation {
            granted: granted as usize,
            wait_us,
            tat_us,
        },
        _ => Reservation {
            granted: 0,
            wait_us: 0,
            tat_us: 0,
        },
    })
}

/// Gives back `unused` starts of `reservation` that its claim did not use (the queue had
/// fewer due jobs, or the claim lost a race and rolled back): the arrival time moves back
/// by as many intervals, but only by the part of them still ahead of the database's clock.
/// An interval that has passed unused is gone, as time is for a queue with no jobs; giving
/// it back after other instances moved the arrival time on (a claim can wait out a lock for
/// `lock_wait_timeout`) would let starts through over the limit. Lost with a broken
/// connection, which leaves the budget under-used, never over. Served by the primary key.
pub async fn refund(
    conn: &mut Conn,
    queue: &str,
    rate: &crate::config::RateLimit,
    reservation: &Reservation,
    unused: usize,
) -> anyhow::Result<()> {
    let back = rate.interval_us.saturating_mul(unused as i64);
    conn.exec_drop(
        "UPDATE myjob_queues SET rate_tat = rate_tat - LEAST(?, GREATEST(0, ? - \
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))) \
         WHERE queue = ?",
        (back, reservation.tat_us, queue),
    )
    .await
    .with_context(|| format!("giving back rate-limited starts of queue {queue}"))
}
