//! Dead workers and late writers, with real processes: the reaper puts back exactly a killed
//! instance's claims, never a live one's, and a reaped job's late outcome changes nothing.

use std::time::Duration;

use crate::common;
use crate::common::{edited, kill_recorded_handlers, TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_batch_its_claims_come_back_and_a_live_slow_job_stays() {
    let db = TestDb::new("kill9").await;
    let config = db.config("concurrency = 4", "");
    std::fs::write(db.path("slow"), "").unwrap();

    // Instance 2 holds one slow job for longer than stale_after: it must never be reset.
    // It has one slot, so the jobs below go to instance 1.
    let live_config = db.path("live.toml");
    edited(
        &config,
        &live_config,
        &[("concurrency = 4", "concurrency = 1")],
    );
    let live = Worker::start(&live_config, "2");
    let slow = db.insert("q", &["sleep:30"]).await[0];
    db.wait_count(&format!("id = {slow} AND status = 'claimed'"), 1, 20)
        .await;
    let (_, _, slow_batch, _, _) = db.job(slow).await;

    // Instance 1 claims four jobs whose handlers hang, and is killed mid-batch.
    let mut victim = Worker::start(&config, "1");
    let ids = db.insert("q", &["slow-if-flag"; 4]).await;
    db.wait_count("status = 'claimed' AND worker LIKE '%:1'", 4, 20)
        .await;
    victim.signal(Signal::SIGKILL);
    assert_eq!(victim.wait(10), None);

    // After stale_after (2 s) the reaper in instance 2 puts back exactly those four, and gives
    // back the attempt that never reported a result.
    db.wait_count("status = 'pending' AND attempts = 0", 4, 30)
        .await;
    // The reaper logs each job after its reset has committed: wait for the lines too.
    for id in &ids {
        live.wait_log(&format!("job_id={id}"), 5).await;
    }
    for id in &ids {
        let (status, _, batch, _, error) = db.job(*id).await;
        assert_eq!((status.as_str(), batch), ("pending", None));
        assert!(error
            .unwrap()
            .contains("attempt 1 abandoned: its claimer's connection"));
        assert!(live
            .log_text()
            .contains("reaper: stale claim put back: its claimer's connection"));
        assert!(
            live.log_text().contains(&format!("job_id={id}")),
            "reaper log names job {id}"
        );
    }
    let (status, attempts, batch, _, _) = db.job(slow).await;
    assert_eq!(
        (status.as_str(), attempts, batch),
        ("claimed", 1, slow_batch),
        "the live slow job was touched"
    );

    // They complete elsewhere.
    kill_recorded_handlers(&db, "1");
    std::fs::remove_file(db.path("slow")).unwrap();
    let _other = Worker::start(&config, "3");
    db.wait_count(
        &format!(
            "status = 'done' AND attempts = 1 AND worker LIKE '%:3' AND id IN ({}, {}, {}, {})",
            ids[0], ids[1], ids[2], ids[3]
        ),
        4,
        30,
    )
    .await;
    assert_eq!(db.job(slow).await.0, "claimed", "still the live instance's");
    drop(live);
    kill_recorded_handlers(&db, "2");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reaped_jobs_late_outcome_changes_nothing() {
    let db = TestDb::new("fencing").await;
    let config = db.config("concurrency = 1", "");
    let id = db.insert("q", &["sleep:3"]).await[0];

    // Instance 1 claims the job, then freezes; its connection is killed under it.
    let old = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 1, 20).await;
    let (_, _, old_batch, _, _) = db.job(id).await;
    old.signal(Signal::SIGSTOP);
    let mut conn = db.conn().await;
    let owner: u64 = conn
        .exec_first("SELECT owner_conn FROM myjob_jobs WHERE id = ?", (id,))
        .await
        .unwrap()
        .unwrap();
    conn.query_drop(format!("KILL CONNECTION {owner}"))
        .await
        .unwrap();

    // Instance 2's reaper puts the job back and instance 2 claims it, with a new batch.
    let new = Worker::start(&config, "2");
    db.wait_count("status = 'claimed' AND worker LIKE '%:2'", 1, 30)
        .await;
    let (_, attempts, new_batch, _, _) = db.job(id).await;
    assert_eq!(attempts, 1, "the reaped attempt was given back");
    assert_ne!(new_batch, old_batch);

    // Instance 1 wakes; its handler ran on and finished: its write is fenced out.
    old.signal(Signal::SIGCONT);
    old.wait_log("job outcome not written: its claim was reaped", 20)
        .await;
    assert!(old.log_text().contains(&format!("job_id={id}")));
    let (status, _, batch, worker, _) = db.job(id).await;
    assert_eq!(
        (status.as_str(), batch),
        ("claimed", new_batch),
        "the late 'done' overwrote the new owner's claim"
    );
    assert!(worker.unwrap().ends_with(":2"));

    // The new owner's own outcome lands.
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
    assert_eq!(db.job(id).await.2, new_batch);
    drop(new);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_process_the_reaper_refuses_and_resets_nothing() {
    let db = TestDb::new("noprocess").await;
    let user = "myjob_t_noprocess";
    let mut conn = db.conn().await;
    conn.query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await
        .unwrap();
    conn.query_drop(format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
        .await
        .unwrap();
    conn.query_drop(format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {}.* TO '{user}'@'%'",
        db.name
    ))
    .await
    .unwrap();
    // An abandoned claim: its owner connection id does not exist.
    db.insert_abandoned_claim(&db.server_id().await.to_string())
        .await;

    let config = db.config_as(user, "pw");
    let w = Worker::start(&config, "1");
    w.wait_log("lacks the PROCESS privilege", 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        w.log_text().matches("lacks the PROCESS privilege").count(),
        1,
        "logged once, not every interval"
    );
    assert_eq!(db.count("status = 'claimed'").await, 1, "nothing was reset");

    // Granted PROCESS, the same reaper puts the abandoned claim back: the refusal was the
    // privilege, not the claim.
    conn.query_drop(format!("GRANT PROCESS ON *.* TO '{user}'@'%'"))
        .await
        .unwrap();
    db.wait_count("status = 'pending' OR status = 'done'", 1, 20)
        .await;
    drop(w);
    conn.query_drop(format!("DROP USER '{user}'@'%'"))
        .await
        .unwrap();
}

/// PROCESS granted through a role that is the account's default role counts: the reaper
/// puts back an abandoned claim and never says it lacks the privilege. The statement that
/// makes a role the default differs: MySQL says `TO`, MariaDB `FOR`.
#[tokio::test(flavor = "multi_thread")]
async fn process_through_a_default_role_is_recognised() {
    let db = TestDb::new("process_role").await;
    let (user, role) = ("myjob_t_role_user", "myjob_t_reaper_role");
    let mut conn = db.conn().await;
    let default_role = if db.is_mariadb().await {
        format!("SET DEFAULT ROLE {role} FOR '{user}'@'%'")
    } else {
        format!("SET DEFAULT ROLE {role} TO '{user}'@'%'")
    };
    for sql in [
        format!("DROP USER IF EXISTS '{user}'@'%'"),
        format!("DROP ROLE IF EXISTS {role}"),
        format!("CREATE ROLE {role}"),
        format!("GRANT PROCESS ON *.* TO {role}"),
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {}.* TO '{user}'@'%'",
            db.name
        ),
        format!("GRANT {role} TO '{user}'@'%'"),
        default_role,
    ] {
        conn.query_drop(&sql).await.unwrap();
    }
    let id = db
        .insert_abandoned_claim(&db.server_id().await.to_string())
        .await;

    let config = db.config_as(user, "pw");
    let w = Worker::start(&config, "1");
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
    assert!(w.log_text().contains("reaper: stale claim put back"));
    assert!(!w.log_text().contains("PROCESS"), "{}", w.log_text());
    drop(w);
    conn.query_drop(format!("DROP USER '{user}'@'%'"))
        .await
        .unwrap();
    conn.query_drop(format!("DROP ROLE {role}")).await.unwrap();
}

/// The reaper's rescue waits for a row another session holds, past `lock_wait_timeout`: the
/// timeout is logged and the rescue tried again at a later pass on the same connection, so
/// the reaper keeps the time it has been connected; the job comes back once the lock is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_wait_in_the_reaper_keeps_its_connection() {
    let db = TestDb::new("reaper_lock_wait").await;
    let config = db.config_with_lock_wait("", "1s");

    // A stale claim of a connection that is gone, made through this server.
    let id = db
        .insert_abandoned_claim(&db.server_id().await.to_string())
        .await;
    let mut locker = db.lock_job(id).await;

    let worker = Worker::start(&config, "1");
    worker.wait_log("trying again at the next pass", 20).await;
    assert_eq!(db.job(id).await.0, "claimed");
    locker.query_drop("COMMIT").await.unwrap();

    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
    let log = worker.log_text();
    assert!(log.contains("Lock wait timeout exceeded"), "{log}");
    assert!(log.contains("reaper: stale claim put back"), "{log}");
    assert!(!log.contains("reconnecting"), "{log}");
}

