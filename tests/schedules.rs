//! Recurring jobs: each tick of a `[[schedule]]` enqueued exactly once however many
//! instances serve the config (each through another node of a cluster), through a kill -9
//! of the instance that enqueued the last tick; the catch-up after every instance was down
//! for five ticks, for each policy; and bad schedules refused by check-config.

use std::time::Duration;

use crate::common;
use crate::common::{edited, TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

/// A config of the test queue `q` and a schedule `tick` putting a job into it every second,
/// with `extra` in the schedule.
fn config(db: &TestDb, extra: &str) -> std::path::PathBuf {
    db.config(
        "concurrency = 4",
        &format!(
            "\n[[schedule]]\nname = \"tick\"\nqueue = \"q\"\npayload = \"x\"\nevery = \"1s\"\n{extra}"
        ),
    )
}

async fn ticks(db: &TestDb) -> Vec<(i64, Option<u64>)> {
    common::ticks::rows(db, "tick").await
}

async fn assert_each_tick_once(db: &TestDb) -> Vec<i64> {
    common::ticks::assert_each_once(db, "tick", 1, "q").await
}

/// Three instances (one per node of a cluster) with `every = "1s"` for 20 s: 20 ± 1 ticks,
/// each enqueued once; then a kill -9 of the instance that enqueued the latest tick, and the
/// others go on, still once per tick.
#[tokio::test(flavor = "multi_thread")]
async fn each_tick_is_enqueued_once_by_three_instances_and_after_a_kill() {
    let db = TestDb::new("schedule_once").await;
    let config = config(&db, "");
    let mut workers = Vec::new();
    for i in 0..3 {
        let own = db.path(&format!("myjob{i}.toml"));
        edited(&config, &own, &[(&db.url, &db.node_url(i))]);
        workers.push(Worker::start(&own, &format!("s{i}")));
    }
    db.wait_at_least("queue = 'q'", 1, 30).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let seconds = assert_each_tick_once(&db).await;
    let span = seconds.len();
    eprintln!("{span} ticks in 20 s");
    assert!((19..=22).contains(&span), "{span} ticks in 20 s");

    // The instance that enqueued the latest tick, by its log.
    let latest = seconds.last().copied().unwrap();
    let job = ticks(&db).await.last().unwrap().1.unwrap();
    let enqueued = |w: &Worker| w.log_text().contains(&format!("job_id={job} "));
    let i = workers
        .iter()
        .position(enqueued)
        .unwrap_or_else(|| panic!("no instance says it enqueued job {job} (tick {latest})"));
    workers[i].signal(Signal::SIGKILL);
    workers[i].wait(10);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = assert_each_tick_once(&db).await;
    let more = after.len() - span;
    eprintln!("{more} ticks in the 5 s after the kill -9 of s{i}");
    assert!(
        (4..=7).contains(&more),
        "{more} ticks in 5 s after the kill"
    );

    // `myjob schedules` says which tick it is on, its job, and the next tick.
    drop(workers);
    let last = ticks(&db).await.last().copied().unwrap();
    let out = common::myjob(
        &["--config", config.to_str().unwrap(), "schedules", "--json"],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &doc["schedules"][0];
    assert_eq!(s["name"], "tick");
    assert_eq!(s["when"], "every 1s");
    assert_eq!(s["last_job_id"].as_u64(), last.1);
    assert!(
        s["next_tick"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{s}"
    );

    // The ticks' jobs are ordinary jobs: run by the queue's handler, and in `myjob list`.
    let first = ticks(&db).await[0].1.unwrap();
    assert_eq!(db.job(first).await.0, "done");
    let out = common::myjob(
        &[
            "--config",
            config.to_str().unwrap(),
            "list",
            "--queue",
            "q",
            "--status",
            "done",
            "--limit",
            "1000",
            "--json",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"].as_u64() == Some(first)),
        "{doc}"
    );
}

/// Every instance down for about five ticks, then up again: `none` enqueues none of the
/// missed ticks, `latest` (the default) the latest of them, `all` every one: the instance's
/// first pass says how many were missed and how many it enqueues, and exactly the others
/// are absent from the ticks' rows.
#[tokio::test(flavor = "multi_thread")]
async fn missed_ticks_are_caught_up_as_the_schedule_says() {
    for policy in ["none", "latest", "all"] {
        let db = TestDb::new(&format!("schedule_catch_{policy}")).await;
        let config = config(&db, &format!("catch_up = \"{policy}\"\n"));
        let mut w = Worker::start(&config, "1");
        db.wait_at_least("queue = 'q'", 2, 30).await;
        w.signal(Signal::SIGTERM);
        w.wait(20);
        tokio::time::sleep(Duration::from_millis(5500)).await;
        let restarted = db_now(&db).await.floor() as i64;
        let w = Worker::start_appending(&config, "1", &db.path("second.log"));
        w.wait_log(" enqueues=", 30).await;
        // The first pass's line, whole (its fields end it): a read may catch a line half
        // written.
        let mut line = String::new();
        for _ in 0..100 {
            let text = w.log_text();
            if let Some(l) = text.split_inclusive('\n').find(|l| l.contains(" missed=")) {
                if l.ends_with('\n') {
                    line = l.to_owned();
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let field = |name: &str| -> usize {
            let at = line.find(&format!(" {name}=")).unwrap() + name.len() + 2;
            let digits: String = line[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap()
        };
        let (missed, enqueues) = (field("missed"), field("enqueues"));
        // The first pass (missed ticks, then the current one, oldest first) is over once a
        // tick 2 s after the restart is in.
        db.wait_at_least(
            &format!(
                "queue = 'q' AND run_at >= '1970-01-01' + INTERVAL {} SECOND",
                restarted + 2
            ),
            1,
            30,
        )
        .await;
        let seconds: Vec<i64> = ticks(&db).await.into_iter().map(|t| t.0).collect();
        let span = (seconds.last().unwrap() - seconds[0] + 1) as usize;
        let absent = span - seconds.len();
        eprintln!("{policy}: {missed} missed, {enqueues} caught up, {absent} absent: {seconds:?}");
        assert!(missed >= 4, "{policy}: {missed} missed");
        let expected = match policy {
            "none" => 0,
            "latest" => 1,
            _ => missed,
        };
        assert_eq!(enqueues, expected, "{policy}: the catch-up enqueues");
        assert_eq!(
            absent,
            missed - enqueues,
            "{policy}: ticks absent: {seconds:?}"
        );
        if policy == "all" {
            assert_each_tick_once(&db).await;
        }
    }
}

/// A daily schedule whose latest tick is three days old (every instance down since): with
/// `catch_up = "all"`, both missed ticks, a day and two days old, and today's are enqueued,
/// however old; the pass then prunes the rows enqueued over a day ago, but not those it
/// just wrote for old ticks (another instance's pass may be about to catch them up too).
#[tokio::test(flavor = "multi_thread")]
async fn missed_ticks_a_day_old_are_caught_up_and_their_rows_kept() {
    let db = TestDb::new("schedule_days").await;
    let config = db.config(
        "concurrency = 1",
        "\n[[schedule]]\nname = \"daily\"\nqueue = \"q\"\nevery = \"1d\"\ncatch_up = \"all\"\n",
    );
    let day = 86_400;
    // Clear of midnight UTC: today's tick neither on time nor still to come.
    let into_day = db_now(&db).await.floor() as i64 % day;
    if !(15..day - 300).contains(&into_day) {
        tokio::time::sleep(Duration::from_secs(
            ((day + 15 - into_day) % day + 1) as u64,
        ))
        .await;
    }
    let today = db_now(&db).await.floor() as i64 / day * day;
    let mut conn = db.conn().await;
    conn.query_drop("SET time_zone = '+00:00'").await.unwrap();
    // Ticks of 4 and 3 days ago, enqueued then.
    for days in [4, 3] {
        conn.exec_drop(
            "INSERT INTO myjob_schedule_ticks (schedule, tick, definition, enqueued_at) \
             VALUES ('daily', '1970-01-01' + INTERVAL ? SECOND, 'every 1day', \
                     '1970-01-01' + INTERVAL ? SECOND)",
            (today - days * day, today - days * day + 1),
        )
        .await
        .unwrap();
    }
    let w = Worker::start(&config, "1");
    w.wait_log(" enqueues=", 30).await;
    db.wait_at_least("queue = 'q'", 3, 30).await;
    let due: Vec<i64> = conn
        .query(
            "SELECT TIMESTAMPDIFF(SECOND, '1970-01-01', run_at) FROM myjob_jobs \
             WHERE queue = 'q' ORDER BY run_at",
        )
        .await
        .unwrap();
    let expected = [today - 2 * day, today - day, today];
    assert_eq!(due, expected, "{}", w.log_text());
    assert!(
        w.log_text().contains("missed=3 enqueues=3"),
        "{}",
        w.log_text()
    );
    // The first pass prunes once its ticks are in: the rows enqueued days ago go, those it
    // wrote stay.
    let mut rows = Vec::new();
    for _ in 0..300 {
        rows = common::ticks::rows(&db, "daily").await;
        if rows.len() <= expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: Vec<i64> = rows.into_iter().map(|t| t.0).collect();
    assert_eq!(rows, expected, "the rows kept");
}

/// A tick's row held by a transaction that never commits (an instance frozen mid-way, then
/// killed) holds the instance's pass back for 4 s, its lock waits failing each second: then
/// the held tick and every tick since are enqueued, each once, late, though the schedule's
/// catch-up is "none": they came while an instance ran, and are not missed ticks.
#[tokio::test(flavor = "multi_thread")]
async fn ticks_held_back_by_a_frozen_transaction_are_enqueued_late_not_skipped() {
    let db = TestDb::new("schedule_held").await;
    let config = config(&db, "catch_up = \"none\"\n");
    let url_line = format!("url = \"{}\"", db.url);
    let with_wait = format!("{url_line}\nlock_wait_timeout = \"1s\"");
    edited(&config, &config, &[(url_line.as_str(), with_wait.as_str())]);
    let _w = Worker::start(&config, "1");
    db.wait_at_least("queue = 'q'", 2, 30).await;
    // The tick after next, taken first by a transaction of the test's.
    let held = db_now(&db).await.floor() as i64 + 2;
    let mut frozen = db.conn().await;
    frozen.query_drop("BEGIN").await.unwrap();
    frozen
        .exec_drop(
            "INSERT INTO myjob_schedule_ticks (schedule, tick, definition) \
             VALUES ('tick', '1970-01-01' + INTERVAL ? SECOND, 'every 1s')",
            (held,),
        )
        .await
        .unwrap();
    while db_now(&db).await < held as f64 + 4.0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    frozen.query_drop("ROLLBACK").await.unwrap();
    drop(frozen);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seconds = assert_each_tick_once(&db).await;
    assert!(
        seconds.contains(&held),
        "the held tick {held} was skipped: {seconds:?}"
    );
    assert!(
        seconds.last().is_some_and(|t| *t >= held + 5),
        "no tick after the held one: {seconds:?}"
    );
}

/// A server with `explicit_defaults_for_timestamp` off gives the first TIMESTAMP column of a
/// table, the tick, `ON UPDATE CURRENT_TIMESTAMP`: as if it had, with two instances, each
/// tick is still enqueued once, at its own instant (no statement updates a tick's row).
#[tokio::test(flavor = "multi_thread")]
async fn a_tick_column_that_updates_itself_changes_nothing() {
    let db = TestDb::new("schedule_on_update").await;
    sql(
        &db,
        "ALTER TABLE myjob_schedule_ticks MODIFY tick TIMESTAMP(6) NOT NULL \
         DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)",
    )
    .await;
    let config = config(&db, "");
    let _a = Worker::start(&config, "a");
    let _b = Worker::start(&config, "b");
    db.wait_at_least("queue = 'q'", 5, 30).await;
    let seconds = assert_each_tick_once(&db).await;
    let mut conn = db.conn().await;
    let off: u64 = conn
        .query_first("SELECT COUNT(*) FROM myjob_schedule_ticks WHERE MICROSECOND(tick) <> 0")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(off, 0, "a tick moved off its second: {seconds:?}");
}

/// A schedule whose jobs the server refuses, first in the file: a trigger of the user's
/// SIGNALs a SQLSTATE of no class myjob knows, so only a ping tells that the server still
/// answers. It is said once in the log and passed over; the schedule after it goes on, each
/// tick once, on the same connection.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_schedule_is_said_once_and_the_others_go_on() {
    let db = TestDb::new("schedule_refused").await;
    sql(
        &db,
        "CREATE TRIGGER refuse_bad BEFORE INSERT ON myjob_jobs FOR EACH ROW \
         IF NEW.queue = 'bad' THEN \
           SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = 'no bad jobs'; \
         END IF",
    )
    .await;
    let config = db.config(
        "concurrency = 4",
        "\n[[schedule]]\nname = \"bad\"\nqueue = \"bad\"\nevery = \"1s\"\n\
         \n[[schedule]]\nname = \"tick\"\nqueue = \"q\"\npayload = \"x\"\nevery = \"1s\"\n",
    );
    let w = Worker::start(&config, "1");
    db.wait_at_least("queue = 'q'", 5, 30).await;
    assert_each_tick_once(&db).await;
    let log = w.log_text();
    assert_eq!(log.matches("scheduler: schedule bad: ").count(), 1, "{log}");
    assert!(log.contains("no bad jobs"), "{log}");
    assert!(!log.contains("trying again"), "{log}");
    assert!(common::ticks::rows(&db, "bad").await.is_empty());

    // The trigger gone, the ticks that waited go in, late, each once, from the first.
    let first = ticks(&db).await[0].0;
    sql(&db, "DROP TRIGGER refuse_bad").await;
    db.wait_at_least("queue = 'bad'", 8, 10).await;
    let bad = common::ticks::assert_each_once(&db, "bad", 1, "bad").await;
    assert!(
        bad[0] <= first,
        "the waiting ticks were dropped: {bad:?} (tick from {first})"
    );
}

/// The server turns read-only for the schedule's jobs for 3 s (a trigger raising MySQL's
/// read-only error, 1290, as a demoted primary would): the scheduler says so once,
/// connects again until the writes go in, and then enqueues every tick that came meanwhile,
/// late, though the catch-up is "none".
#[tokio::test(flavor = "multi_thread")]
async fn ticks_wait_out_a_read_only_server() {
    let db = TestDb::new("schedule_read_only").await;
    let config = config(&db, "catch_up = \"none\"\n");
    let w = Worker::start(&config, "1");
    db.wait_at_least("queue = 'q'", 2, 30).await;
    sql(
        &db,
        "CREATE TRIGGER read_only BEFORE INSERT ON myjob_jobs FOR EACH ROW \
         SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1290, \
           MESSAGE_TEXT = 'The MySQL server is running with the --read-only option'",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    sql(&db, "DROP TRIGGER read_only").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seconds = assert_each_tick_once(&db).await;
    assert!(seconds.len() >= 7, "{seconds:?}");
    let log = w.log_text();
    assert_eq!(log.matches("the server is read-only").count(), 1, "{log}");
}

/// SIGHUP removes, adds and changes schedules. `tick` (every second) is removed and `tock`
/// (every 5 s, catch-up "all", into a queue the instance does not serve) added by one
/// reload: `tick` enqueues nothing more, and the instance warns of the queue. Then `tock` is
/// changed to every second, 4 s after its latest tick: the new definition starts with its
/// current tick, and the ticks of the new period before the reload are not taken for missed
/// ones (none is enqueued late).
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_removes_adds_and_changes_schedules() {
    let db = TestDb::new("schedule_reload").await;
    let schedule = |name: &str, queue: &str, every: &str| {
        format!(
            "\n[[schedule]]\nname = \"{name}\"\nqueue = \"{queue}\"\nevery = \"{every}\"\ncatch_up = \"all\"\n"
        )
    };
    let config = db.config("concurrency = 4", &schedule("tick", "q", "1s"));
    let w = Worker::start(&config, "1");
    db.wait_at_least("queue = 'q'", 3, 30).await;
    let reloaded = |n: usize| {
        let w = &w;
        async move {
            let start = std::time::Instant::now();
            while w.log_text().matches("new configuration in use").count() < n {
                assert!(start.elapsed() < Duration::from_secs(10), "no reload");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    db.config("concurrency = 4", &schedule("tock", "q2", "5s"));
    w.signal(Signal::SIGHUP);
    reloaded(1).await;
    // The tick it starts with (the current one, if it came less than 5 s ago), then the next.
    db.wait_at_least("queue = 'q2'", 2, 15).await;
    let ticks_then = common::ticks::assert_each_once(&db, "tick", 1, "q").await;
    w.wait_log(
        "enqueues into queue q2, which this instance does not serve",
        5,
    )
    .await;

    // 4 s after tock's latest tick, it ticks every second.
    let latest = common::ticks::rows(&db, "tock").await.last().unwrap().0;
    while db_now(&db).await < latest as f64 + 4.2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = db_now(&db).await;
    db.config("concurrency = 4", &schedule("tock", "q2", "1s"));
    w.signal(Signal::SIGHUP);
    reloaded(2).await;
    tokio::time::sleep(Duration::from_secs(4)).await;

    assert_eq!(
        common::ticks::rows(&db, "tick").await.len(),
        ticks_then.len(),
        "a removed schedule enqueued more"
    );
    let mut conn = db.conn().await;
    let new: Vec<(i64, i64)> = conn
        .query(
            "SELECT TIMESTAMPDIFF(SECOND, '1970-01-01', tick), \
                    TIMESTAMPDIFF(MICROSECOND, tick, enqueued_at) \
             FROM myjob_schedule_ticks WHERE schedule = 'tock' AND definition = 'every 1s' \
             ORDER BY tick",
        )
        .await
        .unwrap();
    eprintln!("reload sent at {sent:.3}; tock every 1s: (tick, late µs) {new:?}");
    assert!(new.len() >= 3, "the changed schedule did not tick: {new:?}");
    assert!(
        new[0].0 as f64 > sent - 1.0,
        "a tick of the new period before the reload: {new:?}"
    );
    assert!(
        new.iter().all(|(_, late)| *late < 1_500_000),
        "the new period's earlier ticks were caught up: {new:?}"
    );
    let seconds: Vec<i64> = new.iter().map(|t| t.0).collect();
    assert!(seconds.windows(2).all(|p| p[1] - p[0] == 1), "{seconds:?}");
}

/// Runs `statement` on the test's database.
async fn sql(db: &TestDb, statement: &str) {
    db.conn().await.query_drop(statement).await.unwrap();
}

/// The database's clock, in seconds since the epoch.
async fn db_now(db: &TestDb) -> f64 {
    let mut conn = db.conn().await;
    myjob::store::schedules::now_us(&mut conn).await.unwrap() as f64 / 1e6
}

/// Bad schedules are refused by check-config with exit 78 and a line naming the key.
#[test]
fn check_config_names_the_bad_schedule_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("myjob.toml");
    for (schedule, key, says) in [
        (
            "cron = \"61 * * * *\"",
            "schedule[0].cron",
            "is not a cron expression",
        ),
        (
            "cron = \"@daily\"\ntimezone = \"Europe/Atlantis\"",
            "schedule[0].timezone",
            "is not an IANA time zone name",
        ),
        (
            "every = \"5m\"\ncron = \"@daily\"",
            "schedule[0].every",
            "not both",
        ),
        ("", "schedule[0].cron", "give cron or every"),
        (
            "every = \"5m\"\ncatch_up = \"sometimes\"",
            "schedule[0].catch_up",
            "is not one of",
        ),
    ] {
        std::fs::write(
            &path,
            format!(
                "[database]\nurl = \"mysql://u@127.0.0.1/d\"\n[[queue]]\nname = \"q\"\ncommand = [\"/bin/true\"]\n\
                 [[schedule]]\nname = \"s\"\nqueue = \"q\"\n{schedule}\n"
            ),
        )
        .unwrap();
        let out = common::myjob(&["--config", path.to_str().unwrap(), "check-config"], b"");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{schedule}: {err}");
        assert!(err.contains(key) && err.contains(says), "{schedule}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
