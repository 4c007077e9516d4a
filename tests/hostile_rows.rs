//! Rows a producer wrote that myjob never would: counters at their limits, an owner that is
//! a forged log line. Anyone who can INSERT into `myjob_jobs` can write them; none may stop a
//! queue or the reaper, or forge a line in the log. The worker under test is the debug build,
//! whose arithmetic panics on overflow.

use std::os::unix::fs::MetadataExt;

use crate::common::{id_list, TestDb, Worker};

/// The worker's log has no sign of an arithmetic or range error: no 1264 from the server (as
/// the driver says it: `ERROR 1264 (22003): Out of range value…`; a bare 1264 may be the
/// microseconds of a timestamp), no panic of its own.
fn assert_no_overflow(log: &str) {
    assert!(!log.contains("ERROR 1264"), "{log}");
    assert!(!log.contains("Out of range value"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

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
    assert_no_overflow(&worker.log_text());
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
        &format!("status = 'done' AND id IN ({})", id_list(&rest)),
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
    assert_no_overflow(&worker.log_text());
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

/// The times a producer can write into a TIMESTAMP(6) column: an hour ago, now, the type's
/// first and last instants, an hour ahead. The first three are due.
const TIMES: [&str; 5] = [
    "NOW(6) - INTERVAL 1 HOUR",
    "NOW(6)",
    "'1970-01-01 00:00:01'",
    "'2038-01-19 03:14:07.999999'",
    "NOW(6) + INTERVAL 1 HOUR",
];
const STATUSES: [&str; 8] = [
    "pending",
    "claimed",
    "done",
    "failed",
    "scheduled",
    "cancelled",
    "suspect",
    "blocked",
];

/// One row as a producer may write it: every column it can set.
#[derive(Debug, Clone)]
struct Row {
    queue: Vec<u8>,
    priority: i16,
    payload: Vec<u8>,
    status: &'static str,
    attempts: u32,
    max_attempts: Option<u32>,
    run_at: usize,
    unique_key: Option<String>,
    batch_id: Option<u64>,
    owner_conn: Option<u64>,
    owner_server: Option<String>,
    worker: Option<String>,
    claimed_at: Option<usize>,
    finished_at: Option<usize>,
    created_at: usize,
    last_error: Option<String>,
    rescues: u32,
    suspicion: u8,
    concurrency_key: Option<Vec<u8>>,
    slot: Option<u16>,
}

mod strategies {
    use proptest::prelude::*;

    use super::{Row, STATUSES};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("evil\n<0>FORGED\r\u{1b}[2J".to_owned()),
            "[\\s\\S]{0,40}",
        ]
    }

    fn count32() -> impl Strategy<Value = u32> {
        prop_oneof![
            Just(0),
            Just(1),
            Just(u32::MAX - 1),
            Just(u32::MAX),
            any::<u32>()
        ]
    }

    fn owner_server() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(prop_oneof![
            text(),
            Just("h:1/-9223372036854775808".to_owned()),
            Just("h:1/9223372036854775807".to_owned()),
            Just("h:1/1/galera:".to_owned()),
            Just("db:3306/1/galera:zz".to_owned()),
            Just("x\n<0>FORGED:3306/1".to_owned()),
        ])
    }

    pub fn row() -> impl Strategy<Value = Row> {
        let who = (
            prop_oneof![
                6 => Just(b"q".to_vec()),
                1 => Just(b"zz".to_vec()),
                1 => Just(b"z\n<0>x\x1b".to_vec()),
                1 => proptest::collection::vec(any::<u8>(), 1..64),
            ],
            any::<i16>(),
            prop_oneof![
                Just(b"ok".to_vec()),
                Just(b"perm".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..64),
            ],
            proptest::sample::select(&STATUSES[..]),
            count32(),
            proptest::option::of(count32()),
            0..5usize,
            proptest::option::of(prop_oneof!["[a-c]", text()]),
        );
        let claim = (
            proptest::option::of(prop_oneof![Just(0), Just(1), Just(u64::MAX), any::<u64>()]),
            proptest::option::of(prop_oneof![
                Just(0),
                Just(999_999_999),
                Just(u64::MAX),
                any::<u64>()
            ]),
            owner_server(),
            proptest::option::of(prop_oneof![text(), Just("host:1:1".to_owned())]),
            proptest::option::of(0..5usize),
            proptest::option::of(0..5usize),
            0..5usize,
            proptest::option::of(text()),
        );
        let counters = (
            count32(),
            prop_oneof![Just(0u8), Just(1), Just(2), Just(255), any::<u8>()],
            proptest::option::of(prop_oneof![
                Just(b"k1".to_vec()),
                Just(b"k2".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..40),
            ]),
            proptest::option::of(prop_oneof![Just(0u16), Just(1), Just(2), Just(u16::MAX)]),
        );
        (who, claim, counters).prop_map(
            |(
                (queue, priority, payload, status, attempts, max_attempts, run_at, unique_key),
                (
                    batch_id,
                    owner_conn,
                    owner_server,
                    worker,
                    claimed_at,
                    finished_at,
                    created_at,
                    last_error,
                ),
                (rescues, suspicion, concurrency_key, slot),
            )| Row {
                queue,
                priority,
                payload,
                status,
                attempts,
                max_attempts,
                run_at,
                unique_key,
                batch_id,
                owner_conn,
                owner_server,
                worker,
                claimed_at,
                finished_at,
                created_at,
                last_error,
                rescues,
                suspicion,
                concurrency_key,
                slot,
            },
        )
    }
}

