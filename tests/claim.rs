//! The claim behind any backlog, and no job claimed and left: index reads counted by the
//! server's Handler_read_* deltas (which show a scan EXPLAIN can hide), rows not yet due kept
//! out of the claim's range, exact queue names, no starving queue, and a job that brings its
//! worker down failed after `max_rescues` deaths in quarantine, and none of its neighbours.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::{TestDb, Worker};
use myjob::store::jobs::{BatchId, JobId, Payload};
use mysql_async::prelude::*;
use mysql_async::Conn;

/// The sum of the session's Handler_read_* counters. Reading them reads rows of its own
/// (more on MariaDB than on MySQL): see [`status_cost`].
async fn reads(conn: &mut Conn) -> u64 {
    let rows: Vec<(String, u64)> = conn
        .query("SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read%'")
        .await
        .unwrap();
    rows.into_iter().map(|r| r.1).sum()
}

/// What one [`reads`] adds to the counters, to take off a measured delta.
async fn status_cost(conn: &mut Conn) -> u64 {
    let first = reads(conn).await;
    reads(conn).await - first
}

async fn claimer(db: &TestDb) -> Conn {
    myjob::db::connect(&myjob::config::DatabaseSettings::from_url(&db.url).unwrap())
        .await
        .unwrap()
}

const WHO: myjob::store::jobs::Claimer<'static> = myjob::store::jobs::Claimer {
    owner_server: "test",
    worker: "test",
};

/// 200k rows of each kind the claim must not walk: finished rows, another queue's pending
/// rows, and rows of its own queue not yet due; and 20k due rows of its own queue, of which
/// it must read only the first (inserted as a producer would, by plain SQL with a future
/// run_at, which makes them `scheduled` at their INSERT: out of the claim's range with no
/// stager's work). A claim of 10 then reads about
/// 10 rows' worth of index entries, as on an empty table; so does the stager when nothing is
/// due. Priority, then FIFO, still holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_reads_about_what_it_claims_behind_any_backlog() {
    let db = TestDb::new("claim_backlog").await;
    let mut conn = db.conn().await;
    db.insert_rows("(queue, payload, status)", "('q', 'x', 'done')", 200_000)
        .await;
    db.insert_rows("(queue, payload)", "('other', 'x')", 200_000)
        .await;
    db.insert_rows(
        "(queue, payload, run_at)",
        "('q', 'x', NOW(6) + INTERVAL 1 DAY)",
        200_000,
    )
    .await;
    // A flash sale's line for one key: 200k jobs of its own queue blocked behind a slot,
    // inserted by plain SQL (blocked from their INSERT on).
    db.insert_rows(
        "(queue, payload, concurrency_key)",
        "('q', 'x', 'hot')",
        200_000,
    )
    .await;
    // A backlog of its own queue's due jobs too: the claim must stop after its limit.
    db.insert_rows("(queue, payload)", "('q', 'due')", 20_000)
        .await;
    let urgent = db
        .insert_sql("INSERT INTO myjob_jobs (queue, payload, priority) VALUES ('q', 'urgent', 5)")
        .await;
    conn.query_drop("ANALYZE TABLE myjob_jobs").await.unwrap();

    let mut claimer = claimer(&db).await;
    // The 200k future rows are scheduled from their INSERT on: nothing for a stager to move.
    assert_eq!(db.count("status = 'scheduled'").await, 200_000);

    // Nothing due: the stager reads almost nothing.
    let own = status_cost(&mut claimer).await;
    let before = reads(&mut claimer).await;
    assert_eq!(
        myjob::store::jobs::stage(&mut claimer, Duration::ZERO)
            .await
            .unwrap(),
        myjob::store::jobs::Staged::default()
    );
    let staged = reads(&mut claimer).await - before - own;

    let first_due: Option<u64> = conn
        .query_first("SELECT MIN(id) FROM myjob_jobs WHERE status = 'pending' AND queue = 'q' AND priority = 0")
        .await
        .unwrap();
    let before = reads(&mut claimer).await;
    let n = myjob::store::jobs::claim(
        &mut claimer,
        BatchId::new(7),
        "q",
        10,
        &WHO,
        myjob::store::jobs::Lane::Whole,
    )
    .await
    .unwrap();
    let got = myjob::store::jobs::read_batch(&mut claimer, BatchId::new(7), 1024)
        .await
        .unwrap();
    let claimed = reads(&mut claimer).await - before - own;
    eprintln!(
        "index entries read: claim + read of 10: {claimed}; stager with nothing due: {staged}"
    );
    assert_eq!((n, got.len()), (10, 10));
    assert_eq!(got[0].id.get(), urgent, "priority first");
    assert_eq!(Some(got[1].id.get()), first_due, "then FIFO");
    assert!(
        got.iter()
            .all(|j| j.queue == "q" && j.payload != Payload::Loaded(b"x".to_vec())),
        "only due jobs of its own queue"
    );
    // A few entries per claimed job (MySQL reads the rows of an index it updates by position
    // again); a walk of any backlog reads 200,000.
    assert!(
        claimed <= 100,
        "a claim of 10 read {claimed} index entries: it walks a backlog"
    );
    assert!(
        staged <= 10,
        "the stager read {staged} entries with nothing due"
    );

    // The key's line: a hand-off reads one entry or so, whether it admits the first job of
    // the 200k or finds the slot taken; a gate's pass over the queue, with the key's one slot
    // held, reads a bounded part of the line, not the line.
    use myjob::store::jobs::keys;
    let before = reads(&mut claimer).await;
    assert!(
        keys::hand_off(&mut claimer, "q", b"hot", 1, keys::Referee::Index)
            .await
            .unwrap()
    );
    let handed = reads(&mut claimer).await - before - own;
    let before = reads(&mut claimer).await;
    assert!(
        !keys::hand_off(&mut claimer, "q", b"hot", 1, keys::Referee::Index)
            .await
            .unwrap()
    );
    let refused = reads(&mut claimer).await - before - own;
    let settings = myjob::config::Settings::load(&db.config("", "")).unwrap();
    let before = reads(&mut claimer).await;
    let admitted = myjob::stager::gate::Gate::default()
        .pass(&mut claimer, &settings, myjob::stager::gate::READS_PER_PASS)
        .await
        .unwrap();
    let gated = reads(&mut claimer).await - before - own;
    eprintln!(
        "index entries read: hand-off {handed}, hand-off into a held slot {refused}, gate pass {gated}"
    );
    assert_eq!(admitted, 0, "the key's one slot is held");
    assert_eq!(db.count("status = 'blocked'").await, 199_999);
    assert_eq!(db.count("slot_live = 1").await, 1);
    assert!(handed <= 10, "a hand-off read {handed} index entries");
    assert!(
        refused <= 10,
        "a refused hand-off read {refused} index entries"
    );
    assert!(gated <= 1000, "a gate pass read {gated} index entries");
}