/// `kill -9` of an instance that is started again at once, as systemd restarts it: its start
/// puts back the claims of its previous run, long before `stale_after` (10 minutes here), and
/// they run again. Another instance's claims are left alone, and so are those of a live twin
/// started by mistake with the same instance name (their connections are alive).
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_instance_puts_back_its_previous_runs_claims_at_once() {
    let db = TestDb::new("restart_heal").await;
    let base = db.config("concurrency = 2", "");
    let config = db.path("heal.toml");
    edited(
        &base,
        &config,
        &[("stale_after = \"2s\"", "stale_after = \"10m\"")],
    );
    let log = db.path("instance-1.log");
    let mut first = Worker::start_appending(&config, "1", &log);
    let other = Worker::start(&config, "2");
    let ids = db.insert("q", &["sleep:60"; 4]).await;
    db.wait_count("status = 'claimed'", 4, 20).await;
    let claims = |db: &TestDb| {
        let db_url = db.url.clone();
        async move {
            let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&db_url).unwrap())
                .await
                .unwrap();
            let rows: Vec<(u64, u64, String)> = conn
                .query("SELECT id, batch_id, worker FROM myjob_jobs WHERE status = 'claimed' ORDER BY id")
                .await
                .unwrap();
            rows
        }
    };
    let before = claims(&db).await;
    let of = |rows: &[(u64, u64, String)], instance: &str| -> Vec<(u64, u64)> {
        rows.iter()
            .filter(|r| r.2.ends_with(&format!(":{instance}")))
            .map(|r| (r.0, r.1))
            .collect()
    };
    assert_eq!(of(&before, "1").len(), 2, "{before:?}");

    first.signal(Signal::SIGKILL);
    first.wait(10);
    let killed_at = std::time::Instant::now();
    let second = Worker::start_appending(&config, "1", &log);
    // The previous run's two jobs run again: two more runs by instance 1, each as attempt 1
    // (a rescued attempt is given back).
    let start = std::time::Instant::now();
    while db.runs().iter().filter(|r| r.2 == "1").count() < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the previous run's jobs did not run again within 10 s:\n{}",
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("running again {:?} after the kill", killed_at.elapsed());
    second
        .wait_log("its instance restarted, and its connection", 5)
        .await;
    let after = claims(&db).await;
    assert_eq!(
        of(&after, "2"),
        of(&before, "2"),
        "instance 2's claims were touched"
    );
    assert_eq!(db.count("suspicion = 1 AND rescues = 0").await, 2);

    // A twin with the same instance name: its start finds instance 1's claims alive.
    let twin = Worker::start(&config, "1");
    twin.wait_log("ready", 20).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = claims(&db).await;
    assert_eq!(now, after, "a live instance's claims were touched");
    assert_eq!(db.count("suspicion = 1 AND rescues = 0").await, 2);
    assert!(ids.iter().all(|id| now.iter().any(|c| c.0 == *id)));
    drop((other, twin, second));
}

