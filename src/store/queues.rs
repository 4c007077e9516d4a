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

/// A rate-limited queue's starts taken by [`reserve`]: how many, and what to write back once
/// the claim knows how many it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// How many jobs may start now: at most the number asked for.
    pub granted: usize,
    /// The database's clock, in microseconds since the epoch.
    pub now_us: i64,
    /// The arrival time before this claim, brought up to `now_us`.
    pub from_us: i64,
    pub interval_us: i64,
    /// How long from `now_us` until the next start is free, when none is now.
    pub wait_us: i64,
}

impl Reservation {
    /// The arrival time once `used` starts are taken.
    pub fn after(&self, used: usize) -> i64 {
        self.from_us
            .saturating_add(self.interval_us.saturating_mul(used as i64))
    }
}

/// Takes up to `want` starts of `queue` under `rate` (the generic cell rate algorithm, as
/// Oban and River do it), inside the caller's transaction: the queue's row is locked until
/// its COMMIT, so instances on every host take turns, each by the database's own clock. The
/// budget holds `burst` starts and refills one per `interval_us`. The row is created the
/// first time. Served by the primary key. Write back with [`settle`].
pub async fn reserve(
    conn: &mut Conn,
    queue: &str,
    rate: &crate::config::RateLimit,
    want: usize,
) -> anyhow::Result<Reservation> {
    let context = || format!("taking rate-limited starts of queue {queue}");
    conn.exec_drop(
        "INSERT INTO myjob_queues (queue) VALUES (?) ON DUPLICATE KEY UPDATE rate_tat = rate_tat",
        (queue,),
    )
    .await
    .with_context(context)?;
    let row: Option<(Option<i64>, i64)> = conn
        .exec_first(
            "SELECT rate_tat, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) \
             FROM myjob_queues WHERE queue = ? FOR UPDATE",
            (queue,),
        )
        .await
        .with_context(context)?;
    let (tat, now_us) = row.with_context(context)?;
    let interval_us = i64::try_from(rate.interval_us).unwrap_or(i64::MAX);
    let from_us = tat.unwrap_or(now_us).max(now_us);
    // Starts fit while the arrival time stays within `burst` intervals of now.
    let room = now_us
        .saturating_add(interval_us.saturating_mul(rate.burst.into()))
        .saturating_sub(from_us);
    let granted = (room / interval_us).clamp(0, want as i64) as usize;
    Ok(Reservation {
        granted,
        now_us,
        from_us,
        interval_us,
        wait_us: if granted > 0 { 0 } else { interval_us - room },
    })
}

/// Writes the arrival time back after a claim took `used` of `reservation`'s starts. Served by
/// the primary key.
pub async fn settle(
    conn: &mut Conn,
    queue: &str,
    reservation: &Reservation,
    used: usize,
) -> anyhow::Result<()> {
    conn.exec_drop(
        "UPDATE myjob_queues SET rate_tat = ? WHERE queue = ?",
        (reservation.after(used), queue),
    )
    .await
    .with_context(|| format!("recording rate-limited starts of queue {queue}"))
}
