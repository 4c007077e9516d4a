//! A server that takes no writes: after a failover the url reaches a replica, or the primary
//! was demoted (`read_only`). Reads work and writes fail, so a worker must neither reconnect
//! in a tight loop nor log a line per attempt; it says once what is wrong, tries again with a
//! growing pause, and goes on by itself when the server takes writes again.
//!
//! The test sets the server's global `read_only`, which turns down every other test's writes:
//! it is ignored by a plain `cargo test`, which runs all the modules in one process, and
//! tests/run runs it alone (`it read_only:: --ignored`), after a stage's other runs.

use std::time::Duration;

use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;

/// Sets `read_only` on the server while it lives; put back however the test ends.
struct ReadOnly {
    url: String,
}

impl ReadOnly {
    async fn on(db: &TestDb) -> ReadOnly {
        db.conn()
            .await
            .query_drop("SET GLOBAL read_only = 1")
            .await
            .unwrap();
        ReadOnly {
            url: db.url.clone(),
        }
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let url = self.url.clone();
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let mut conn = mysql_async::Conn::from_url(&url).await.unwrap();
                conn.query_drop("SET GLOBAL read_only = 0").await.unwrap();
            })
        })
        .join()
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "sets the server's global read_only: run alone, as tests/run does"]
async fn a_read_only_server_is_said_once_and_left_by_itself() {
    let db = TestDb::new("read_only").await;
    // The worker's account has no privilege to write past read_only, as in production.
    let user = format!("myjob_ro_{:08x}", rand::random::<u32>());
    let mut admin = db.conn().await;
    for sql in [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'Secret-ro-1'"),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {}.* TO '{user}'@'%'",
            db.name
        ),
        format!("GRANT PROCESS ON *.* TO '{user}'@'%'"),
    ] {
        admin.query_drop(sql).await.unwrap();
    }
    let config = db.config_as(&user, "Secret-ro-1");
    let worker = Worker::start(&config, "1");
    db.insert("q", &["ok"]).await;
    db.wait_count("status = 'done'", 1, 20).await;

    let read_only = ReadOnly::on(&db).await;
    let before = worker.log_text().lines().count();
    db.insert("q", &["ok", "ok", "ok"]).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let log = worker.log_text();
    let since: Vec<&str> = log.lines().skip(before).collect();
    let warnings: Vec<&&str> = since.iter().filter(|l| l.contains(" WARN ")).collect();
    assert!(
        since
            .iter()
            .any(|l| l.contains("consumer: the server is read-only")),
        "{log}"
    );
    assert!(
        warnings.len() <= 3,
        "{} warnings in 8 s:\n{}",
        warnings.len(),
        since.join("\n")
    );
    assert_eq!(db.count("status = 'done'").await, 1);

    drop(read_only);
    db.wait_count("status = 'done'", 4, 30).await;
    worker
        .wait_log("consumer: the server accepts writes again", 5)
        .await;
    admin
        .query_drop(format!("DROP USER '{user}'@'%'"))
        .await
        .unwrap();
}