/// A thousand claims of queue `other` (which the tests' instance does not serve), made an
/// hour ago by a connection that stays open: live claims the reaper must leave alone.
struct LiveClaims {
    holder: mysql_async::Conn,
    conn_id: u64,
}

impl LiveClaims {
    async fn insert(db: &TestDb, server: &str) -> LiveClaims {
        let mut holder = db.conn().await;
        let conn_id: u64 = holder
            .query_first("SELECT CONNECTION_ID()")
            .await
            .unwrap()
            .unwrap();
        db.insert_rows(
            "(queue, payload, status, attempts, batch_id, owner_conn, owner_server, claimed_at)",
            &format!(
                "('other', 'x', 'claimed', 1, 7, {conn_id}, '{server}', NOW(6) - INTERVAL 1 HOUR)"
            ),
            1000,
        )
        .await;
        LiveClaims { holder, conn_id }
    }

    /// Asserts that every one of them is still claimed by its live connection, which is still
    /// open.
    async fn untouched(mut self, db: &TestDb) {
        assert_eq!(
            db.count(&format!(
                "status = 'claimed' AND batch_id = 7 AND owner_conn = {}",
                self.conn_id
            ))
            .await,
            1000,
            "a live claim was touched"
        );
        self.holder.query_drop("DO 1").await.unwrap();
    }
}

/// A thousand long jobs claimed an hour ago by a live connection, and one claim of a dead
/// one made since: the reaper pages through every old claim, not only the oldest thousand.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_claim_behind_a_thousand_older_live_ones_is_put_back() {
    let db = TestDb::new("reaper_pages").await;
    let config = db.config("concurrency = 1", "");
    let server = db.server_id().await.to_string();
    let live = LiveClaims::insert(&db, &server).await;
    let dead = db
        .insert_sql(&format!(
            "INSERT INTO myjob_jobs (queue, payload, status, attempts, batch_id, owner_conn, \
                 owner_server, claimed_at) \
             VALUES ('q', 'ok', 'claimed', 1, 8, 999999999, '{server}', NOW(6) - INTERVAL 1 MINUTE)"
        ))
        .await;

    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {dead} AND status = 'done'"), 1, 20)
        .await;
    assert!(worker
        .log_text()
        .contains("reaper: stale claim put back: its claimer's connection 999999999 is gone"));
    live.untouched(&db).await;
}

