//! Database errors by kind, with a real server: a statement that loses a race (here a lock
//! wait timeout, which is handled as a deadlock or a Galera certification conflict is) is
//! tried again on the same connection, and an outcome the server refuses fails only its own
//! job.

mod common;

use std::time::Duration;

use common::{edited, TestDb, Worker};
use mysql_async::prelude::*;

/// Another session holds the row of a running job locked for longer than the instance's
/// `lock_wait_timeout`: the outcome write times out, is logged and tried again on the same
/// connection (no reconnect), and lands once the lock is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_wait_is_tried_again_on_the_same_connection() {
    let db = TestDb::new("lock_wait").await;
    let config = db.config("concurrency = 2", "");
    let url_line = format!("url = \"{}\"", db.url);
    let with_wait = format!("{url_line}\nlock_wait_timeout = \"1s\"");
    edited(&config, &config, &[(url_line.as_str(), with_wait.as_str())]);
    let id = db.insert("q", &["sleep:1"]).await[0];
    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 20)
        .await;

    let mut locker = db.conn().await;
    locker.query_drop("BEGIN").await.unwrap();
    locker
        .exec_drop("SELECT id FROM myjob_jobs WHERE id = ? FOR UPDATE", (id,))
        .await
        .unwrap();
    worker
        .wait_log("trying again on the same connection", 20)
        .await;
    // Held past a few of the instance's tries: each fails after the bound, is logged, and is
    // tried again; the loop keeps turning (the watchdog would see it).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(db.job(id).await.0, "claimed");
    locker.query_drop("COMMIT").await.unwrap();

    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
    let log = worker.log_text();
    assert!(log.contains("Lock wait timeout exceeded"), "{log}");
    assert!(!log.contains("reconnecting"), "{log}");
    assert_eq!(log.matches("consumer: connected").count(), 1, "{log}");
}

/// A trigger of the user's rejects marking one job done. The batch's other outcomes are
/// written one by one and land; the rejected job fails with the server's message; the
/// connection is kept.
#[tokio::test(flavor = "multi_thread")]
async fn an_outcome_the_server_refuses_fails_only_its_job() {
    let db = TestDb::new("refused").await;
    db.conn()
        .await
        .query_drop(
            "CREATE TRIGGER refuse_done BEFORE UPDATE ON myjob_jobs FOR EACH ROW \
             IF NEW.status = 'done' AND NEW.payload = 'reject' THEN \
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'rejected by a trigger'; \
             END IF",
        )
        .await
        .unwrap();
    let config = db.config("concurrency = 4", "");
    let mut ids = db.insert("q", &["quick"; 10]).await;
    let rejected = db.insert("q", &["reject"]).await[0];
    ids.extend(db.insert("q", &["quick"; 10]).await);
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 20, 30).await;
    db.wait_count(&format!("id = {rejected} AND status = 'failed'"), 1, 20)
        .await;
    let (_, _, _, _, error) = db.job(rejected).await;
    let error = error.unwrap_or_default();
    assert!(error.contains("rejected by a trigger"), "{error}");
    let log = worker.log_text();
    assert!(log.contains("writing them one by one"), "{log}");
    assert!(!log.contains("reconnecting"), "{log}");
}
