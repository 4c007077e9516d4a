//! Every statement about `myjob_lanes` (migration 16): which instances claim from a queue
//! through a Galera node lately, so that each takes its own part of the queue's head (see
//! `worker::lanes`). An instance is its node (`owner_server`) and its name (`worker`).

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// An instance that claims, as `myjob_lanes` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimer {
    /// The node it claims through.
    pub server: String,
    /// `host:pid:instance`.
    pub worker: String,
}

/// Says that `who` claims from `queue`, unless it said so within `fresh`: an UPDATE that
/// changes nothing writes nothing (on Galera, no write set). Served by the primary key; each
/// instance writes its own rows only.
pub async fn stamp(
    conn: &mut Conn,
    queue: &str,
    who: &Claimer,
    fresh: Duration,
) -> anyhow::Result<()> {
    conn.exec_drop(
        "INSERT INTO myjob_lanes (queue, server, worker, seen_at) VALUES (?, ?, ?, NOW(6)) \
         ON DUPLICATE KEY UPDATE seen_at = \
             IF(seen_at < NOW(6) - INTERVAL ? MICROSECOND, NOW(6), seen_at)",
        (queue, &who.server, &who.worker, fresh.as_micros() as u64),
    )
    .await
    .with_context(|| format!("saying which instances claim from queue {queue}"))
}

/// The instances that said within `within` that they claim from `queue`, in the primary
/// key's order. A range of the primary key: a row per instance.
pub async fn seen(conn: &mut Conn, queue: &str, within: Duration) -> anyhow::Result<Vec<Claimer>> {
    let rows: Vec<(String, String)> = conn
        .exec(
            "SELECT server, worker FROM myjob_lanes \
             WHERE queue = ? AND seen_at >= NOW(6) - INTERVAL ? MICROSECOND \
             ORDER BY server, worker",
            (queue, within.as_micros() as u64),
        )
        .await
        .with_context(|| format!("reading which instances claim from queue {queue}"))?;
    Ok(rows
        .into_iter()
        .map(|(server, worker)| Claimer { server, worker })
        .collect())
}

/// The most rows one [`prune`] deletes.
const PRUNE_BATCH: u64 = 1000;

/// Forgets up to [`PRUNE_BATCH`] lanes not seen for `older_than` (an instance gone, a node restarted
/// under a new start time, a queue no longer served); returns how many. Only the lanes seen lately count,
/// so an old row is harmless: this keeps the table from growing. A scan of the primary key,
/// a few rows per queue and instance.
pub async fn prune(conn: &mut Conn, older_than: Duration) -> anyhow::Result<u64> {
    conn.exec_drop(
        "DELETE FROM myjob_lanes WHERE seen_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?",
        (older_than.as_micros() as u64, PRUNE_BATCH),
    )
    .await
    .context("forgetting old lanes")?;
    Ok(conn.affected_rows())
}
