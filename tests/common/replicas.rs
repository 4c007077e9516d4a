//! The primary and replica of `tests/db-server.sh`'s `replicas` (MariaDB 11.8, GTID,
//! semi-synchronous), for the failover tests: made healthy again before each, the primary
//! killed or set read-only, the replica promoted.

use std::path::Path;
use std::process::Command;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Row};

/// The replica's url (`MYJOB_TEST_REPLICA`); the primary's is `MYJOB_TEST_SERVER`.
pub fn replica_url() -> String {
    std::env::var("MYJOB_TEST_REPLICA")
        .expect("MYJOB_TEST_REPLICA: the failover tests need tests/db-server.sh's replicas")
}

fn db_server(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/db-server.sh");
    let out = Command::new(script).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tests/db-server.sh {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pair as a test needs it: server 1 the primary, server 2 its replica, both running
/// (rebuilt when an earlier test switched or killed one).
pub fn pair_up() {
    db_server(&["up", "replicas"]);
}

/// kill -9 of the primary, by its pid file.
pub fn kill_primary() {
    db_server(&["kill", "replicas", "1"]);
}

pub async fn conn(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).unwrap()).await.unwrap()
}

/// Waits until the replica has applied all the primary has written (a planned switchover).
pub async fn caught_up(primary: &str, replica: &str) {
    let pos: String = conn(primary)
        .await
        .query_first("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap();
    wait_gtid(replica, &pos).await;
}

/// Waits until the replica has applied what it received from its primary, which may be gone.
pub async fn apply_received(replica: &str) {
    let status: Row = conn(replica)
        .await
        .query_first("SHOW SLAVE STATUS")
        .await
        .unwrap()
        .expect("not a replica");
    let received: String = status.get("Gtid_IO_Pos").unwrap();
    wait_gtid(replica, &received).await;
}

async fn wait_gtid(replica: &str, pos: &str) {
    let waited: i64 = conn(replica)
        .await
        .exec_first("SELECT MASTER_GTID_WAIT(?, 60)", (pos,))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(waited, 0, "the replica did not reach {pos}");
}

/// The replica becomes a primary: replication stopped and forgotten, writes taken.
pub async fn promote(replica: &str) {
    let mut c = conn(replica).await;
    for sql in [
        "STOP SLAVE",
        "RESET SLAVE ALL",
        "SET GLOBAL read_only = OFF",
    ] {
        c.query_drop(sql).await.unwrap();
    }
}
