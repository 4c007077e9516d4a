//! Database errors by kind, with a real server: a statement that loses a race (a deadlock, or
//! a lock wait timeout, handled as a Galera certification conflict is) is tried again on the
//! same connection, an outcome the server refuses fails only its own job, and outcomes written
//! one by one that a write cut short leaves unwritten stay held.

use std::time::Duration;

use crate::common;
use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;

/// Another session holds the row of a running job locked for longer than the instance's
/// `lock_wait_timeout`: the outcome write times out, is logged and tried again on the same
/// connection (no reconnect), and lands once the lock is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_wait_is_tried_again_on_the_same_connection() {
    let db = TestDb::new("lock_wait").await;
    let config = db.config_with_lock_wait("concurrency = 2", "1s");
    let id = db.insert("q", &["sleep:1"]).await[0];
    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 20)
        .await;

    let mut locker = db.lock_job(id).await;
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

/// A real deadlock on the outcome write: a trigger of the user's counts finished jobs in a
/// row that another session holds, and that session then waits for the job's row. The server
/// rolls back the lighter transaction, the instance's (1213); it is logged and written again
/// on the same connection, and the job ends done, counted once.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadlock_is_tried_again_on_the_same_connection() {
    let db = TestDb::new("deadlock").await;
    let mut setup = db.conn().await;
    for sql in [
        "CREATE TABLE audit (id INT PRIMARY KEY, done INT NOT NULL)",
        "CREATE TABLE audit_log (id INT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(20))",
        "INSERT INTO audit VALUES (1, 0)",
        "CREATE TRIGGER count_done AFTER UPDATE ON myjob_jobs FOR EACH ROW \
         IF NEW.status = 'done' THEN UPDATE audit SET done = done + 1 WHERE id = 1; END IF",
    ] {
        setup.query_drop(sql).await.unwrap();
    }
    let config = db.config("", "");
    let worker = Worker::start(&config, "1");
    worker.wait_log("ready", 20).await;

    // The other session: heavier (a few hundred rows written), so that the server picks the
    // instance's one-row write as the victim; it holds the audit row.
    let mut other = db.conn().await;
    other.query_drop("BEGIN").await.unwrap();
    // Rows of its own: a SELECT from information_schema reads every database's tables, and
    // MariaDB 11.8 fails it (1684) while another test's DDL is under way.
    let rows = vec!["('x')"; 300].join(", ");
    other
        .query_drop(format!("INSERT INTO audit_log (note) VALUES {rows}"))
        .await
        .unwrap();
    other
        .query_drop("UPDATE audit SET done = done + 100 WHERE id = 1")
        .await
        .unwrap();
    let id = db.insert("q", &["quick"]).await[0];
    // The instance's write now holds the job's row and waits in the trigger for the audit row:
    // the row reads as claimed, yet is locked.
    let mut writing = false;
    for _ in 0..200 {
        let claimed = db.job(id).await.0 == "claimed";
        let locked = setup
            .exec_drop(
                "SELECT id FROM myjob_jobs WHERE id = ? FOR UPDATE NOWAIT",
                (id,),
            )
            .await
            .is_err();
        if claimed && locked {
            writing = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        writing,
        "the instance's write never waited for the audit row"
    );
    // Closes the cycle: the server finds the deadlock at once and rolls the instance back.
    other
        .exec_drop(
            "UPDATE myjob_jobs SET priority = priority + 1 WHERE id = ?",
            (id,),
        )
        .await
        .unwrap();
    other.query_drop("COMMIT").await.unwrap();

    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
    let done: u64 = setup
        .query_first("SELECT done FROM audit WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done, 101, "the job was counted once");
    let log = worker.log_text();
    assert!(log.contains("Deadlock found"), "{log}");
    assert!(log.contains("trying again on the same connection"), "{log}");
    assert!(!log.contains("reconnecting"), "{log}");
    assert_eq!(log.matches("consumer: connected").count(), 1, "{log}");
}

/// An outcome written one by one (the server refused the batch it was in) whose write gets no
/// answer in time: the connection is dropped, and the outcomes not written yet stay held, to
/// be written after the reconnect. Dropped, their jobs would stay claimed by a connection that
/// is gone, and the reaper would hand them out again: finished jobs run twice.
#[tokio::test(flavor = "multi_thread")]
async fn an_outcome_write_cut_short_one_by_one_is_kept_and_written_after_the_reconnect() {
    let db = TestDb::new("one_by_one_cut").await;
    let proxy = common::proxy::Proxy::new();
    proxy.up().await;
    // Statements get 1 s + 5 s before the connection counts as in doubt.
    let base = db.config_with_lock_wait("concurrency = 2", "1s");
    let config = db.path("proxied.toml");
    let url_line = format!("url = \"{}\"", db.url);
    let proxied = format!("url = \"{}\"", proxy.url(&db));
    common::edited(&base, &config, &[(&url_line, &proxied)]);

    let ids = db.insert("q", &["slow-if-flag", "slow-if-flag"]).await;
    let (refused, stalled) = (ids[0], ids[1]);
    // The user's trigger refuses the first job's `done`; the second's stalls past the
    // statement limit, then fails, while the test holds a named lock.
    let armed = format!("{}.armed", db.name);
    let mut test = db.conn().await;
    let held: Option<i64> = test
        .exec_first("SELECT GET_LOCK(?, 0)", (&armed,))
        .await
        .unwrap();
    assert_eq!(held, Some(1));
    test.query_drop(format!(
        "CREATE TRIGGER cut_short BEFORE UPDATE ON myjob_jobs FOR EACH ROW \
         BEGIN \
           IF NEW.status = 'done' AND NEW.id = {refused} THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by a trigger'; \
           END IF; \
           IF NEW.status = 'done' AND NEW.id = {stalled} AND IS_USED_LOCK('{armed}') IS NOT NULL THEN \
             DO SLEEP(9); \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'stalled by a trigger'; \
           END IF; \
         END"
    ))
    .await
    .unwrap();

    // Both run until the flag goes; their outcomes are held while the database is away, then
    // written together: refused, so one by one.
    let flag = db.path("slow");
    std::fs::write(&flag, "").unwrap();
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 2, 20).await;
    while db.runs().len() < 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.down();
    std::fs::remove_file(&flag).unwrap();
    worker
        .wait_log(&format!("job done job_id={stalled}"), 20)
        .await;
    proxy.up().await;
    worker.wait_log("writing them one by one", 30).await;
    worker
        .wait_log("no answer from the database within", 30)
        .await;
    test.exec_drop("DO RELEASE_LOCK(?)", (&armed,))
        .await
        .unwrap();

    db.wait_count(&format!("id = {stalled} AND status = 'done'"), 1, 60)
        .await;
    db.wait_count(&format!("id = {refused} AND status = 'failed'"), 1, 30)
        .await;
    let runs = db.runs();
    let of_stalled = runs.iter().filter(|r| r.0 == stalled).count();
    assert_eq!(of_stalled, 1, "the finished job ran again: {runs:?}");
    assert!(
        !worker.log_text().contains("reaper: stale claim put back"),
        "{}",
        worker.log_text()
    );
}
