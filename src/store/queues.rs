//! Every statement about `myjob_queues`: which queues an operator has paused. A few rows,
//! each found by its primary key.

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
