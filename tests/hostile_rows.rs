//! Rows a producer wrote that myjob never would: counters at their limits, an owner that is
//! a forged log line. Anyone who can INSERT into `myjob_jobs` can write them; none may stop a
//! queue or the reaper, or forge a line in the log. The worker under test is the debug build,
//! whose arithmetic panics on overflow.

mod common;

use std::os::unix::fs::MetadataExt;

use common::{TestDb, Worker};

/// The rows: a claim whose rescue count is at the column's limit, abandoned an hour
/// ago, ahead of a plain abandoned claim. The reaper takes the oldest first; it must put back
/// the second whatever the first does.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_with_its_rescues_at_the_limit_does_not_stop_the_reaper() {
    let db = TestDb::new("rescues_limit").await;
    let config = db.config("", "");
    let poison = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, status, batch_id, claimed_at, attempts, \
                 suspicion, rescues) \
             VALUES ('zz', 'p', 'claimed', 111, NOW(6) - INTERVAL 1 HOUR, 1, 2, 4294967295)",
        )
        .await;
    let victim = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, status, batch_id, claimed_at, attempts) \
             VALUES ('q', 'victim', 'claimed', 222, NOW(6) - INTERVAL 30 MINUTE, 1)",
        )
        .await;
    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {victim} AND status = 'done'"), 1, 30)
        .await;
    // The saturated one fails as a poison pill at the limit, with the reason in its row.
    db.wait_count(&format!("id = {poison} AND status = 'failed'"), 1, 10)
        .await;
    let (_, _, _, _, error) = db.job(poison).await;
    let error = error.unwrap_or_default();
    assert!(
        error.contains("quarantine 4294967295 times"),
        "poison's last_error: {error}"
    );
    let log = worker.log_text();
    assert!(!log.contains("1264"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A pending job whose attempts are at the column's limit, ahead of the rest of its queue by
/// its priority: the claim saturates the count, and the queue runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_with_its_attempts_at_the_limit_does_not_stall_its_queue() {
    let db = TestDb::new("attempts_limit").await;
    let config = db.config("", "");
    let first = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, priority, attempts) \
             VALUES ('q', 'ok', 100, 4294967295)",
        )
        .await;
    let suspect = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, status, suspicion, attempts) \
             VALUES ('q', 'ok', 'suspect', 2, 4294967295)",
        )
        .await;
    let rest = db.insert("q", &["ok"; 5]).await;
    let worker = Worker::start(&config, "1");
    db.wait_count(
        &format!(
            "status = 'done' AND id IN ({})",
            rest.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        5,
        30,
    )
    .await;
    db.wait_count(
        &format!("id IN ({first}, {suspect}) AND status = 'done' AND attempts = 4294967295"),
        2,
        10,
    )
    .await;
    let log = worker.log_text();
    assert!(!log.contains("1264"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// An abandoned claim whose `owner_server` carries a newline, a journal priority prefix, a
/// carriage return and an escape sequence. With stderr as the journal's stream (each line
/// `<N>`-prefixed), the reaper's line about it must stay one line of its own priority.
#[tokio::test(flavor = "multi_thread")]
async fn an_owner_that_is_a_forged_log_line_stays_inside_one_line() {
    let db = TestDb::new("forged_owner").await;
    let config = db.config("", "");
    let forged = "evil\n<0>myjob: FORGED emergency\r\x1b]0;title\x07:3306/1";
    let mut conn = db.conn().await;
    use mysql_async::prelude::*;
    conn.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload, status, batch_id, owner_conn, owner_server, \
             claimed_at, attempts) \
         VALUES ('q', 'ok', 'claimed', 7, 999999999, ?, NOW(6) - INTERVAL 1 HOUR, 1)",
        (forged,),
    )
    .await
    .unwrap();
    let id = conn.last_insert_id().unwrap();
    let log = db.path("stream.log");
    std::fs::write(&log, "").unwrap();
    let meta = std::fs::metadata(&log).unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let worker =
        Worker::start_appending_with_env(&config, "1", &log, &[("JOURNAL_STREAM", &stream)]);
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
    worker.wait_log("FORGED", 5).await;
    let text = worker.log_text();
    for line in text.lines() {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| line.starts_with(p)),
            "a line without a priority of myjob's own: {line:?}\n{text}"
        );
    }
    assert!(
        !text.contains(['\r', '\x1b', '\x07']),
        "a control character reached the log:\n{text:?}"
    );
    let rescued = text
        .lines()
        .find(|l| l.contains("stale claim put back"))
        .expect("the reaper's line");
    assert!(
        rescued.starts_with("<4>") && rescued.contains("FORGED"),
        "{rescued}"
    );
}
