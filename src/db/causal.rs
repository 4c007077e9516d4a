//! Causal reads on a Galera node: a session that must see what other nodes committed.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// Which statements of a session wait for the cluster on a Galera node: see [`causal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Causal {
    /// Reads (SELECT, SHOW): the schema check and the operator commands.
    Reads,
    /// Reads and writes: `myjob lock`'s lease, which judges a row by its time.
    Everything,
}

/// On a Galera node, makes the session's statements wait until the node has applied every
/// write the cluster committed before them (`wsrep_sync_wait`). A node applies other nodes'
/// commits a moment after they commit; without the wait, a read through it may not see a
/// `myjob migrate` or an enqueue just committed through another node. It costs a round trip
/// of the cluster per statement, so the claim's hot path never asks for it. Elsewhere it does
/// nothing: MySQL has no `wsrep_on`, and a MariaDB outside a cluster says OFF. Says whether
/// the server is a Galera node (so that a caller on a long-lived connection knows to call
/// [`causal_off`] after).
pub async fn causal(conn: &mut Conn, what: Causal) -> anyhow::Result<bool> {
    let wsrep: Option<(String, String)> = conn
        .query_first("SHOW VARIABLES LIKE 'wsrep_on'")
        .await
        .context("asking whether the server is a Galera node")?;
    if !wsrep.is_some_and(|(_, on)| on.eq_ignore_ascii_case("ON")) {
        return Ok(false);
    }
    // Bits: 1 reads, 2 UPDATE and DELETE, 4 INSERT and REPLACE.
    let mask = match what {
        Causal::Reads => 1,
        Causal::Everything => 7,
    };
    conn.query_drop(format!("SET SESSION wsrep_sync_wait = {mask}"))
        .await
        .context("asking the Galera node for causal reads")?;
    Ok(true)
}

/// Ends what [`causal`] began, on a Galera node: the session's statements stop waiting for
/// the cluster (the claim's hot path must not pay a cluster round trip per statement).
pub async fn causal_off(conn: &mut Conn) -> anyhow::Result<()> {
    conn.query_drop("SET SESSION wsrep_sync_wait = 0")
        .await
        .context("ending the Galera node's causal reads")
}