/// A plain INSERT with a future run_at still delays the job: it is neither claimed early nor
/// lost, and runs once due. A retry waits out its backoff as `scheduled`.
#[tokio::test(flavor = "multi_thread")]
async fn future_rows_run_when_due_and_retries_wait_as_scheduled() {
    let db = TestDb::new("claim_due").await;
    let later = db.insert_sql("INSERT INTO myjob_jobs (queue, payload, run_at) VALUES ('q', 'later', NOW(6) + INTERVAL 3 SECOND)").await;
    let config = db.config("", "");
    // A slow backoff, to see the retry wait as scheduled.
    common::edited(
        &config,
        &config,
        &[(
            "backoff = \"100ms\"\nbackoff_max = \"200ms\"",
            "backoff = \"4s\"\nbackoff_max = \"4s\"",
        )],
    );
    let flaky = db.insert("q", &["flaky"]).await[0];
    let inserted = Instant::now();
    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {later} AND status = 'scheduled'"), 1, 10)
        .await;
    db.wait_count(&format!("id = {flaky} AND status = 'scheduled'"), 1, 10)
        .await;
    db.wait_count(&format!("id = {later} AND status = 'done'"), 1, 20)
        .await;
    assert!(
        inserted.elapsed() >= Duration::from_secs(3),
        "ran before it was due"
    );
    db.wait_count(&format!("id = {flaky} AND status = 'done'"), 1, 20)
        .await;
    let (_, attempts, ..) = db.job(flaky).await;
    assert_eq!(attempts, 2);
    drop(worker);
}