/// The reaper pages through claimed jobs in the claim index's order, priority descending:
/// a dead claim of a lower priority than a thousand live ones of its queue is on the second
/// page, and is put back.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_claim_of_a_lower_priority_behind_a_thousand_live_ones_is_put_back() {
    let db = TestDb::new("reaper_priority_pages").await;
    let config = db.config("concurrency = 1", "");
    let server = db.server_id().await.to_string();
    let live = LiveClaims::insert(&db, &server).await;
    db.conn()
        .await
        .query_drop("UPDATE myjob_jobs SET priority = id % 3")
        .await
        .unwrap();
    let dead = db
        .insert_sql(&format!(
            "INSERT INTO myjob_jobs (queue, payload, priority, status, attempts, batch_id, \
                 owner_conn, owner_server, claimed_at) \
             VALUES ('other', 'x', -5, 'claimed', 1, 8, 999999999, '{server}', \
                 NOW(6) - INTERVAL 1 MINUTE)"
        ))
        .await;

    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {dead} AND status = 'pending'"), 1, 20)
        .await;
    // The reaper says so once its put-back has committed: a moment after the row shows it.
    worker
        .wait_log(
            "reaper: stale claim put back: its claimer's connection 999999999 is gone",
            5,
        )
        .await;
    live.untouched(&db).await;
}

/// The queue column is binary: a claim of a queue whose name is not UTF-8 (an UPDATE of the
/// user's) is put back like any other, and its line names the queue as best it can.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_claim_of_a_queue_named_in_bytes_that_are_not_utf8_is_put_back() {
    let db = TestDb::new("reaper_bytes").await;
    let config = db.config("", "");
    let server = db.server_id().await.to_string();
    let dead = db
        .insert_sql(&format!(
            "INSERT INTO myjob_jobs (queue, payload, status, attempts, batch_id, owner_conn, \
                 owner_server, claimed_at) \
             VALUES (X'FF71', 'x', 'claimed', 1, 8, 999999999, '{server}', NOW(6) - INTERVAL 1 MINUTE)"
        ))
        .await;
    let mut worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {dead} AND status = 'pending'"), 1, 20)
        .await;
    worker
        .wait_log(&format!("job_id={dead} attempt=1"), 5)
        .await;
    assert!(!worker.exited(), "{}", worker.log_text());
    let log = worker.log_text();
    assert!(
        log.lines().any(|l| l
            .contains("reaper: stale claim put back: its claimer's connection 999999999 is gone")
            && l.ends_with(&format!("job_id={dead} attempt=1"))),
        "{log}"
    );
}

/// Claims made before migrations 17 and 18 (the cancels index added, the reaper's index of
/// claims by time dropped) are judged after them: a dead claim is put back and run, and a job
/// cancelled while its now dead worker ran it gives its claim up; the jobs waiting behind
/// them run.
#[tokio::test(flavor = "multi_thread")]
async fn claims_made_before_migrations_17_and_18_are_judged_after_them() {
    let db = TestDb::new("reaper_migration_18").await;
    let config = db.config("", "");
    let c = config.to_str().unwrap();
    let server = db.server_id().await.to_string();
    let mut conn = db.conn().await;
    // The table as migration 16 left it.
    conn.query_drop(
        "ALTER TABLE myjob_jobs DROP INDEX myjob_jobs_cancels, DROP COLUMN cancel_owner, \
             ADD KEY myjob_jobs_stale (status, claimed_at)",
    )
    .await
    .unwrap();
    conn.query_drop("DELETE FROM myjob_schema_migrations WHERE version IN (17, 18)")
        .await
        .unwrap();
    let dead = db.insert_abandoned_claim(&server).await;
    let cancelled = db
        .insert_sql(&format!(
            "INSERT INTO myjob_jobs (queue, payload, status, attempts, batch_id, owner_conn, \
                 owner_server, claimed_at, finished_at) \
             VALUES ('q', 'x', 'cancelled', 1, 43, 999999999, '{server}', \
                 NOW(6) - INTERVAL 1 HOUR, NOW(6))"
        ))
        .await;
    db.insert("q", &["a"; 20]).await;

    let out = common::myjob(&["--config", c, "migrate"], b"");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("applied migrations: [17, 18]"),
        "{out:?}"
    );
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 21, 30).await;
    db.wait_count(
        &format!("id = {cancelled} AND owner_conn IS NULL AND claimed_at IS NULL"),
        1,
        20,
    )
    .await;
    assert_eq!(db.job(dead).await.0, "done");
    assert!(worker
        .log_text()
        .contains("reaper: stale claim put back: its claimer's connection 999999999 is gone"));
}