/// Where a row may end, by what it was written as: the statuses allowed once the worker has
/// had its time, and whether it may be gone (retention deletes finished rows of 1970).
fn allowed(row: &Row) -> (&'static [&'static str], bool) {
    let served = row.queue == b"q";
    let due = row.run_at <= 2;
    let ran: &[&str] = &["done", "failed"];
    match row.status {
        "done" => (&["done"], true),
        "failed" => (&["failed"], true),
        "cancelled" => (&["cancelled"], true),
        // A claim of a worker that is not there: put back, and run where the queue is served.
        "claimed" if served => (ran, false),
        "claimed" => (&["pending", "suspect", "failed"], false),
        "suspect" if served => (ran, false),
        "suspect" => (&["suspect"], false),
        // Not due: the stager holds it as scheduled.
        _ if !due => (&["scheduled"], false),
        "blocked" if row.concurrency_key.is_none() => (&["blocked"], false),
        _ if served => (ran, false),
        "pending" => (&["pending"], false),
        "scheduled" if row.concurrency_key.is_none() => (&["pending"], false),
        _ => (&["blocked"], false),
    }
}

/// Inserts `row`; None when the server refuses it (two rows of one live unique key or slot:
/// the producer's own error).
async fn insert_row(conn: &mut mysql_async::Conn, row: &Row) -> Option<u64> {
    use mysql_async::prelude::*;
    let time = |i: Option<usize>| i.map_or("NULL", |i| TIMES[i]);
    let sql = format!(
        "INSERT INTO myjob_jobs (queue, priority, payload, status, attempts, max_attempts, \
             run_at, unique_key, batch_id, owner_conn, owner_server, worker, claimed_at, \
             finished_at, created_at, last_error, rescues, suspicion, concurrency_key, slot) \
         VALUES (?, ?, ?, ?, ?, ?, {}, ?, ?, ?, ?, ?, {}, {}, {}, ?, ?, ?, ?, ?)",
        TIMES[row.run_at],
        time(row.claimed_at),
        time(row.finished_at),
        TIMES[row.created_at],
    );
    let params: Vec<mysql_async::Value> = vec![
        row.queue.clone().into(),
        row.priority.into(),
        row.payload.clone().into(),
        row.status.into(),
        row.attempts.into(),
        row.max_attempts.into(),
        row.unique_key.clone().into(),
        row.batch_id.into(),
        row.owner_conn.into(),
        row.owner_server.clone().into(),
        row.worker.clone().into(),
        row.last_error.clone().into(),
        row.rescues.into(),
        row.suspicion.into(),
        row.concurrency_key.clone().into(),
        row.slot.into(),
    ];
    match conn.exec_drop(sql, params).await {
        Ok(()) => conn.last_insert_id(),
        Err(mysql_async::Error::Server(e)) if e.code == 1062 => None,
        Err(e) => panic!("{e}: {row:?}"),
    }
}

/// Random rows in every column a producer can set, beside plain jobs of the same queue: the
/// daemon keeps running, every plain job is done, and each hostile row ends where its kind
/// may (a row myjob failed with a `last_error` that says why). `MYJOB_HOSTILE_CASES` sets
/// how many sets of 40 rows are tried (3 by default, each against a worker of its own).
#[tokio::test(flavor = "multi_thread")]
async fn random_rows_in_every_column_stop_nothing() {
    use mysql_async::prelude::*;
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    let cases: usize = std::env::var("MYJOB_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rows = proptest::collection::vec(strategies::row(), 40);
    let mut runner = TestRunner::default();
    for case in 0..cases {
        let set = rows.new_tree(&mut runner).unwrap().current();
        let db = TestDb::new(&format!("hostile_props_{case}")).await;
        let config = db.config("concurrency = 4", "");
        let mut conn = db.conn().await;
        conn.query_drop("SET time_zone = '+00:00'").await.unwrap();
        let mut hostile = Vec::new();
        for row in &set {
            if let Some(id) = insert_row(&mut conn, row).await {
                hostile.push((id, row));
            }
        }
        let plain = db.insert("q", &["ok"; 20]).await;
        let mut worker = Worker::start(&config, "1");
        let plain_done = format!("status = 'done' AND id IN ({})", id_list(&plain));
        let began = std::time::Instant::now();
        let wrong = loop {
            let mut wrong = Vec::new();
            for (id, row) in &hostile {
                let end: Option<(String, Option<String>)> = conn
                    .exec_first(
                        "SELECT status, last_error FROM myjob_jobs WHERE id = ?",
                        (id,),
                    )
                    .await
                    .unwrap();
                let (statuses, may_go) = allowed(row);
                let fine = match &end {
                    None => may_go,
                    Some((status, error)) => {
                        statuses.contains(&status.as_str())
                            && (status != "failed"
                                || row.status == "failed"
                                || error.as_deref().is_some_and(|e| !e.trim().is_empty()))
                    }
                };
                if !fine {
                    wrong.push(format!(
                        "job {id} ended {end:?}, allowed {statuses:?}: {row:?}"
                    ));
                }
            }
            let done = db.count(&plain_done).await == plain.len() as u64;
            if (wrong.is_empty() && done) || began.elapsed() > std::time::Duration::from_secs(45) {
                if !done {
                    wrong.push("the plain jobs are not all done".into());
                }
                break wrong;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        };
        let log = worker.log_text();
        assert!(!worker.exited(), "case {case}: the worker exited\n{log}");
        assert!(!log.contains("panicked"), "case {case}:\n{log}");
        assert!(
            wrong.is_empty(),
            "case {case}, {} rows in:\n{}\n{log}",
            hostile.len(),
            wrong.join("\n")
        );
        eprintln!(
            "case {case}: {} hostile rows of 40 inserted, all ended as allowed in {:.1} s",
            hostile.len(),
            began.elapsed().as_secs_f64()
        );
    }
}