/// Queue names match byte for byte: rows of 'Q' and 'q ' are not claimed by a worker of 'q'
/// (the column's collation used to compare them equal), so nothing sits claimed and unrun.
#[tokio::test(flavor = "multi_thread")]
async fn queue_names_match_exactly() {
    let db = TestDb::new("claim_exact").await;
    let exact = db.insert("q", &["a", "b"]).await;
    let upper = db.insert("Q", &["c"]).await[0];
    let spaced = db.insert("q ", &["d"]).await[0];
    let worker = Worker::start(&db.config("", ""), "1");
    db.wait_count("status = 'done'", 2, 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for id in exact {
        assert_eq!(db.job(id).await.0, "done");
    }
    for id in [upper, spaced] {
        let (status, attempts, batch, ..) = db.job(id).await;
        assert_eq!((status.as_str(), attempts, batch), ("pending", 0, None));
    }
    drop(worker);
}

/// An instance serving two queues with a backlog each works both from the start.
#[tokio::test(flavor = "multi_thread")]
async fn no_queue_starves_behind_another() {
    let db = TestDb::new("claim_fair").await;
    let config = db.config(
        "concurrency = 2\nbatch_size = 4",
        &format!(
            "\n[[queue]]\nname = \"b\"\ncommand = [\"{}\"]\n",
            db.path("handler.sh").display()
        ),
    );
    db.insert_rows("(queue, payload)", "('q', 'sleep:0.01')", 300)
        .await;
    db.insert_rows("(queue, payload)", "('b', 'sleep:0.01')", 300)
        .await;
    let worker = Worker::start(&config, "1");
    db.wait_at_least("status = 'done'", 60, 30).await;
    let (q, b) = (
        db.count("queue = 'q' AND status = 'done'").await,
        db.count("queue = 'b' AND status = 'done'").await,
    );
    assert!(q >= 15 && b >= 15, "done by queue: q {q}, b {b}");
    drop(worker);
}

/// Runs instance 1 of `config` until `done` says so, restarting it a second after each
/// death as systemd's Restart=on-failure with RestartSec would; fails after `limit`. Returns
/// how many times it was restarted.
async fn restart_until(
    db: &TestDb,
    config: &std::path::Path,
    limit: Duration,
    done: &str,
) -> (u32, Worker) {
    let deadline = Instant::now() + limit;
    let mut starts = 0;
    let mut worker = Worker::start(config, "1");
    while db.count(done).await == 0 {
        assert!(
            Instant::now() < deadline,
            "never {done}; the last worker's log:\n{}",
            worker.log_text()
        );
        if worker.exited() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            worker = Worker::start(config, "1");
            starts += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (starts, worker)
}

/// A job whose handler kills its own worker (kill -9 of myjob), with the worker restarted as
/// systemd would: it is put back after its first death, becomes a suspect at its second, and
/// is failed at its third death in the quarantine slot (max_rescues = 3), with a last_error
/// that says why: max_rescues + 2 runs. Its neighbours are all done.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_kills_its_worker_fails_after_max_rescues() {
    let db = TestDb::new("claim_poison").await;
    let config = db.config("concurrency = 1", "");
    let mut ids = db.insert("q", &["sleep:0"; 5]).await;
    let poison = db.insert("q", &["kill-worker"]).await[0];
    ids.extend(db.insert("q", &["sleep:0"; 5]).await);

    let failed = format!("id = {poison} AND status = 'failed'");
    let (starts, worker) = restart_until(&db, &config, Duration::from_secs(90), &failed).await;
    let (status, _, _, _, error) = db.job(poison).await;
    assert_eq!(status, "failed");
    let error = error.unwrap_or_default();
    assert!(
        error.contains("its worker died while running it in quarantine 3 times"),
        "{error}"
    );
    let rescues: Option<(u32, u8)> = db
        .conn()
        .await
        .exec_first(
            "SELECT rescues, suspicion FROM myjob_jobs WHERE id = ?",
            (poison,),
        )
        .await
        .unwrap();
    assert_eq!(rescues, Some((3, 2)));
    let runs = db.runs().iter().filter(|r| r.0 == poison).count();
    assert_eq!(
        runs, 5,
        "two deaths to become a suspect, three in quarantine"
    );
    assert!(starts >= 4, "the worker was restarted {starts} times");
    db.wait_count("status = 'done'", 10, 30).await;
    drop(worker);
}

/// Only the culprit is convicted: a job that kills its worker, among 50 plain jobs that run
/// beside it at `concurrency`, the worker restarted a second after each death. The poison
/// job is failed after at most max_rescues + 2 runs; every plain job is done, none charged a
/// rescue, though most were running at one death or more.
async fn only_the_culprit_is_convicted(name: &str, concurrency: usize) {
    let db = TestDb::new(name).await;
    let config = db.config(&format!("concurrency = {concurrency}"), "");
    let mut plain = db.insert("q", &["sleep:0.3"; 25]).await;
    let poison = db.insert("q", &["kill-worker"]).await[0];
    plain.extend(db.insert("q", &["sleep:0.3"; 25]).await);

    let failed = format!("id = {poison} AND status = 'failed'");
    let (starts, worker) = restart_until(&db, &config, Duration::from_secs(150), &failed).await;
    let runs = db.runs().iter().filter(|r| r.0 == poison).count();
    assert!(
        runs <= 5,
        "the poison job ran {runs} times (max_rescues = 3)"
    );
    assert!(starts >= 2, "the worker was restarted {starts} times");
    db.wait_count("status = 'done'", 50, 60).await;
    assert_eq!(db.count("status = 'failed'").await, 1);
    assert_eq!(
        db.count(&format!("id <> {poison} AND rescues > 0")).await,
        0
    );
    // The plain jobs did run beside it: some were put back, some became suspects.
    let beside = db.runs().iter().filter(|r| r.0 != poison).count();
    assert!(beside > 50, "no plain job ran twice: {beside} runs");
    drop(worker);
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_culprit_is_convicted_at_concurrency_8() {
    only_the_culprit_is_convicted("claim_culprit8", 8).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_culprit_is_convicted_at_concurrency_64() {
    only_the_culprit_is_convicted("claim_culprit64", 64).await;
}

/// A suspect's transitions outside a death: claimed into the quarantine slot, one at a time
/// beside plain jobs; released by a shutdown back to `suspect`, not to `pending`; cancelled
/// by an operator like any waiting job.
#[tokio::test(flavor = "multi_thread")]
async fn a_suspect_runs_one_at_a_time_and_stays_one_until_it_ends() {
    let db = TestDb::new("claim_suspects").await;
    let config = db.config("concurrency = 4", "");
    let suspects = db.insert("q", &["sleep:30", "sleep:30", "sleep:30"]).await;
    let plain = db.insert("q", &["sleep:30", "sleep:30"]).await;
    let cancelled = db.insert("q", &["sleep:0"]).await[0];
    let mut conn = db.conn().await;
    conn.exec_drop(
        "UPDATE myjob_jobs SET status = 'suspect', suspicion = 2 WHERE id IN (?, ?, ?, ?)",
        (suspects[0], suspects[1], suspects[2], cancelled),
    )
    .await
    .unwrap();
    let out = common::myjob(
        &[
            "--config",
            config.to_str().unwrap(),
            "cancel",
            &cancelled.to_string(),
        ],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(db.job(cancelled).await.0, "cancelled");

    let mut worker = Worker::start(&config, "1");
    // Both plain jobs and one suspect run; the other suspects wait, though slots are free.
    db.wait_count("status = 'claimed'", 3, 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(db.count("status = 'claimed'").await, 3);
    assert_eq!(db.count("status = 'suspect'").await, 2);
    assert_eq!(
        db.count(&format!(
            "status = 'claimed' AND id IN ({}, {})",
            plain[0], plain[1]
        ))
        .await,
        2
    );

    // A shutdown cuts them short: the suspect goes back to waiting as one.
    worker.signal(nix::sys::signal::Signal::SIGTERM);
    worker.wait(30);
    assert_eq!(db.count("status = 'suspect' AND suspicion = 2").await, 3);
    assert_eq!(db.count("status = 'pending' AND suspicion = 0").await, 2);
    assert_eq!(db.count("rescues > 0").await, 0);
}

/// One statement writes the `done` outcomes of several batches, each row fenced by its own
/// batch: batch ids are random 64-bit numbers, and two that differ in their last bit only,
/// above 2^63, are told apart (compared as doubles they would be equal). An outcome under
/// the wrong batch matches nothing, beside one that is written.
#[tokio::test(flavor = "multi_thread")]
async fn one_write_of_several_batches_fences_each_job_by_its_own() {
    use myjob::store::jobs::{write_outcomes, Completion, Outcome};
    let db = TestDb::new("claim_done_fence").await;
    let high: u64 = 0xFFFF_FFFF_FFFF_F000;
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for batch in [high, high + 2, 7] {
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload, status, attempts, batch_id) \
             VALUES ('q', 'x', 'claimed', 1, ?)",
            (batch,),
        )
        .await
        .unwrap();
        ids.push(conn.last_insert_id().unwrap());
    }
    let done = |job_id: u64, batch_id: u64| Completion {
        job_id: JobId::new(job_id),
        batch_id: BatchId::new(batch_id),
        outcome: Outcome::Done,
        slot: None,
    };
    // The first job's outcome comes under a batch one bit away from its own.
    let unwritten = write_outcomes(
        &mut conn,
        &[
            done(ids[0], high + 1),
            done(ids[1], high + 2),
            done(ids[2], 7),
        ],
    )
    .await
    .unwrap();
    let lost = myjob::store::jobs::Claim {
        job_id: JobId::new(ids[0]),
        batch_id: BatchId::new(high + 1),
    };
    assert_eq!(unwritten.lost, vec![lost], "{unwritten:?}");
    let rows: Vec<(u64, String)> = conn
        .query("SELECT id, CAST(status AS CHAR) FROM myjob_jobs ORDER BY id")
        .await
        .unwrap();
    let statuses: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(statuses, ["claimed", "done", "done"]);
}
