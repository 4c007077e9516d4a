//! Every statement about `myjob_lanes` (migration 16): which instances claim from a queue
//! through a Galera node lately, so that each takes its own part of the queue's head (see
//! `worker::consumer::lanes`). An instance is its node (`owner_server`) and its name (`worker`).

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Value};

use super::jobs::in_list;

/// An instance that claims, as `myjob_lanes` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimer {
    /// The node it claims through.
    pub server: String,
    /// `host:pid:instance`.
    pub worker: String,
}

/// Says that `who` claims from each of `queues` (at least one), in one statement: a row per
/// queue, its `seen_at` moved on unless it is younger than `fresh` (an UPDATE that changes
/// nothing writes nothing; on Galera, no write set). Served by the primary key; each instance
/// writes its own rows only.
pub async fn stamp(
    conn: &mut Conn,
    queues: &[&str],
    who: &Claimer,
    fresh: Duration,
) -> anyhow::Result<()> {
    let rows = vec!["(?, ?, ?, NOW(6))"; queues.len()].join(", ");
    let mut params: Vec<Value> = Vec::with_capacity(queues.len() * 3 + 1);
    for q in queues {
        params.extend([
            (*q).into(),
            who.server.as_str().into(),
            who.worker.as_str().into(),
        ]);
    }
    params.push((fresh.as_micros() as u64).into());
    conn.exec_drop(
        format!(
            "INSERT INTO myjob_lanes (queue, server, worker, seen_at) VALUES {rows} \
             ON DUPLICATE KEY UPDATE seen_at = \
                 IF(seen_at < NOW(6) - INTERVAL ? MICROSECOND, NOW(6), seen_at)"
        ),
        Params::Positional(params),
    )
    .await
    .context("saying which queues this instance claims from")
}

/// A queue's instance that said within the asked time that it claims from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub queue: String,
    pub claimer: Claimer,
}

/// The instances that said within `within` that they claim from one of `queues` (at least
/// one), by queue, then in the primary key's order. Ranges of the primary key: a row per
/// queue and instance.
pub async fn seen(conn: &mut Conn, queues: &[&str], within: Duration) -> anyhow::Result<Vec<Seen>> {
    let (list, mut params) = in_list(queues);
    params.push((within.as_micros() as u64).into());
    let rows: Vec<(Vec<u8>, String, String)> = conn
        .exec(
            format!(
                "SELECT queue, server, worker FROM myjob_lanes \
                 WHERE queue IN ({list}) AND seen_at >= NOW(6) - INTERVAL ? MICROSECOND \
                 ORDER BY queue, server, worker"
            ),
            Params::Positional(params),
        )
        .await
        .context("reading which instances claim from the queues")?;
    Ok(rows
        .into_iter()
        .map(|(queue, server, worker)| Seen {
            // The column is binary: no name may make the conversion fail.
            queue: String::from_utf8_lossy(&queue).into_owned(),
            claimer: Claimer { server, worker },
        })
        .collect())
}

/// The most rows one [`prune`] deletes.
const PRUNE_BATCH: u64 = 1000;

/// Forgets up to [`PRUNE_BATCH`] lanes not seen for `older_than` (an instance gone, a node
/// restarted under a new start time, a queue no longer served); returns how many. Only the
/// lanes seen lately count, so an old row is harmless: this keeps the table from growing. A
/// scan of the primary key, a few rows per queue and instance.
pub async fn prune(conn: &mut Conn, older_than: Duration) -> anyhow::Result<u64> {
    conn.exec_drop(
        "DELETE FROM myjob_lanes WHERE seen_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?",
        (older_than.as_micros() as u64, PRUNE_BATCH),
    )
    .await
    .context("forgetting old lanes")?;
    Ok(conn.affected_rows())
}
