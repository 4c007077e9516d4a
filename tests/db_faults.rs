//! The database going away, with a real server: down when an instance starts, gone while
//! handlers run (the outcome is held and written later, or fenced when the claim was reaped
//! meanwhile), and a server `wait_timeout` shorter than a handler.
//!
//! The outages are made by a TCP proxy between the instance and the server (see
//! `common::proxy`), so the server keeps running for the other tests.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::proxy::{Fault, Proxy};
use crate::common::{edited, NotifySocket, TestDb, Worker};
use mysql_async::prelude::*;

/// The test's config, with the database reached through `proxy`.
fn config_through(
    db: &TestDb,
    proxy: &Proxy,
    name: &str,
    edits: &[(&str, &str)],
) -> std::path::PathBuf {
    let base = db.config("concurrency = 2", "");
    let path = db.path(name);
    let url_line = format!("url = \"{}\"", db.url);
    let proxied = format!("url = \"{}\"", proxy.url(db));
    let mut all = vec![(url_line.as_str(), proxied.as_str())];
    all.extend_from_slice(edits);
    edited(&base, &path, &all);
    path
}

fn count_lines(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn down_at_start_it_retries_with_backoff_and_is_ready_only_once_connected() {
    let db = TestDb::new("down_at_start").await;
    let proxy = Proxy::new();
    let config = config_through(&db, &proxy, "proxied.toml", &[]);
    let notify = NotifySocket::new(&db);
    let worker = Worker::start_with_env(
        &config,
        "1",
        &[("NOTIFY_SOCKET", notify.path.to_str().unwrap())],
    );

    // Nothing listens: one line per attempt, spaced out by the backoff (0.2 s, 0.4 s, 0.8 s,
    // 1.6 s …), and no READY=1.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = worker.log_text();
    let attempts = count_lines(&log, "startup: database mysql://");
    assert!(
        (3..=6).contains(&attempts),
        "{attempts} connection attempts in 4 s:\n{log}"
    );
    assert!(log.contains("attempt=1 "), "{log}");
    assert!(!notify.ready(), "READY=1 before the database answered");

    // The database comes: READY=1 follows, and jobs run.
    proxy.up().await;
    let start = Instant::now();
    while !notify.ready() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no READY=1 after the database came back:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // READY=1 follows the consumer's own connection, not only the startup check's.
    let log = worker.log_text();
    let connected = log
        .find("consumer: connected")
        .expect("the consumer connected");
    let ready = log.find("INFO ready").expect("ready is logged");
    assert!(
        connected < ready,
        "ready before the consumer connected:\n{log}"
    );
    let id = db.insert("q", &["x"]).await[0];
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 20)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn away_mid_batch_the_outcome_is_held_and_written_when_it_is_back() {
    let db = TestDb::new("away_mid_batch").await;
    let proxy = Proxy::new();
    proxy.up().await;
    // The reaper looks every 5 s: an instance that lost its connection has that long (two
    // passes) to come back and re-own its claims.
    let config = config_through(
        &db,
        &proxy,
        "proxied.toml",
        &[("interval = \"500ms\"", "interval = \"5s\"")],
    );
    let worker = Worker::start(&config, "1");
    let id = db.insert("q", &["sleep:3"]).await[0];
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 20)
        .await;
    let (_, _, batch, _, _) = db.job(id).await;
    while db.runs().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The database goes away while the handler runs, and stays away after it finished.
    proxy.down();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = worker.log_text();
    assert!(log.contains(&format!("job done job_id={id}")), "{log}");
    assert!(log.contains("consumer: database mysql://"), "{log}");
    let (status, ..) = db.job(id).await;
    assert_eq!(
        status, "claimed",
        "the outcome was written while the database was away?"
    );

    // Back: the instance reconnects, re-owns the claim and writes the held outcome.
    proxy.up().await;
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
    let (_, attempts, done_batch, _, _) = db.job(id).await;
    assert_eq!((attempts, done_batch), (1, batch));
    assert_eq!(db.runs().len(), 1, "the job ran again");
    worker
        .wait_log("consumer: connected; adopted the claims of running jobs", 5)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_reaped_while_the_database_was_away_keeps_the_new_owners_outcome() {
    let db = TestDb::new("away_reaped").await;
    let proxy = Proxy::new();
    proxy.up().await;
    // Instance 1 ("a") serves its metrics, which count the attempt it loses.
    let (listen, port) = common::scrape::listen_for_instance_1();
    let config = config_through(&db, &proxy, "proxied.toml", &[("listen = \"\"", &listen)]);
    let direct = db.config("concurrency = 2", "");

    // Instance a claims the job through the proxy; its run fails after 3 s.
    let a = Worker::start(&config, "1");
    let id = db.insert("q", &["fail-on:1:3"]).await[0];
    db.wait_count(&format!("id = {id} AND worker LIKE '%:1'"), 1, 20)
        .await;
    // Its handler has started: the claim has been read back (a database gone between the
    // claim and its read-back leaves the job unstarted, which is another test's case).
    let started = Instant::now();
    while !db.runs().iter().any(|r| r.0 == id) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the handler never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = Worker::start(&direct, "b");

    // a's database goes away. b's reaper sees a's connection gone, puts the job back, and b
    // runs it (and succeeds), all before a can write its failure.
    proxy.down();
    db.wait_count(
        &format!("id = {id} AND status = 'done' AND worker LIKE '%:b'"),
        1,
        30,
    )
    .await;
    a.wait_log("job failed, will retry: attempt 1 of 3: exit status 1", 10)
        .await;

    // a comes back: its late failure is fenced, and b's outcome is the one kept.
    proxy.up().await;
    a.wait_log(
        &format!("job outcome not written: its claim was reaped and the job was put back meanwhile job_id={id}"),
        30,
    )
    .await;
    let (status, _, _, worker, _) = db.job(id).await;
    assert_eq!(status, "done");
    assert!(worker.unwrap().ends_with(":b"));
    assert_eq!(db.count(&format!("id = {id} AND status = 'done'")).await, 1);
    assert!(b.log_text().contains("reaper: stale claim put back"));
    // Counted as lost once the write found the claim gone, not as the retry its handler
    // asked for.
    let finished = |outcome: &str| {
        common::scrape::metric(
            port,
            &format!(r#"myjob_jobs_finished_total{{queue="q",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(finished("lost"), Some(1.0));
    assert_eq!(finished("retried"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_wait_timeout_shorter_than_a_handler_does_not_cost_the_claim() {
    let db = TestDb::new("wait_timeout").await;
    // The instance's account gets wait_timeout = 5 s at each connect, from init_connect,
    // which the server runs for accounts without SUPER or CONNECTION_ADMIN: the README's
    // GRANTs. Not the global wait_timeout: the sessions of every other test then opened
    // would get it too, and a test that died before putting it back left it for every later
    // run. init_connect is global as well, but the IF leaves the other accounts' sessions as
    // they were (cast: MySQL takes no other type for the variable).
    let (user, password) = common::account(&db, "short_wait", |_| true).await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "SET GLOBAL init_connect = \
         'SET SESSION wait_timeout = \
          CAST(IF(LEFT(USER(), 17) = ''myjob_short_wait_'', 5, @@SESSION.wait_timeout) AS UNSIGNED)'",
    )
    .await
    .unwrap();
    let config = db.config("concurrency = 2", "");
    let as_user = db.url_as(&user, &password);
    edited(&config, &config, &[(db.url.as_str(), as_user.as_str())]);
    let worker = Worker::start(&config, "1");
    worker.wait_log("consumer: connected", 20).await;
    let mut probe = mysql_async::Conn::from_url(as_user.as_str()).await.unwrap();
    let probe_timeout: u64 = probe
        .query_first("SELECT @@SESSION.wait_timeout")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        probe_timeout, 5,
        "the server did not take the short wait_timeout"
    );

    // A 20 s handler: a claim connection left at the account's 5 s would be closed while it
    // waits (the instance sets its sessions' own wait_timeout, and pings), and the reaper
    // (stale_after 2 s) would take a claim whose connection died.
    let id = db.insert("q", &["sleep:20"]).await[0];
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 20)
        .await;
    let (_, _, batch, _, _) = db.job(id).await;
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 40)
        .await;
    let (_, attempts, done_batch, _, _) = db.job(id).await;
    assert_eq!((attempts, done_batch), (1, batch));
    assert_eq!(db.runs().len(), 1);
    let log = worker.log_text();
    assert!(!log.contains("reconnecting"), "{log}");
    assert!(!log.contains("stale claim put back"), "{log}");
    drop(worker);
    conn.query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await
        .unwrap();
}

/// Jobs claimed ahead wait behind a long job in the one slot when the database goes away, and
/// meanwhile their claims are put back (as the reaper does for a connection that is gone). At
/// the reconnect the instance drops them rather than start them: they run once, claimed anew.
#[tokio::test(flavor = "multi_thread")]
async fn prefetched_jobs_whose_claim_was_put_back_are_not_started() {
    let db = TestDb::new("away_prefetch").await;
    let proxy = Proxy::new();
    proxy.up().await;
    let config = config_through(
        &db,
        &proxy,
        "proxied.toml",
        &[("concurrency = 2", "concurrency = 1")],
    );
    std::fs::write(db.path("slow"), "").unwrap();

    // Quick jobs give the instance a completion rate, so that it claims ahead; then a long job
    // of a higher priority takes the slot, with quick ones claimed behind it.
    db.insert_rows("(queue, payload)", "('q', 'quick')", 2000)
        .await;
    let a = Worker::start(&config, "a");
    db.wait_at_least("status = 'done'", 1000, 60).await;
    let mut conn = db.conn().await;
    let slow = db
        .insert_sql(
            "INSERT INTO myjob_jobs (queue, payload, priority) VALUES ('q', 'slow-if-flag', 1)",
        )
        .await;
    // Once the long job runs and the outcomes before it are written, the quick jobs still
    // claimed are the ones waiting behind it.
    let start = Instant::now();
    while !db.runs().iter().any(|r| r.0 == slow) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the long job never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The outcomes before it are written within a few ms; the instance claims ahead again
    // within a second (its loop turns once a second while nothing finishes).
    let waiting = "status = 'claimed' AND payload = 'quick'";
    let start = Instant::now();
    let held: Vec<u64> = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let held: Vec<u64> = conn
            .query(format!(
                "SELECT id FROM myjob_jobs WHERE {waiting} ORDER BY id"
            ))
            .await
            .unwrap();
        if !held.is_empty() {
            break held;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "nothing was claimed behind the long job"
        );
    };
    let ran: Vec<u64> = db.runs().iter().map(|r| r.0).collect();
    assert!(
        held.iter().all(|id| !ran.contains(id)),
        "{held:?} waited, not ran"
    );

    // Away; their claims go back, as the reaper puts back those of a connection that is gone.
    proxy.down();
    db.conn()
        .await
        .query_drop(format!(
            "UPDATE myjob_jobs SET status = 'pending', batch_id = NULL, owner_conn = NULL, \
             owner_server = NULL, worker = NULL, claimed_at = NULL, attempts = attempts - 1 \
             WHERE id IN ({})",
            held.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .await
        .unwrap();
    proxy.up().await;
    for id in &held {
        a.wait_log(
            &format!("job dropped before its start: its claim was put back while the connection was away job_id={id}"),
            30,
        )
        .await;
    }
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count("status = 'done'", 2001, 60).await;
    let runs = db.runs();
    for id in &held {
        let n = runs.iter().filter(|r| r.0 == *id).count();
        assert_eq!(n, 1, "job {id} ran {n} times");
    }
}

/// A deploy: SIGTERM, and while the instance drains its last job, the claim connection drops
/// (a server `wait_timeout`, a proxy's idle timeout, a blip). The drain pings and re-owns its
/// claims as the main loop does, so another instance's reaper never takes the running job and
/// runs it a second time.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_lost_during_the_drain_is_re_owned_and_the_job_runs_once() {
    let db = TestDb::new("drain_ping").await;
    let base = db.config("concurrency = 1", "");
    let draining = db.path("draining.toml");
    edited(
        &base,
        &draining,
        &[("shutdown_timeout = \"5s\"", "shutdown_timeout = \"30s\"")],
    );
    // The other instance's reaper looks every 2 s, as a real one at a short interval would.
    let other = db.path("other.toml");
    edited(
        &base,
        &other,
        &[("interval = \"500ms\"", "interval = \"2s\"")],
    );

    let mut a = Worker::start(&draining, "a");
    a.wait_log("consumer: connected", 20).await;
    let id = db.insert("q", &["sleep:12"]).await[0];
    db.wait_count(&format!("id = {id} AND status = 'claimed'"), 1, 20)
        .await;
    let (_, _, batch, _, _) = db.job(id).await;
    let b = Worker::start(&other, "b");
    b.wait_log("consumer: connected", 20).await;
    // Older than stale_after (2 s): only a live connection keeps it from the reaper.
    tokio::time::sleep(Duration::from_secs(3)).await;

    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_log("draining", 10).await;
    let mut conn = db.conn().await;
    let owner: u64 = conn
        .exec_first("SELECT owner_conn FROM myjob_jobs WHERE id = ?", (id,))
        .await
        .unwrap()
        .unwrap();
    conn.query_drop(format!("KILL CONNECTION {owner}"))
        .await
        .unwrap();

    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
    assert_eq!(a.wait(20), Some(0), "{}", a.log_text());
    let (_, attempts, done_batch, worker, _) = db.job(id).await;
    assert_eq!((attempts, done_batch), (1, batch), "{}", b.log_text());
    assert!(worker.unwrap().ends_with(":a"));
    assert_eq!(db.runs().len(), 1, "{}", b.log_text());
    assert!(
        a.log_text().contains("adopted the claims of running jobs"),
        "{}",
        a.log_text()
    );
}

/// The connection breaks between a claim's UPDATE (committed) and the SELECT that reads the
/// batch back. The jobs are this instance's: it re-owns the batch on the new connection and
/// reads it there, so they run once, soon, and nothing counts as a death of their worker.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_whose_read_back_failed_is_read_after_the_reconnect() {
    let db = TestDb::new("unread_batch").await;
    let proxy = Proxy::new();
    proxy.up().await;
    // The read-back is the only statement with this text; the first one on any connection is
    // its prepare, so the cut happens after the claim committed.
    proxy.arm(Fault::Cut("status = 'claimed' ORDER BY priority DESC, id"));
    let config = config_through(&db, &proxy, "proxied.toml", &[]);
    let ids = db.insert("q", &["ok", "ok", "ok"]).await;
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 3, 20).await;
    assert!(proxy.fired(), "the read-back was never cut");
    let log = worker.log_text();
    assert!(log.contains("reading the claimed batch"), "{log}");
    assert!(!log.contains("stale claim put back"), "{log}");
    let runs: Vec<u64> = db.runs().iter().map(|r| r.0).collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    for id in ids {
        assert!(runs.contains(&id), "{id} never ran: {runs:?}");
    }
    assert_eq!(
        db.count("attempts = 1 AND suspicion = 0 AND last_error IS NULL")
            .await,
        3
    );
}

/// The connection breaks on the claim's UPDATE after the server ran it: the jobs are this
/// instance's claims, though it never learned so. They are read back after the reconnect and
/// run, rather than left claimed for the reaper, which would count them as a dead worker's.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_answer_was_lost_is_read_after_the_reconnect() {
    let db = TestDb::new("claim_answer_lost").await;
    let proxy = Proxy::new();
    proxy.up().await;
    // The queue's name travels only in the parameters of the probe, of the read of the
    // queue's first due job and of the claim: the third packet that holds it is the claim.
    proxy.arm(Fault::CutAfter("cutqueue", 2));
    let config = config_through(
        &db,
        &proxy,
        "proxied.toml",
        &[("name = \"q\"", "name = \"cutqueue\"")],
    );
    let ids = db.insert("cutqueue", &["ok", "ok", "ok"]).await;
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 3, 30).await;
    assert!(proxy.fired(), "the claim was never cut");
    let log = worker.log_text();
    assert!(
        log.contains("read back the batch claimed before the connection broke"),
        "{log}"
    );
    assert!(!log.contains("stale claim put back"), "{log}");
    let runs: Vec<u64> = db.runs().iter().map(|r| r.0).collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    for id in ids {
        assert!(runs.contains(&id), "{id} never ran: {runs:?}");
    }
    assert_eq!(
        db.count("attempts = 1 AND suspicion = 0 AND last_error IS NULL")
            .await,
        3
    );
}

/// A deploy while a claimed batch waits to be read back (its read-back broke, and the server
/// is away): the drain reads it once the server is back and releases its jobs, rather than
/// leave them claimed for the reaper, which would count them as a dead worker's.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_unread_at_the_shutdown_is_released() {
    let db = TestDb::new("unread_shutdown").await;
    let proxy = Proxy::new();
    proxy.up().await;
    proxy.arm(Fault::Cut("status = 'claimed' ORDER BY priority DESC, id"));
    let config = config_through(&db, &proxy, "proxied.toml", &[]);
    db.insert("q", &["ok", "ok", "ok"]).await;
    let mut worker = Worker::start(&config, "1");
    let start = Instant::now();
    while !proxy.fired() {
        assert!(start.elapsed() < Duration::from_secs(20), "never cut");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    proxy.down();
    assert!(db.count("status = 'claimed'").await > 0);
    worker.signal(nix::sys::signal::Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.up().await;
    assert_eq!(worker.wait(30), Some(0), "{}", worker.log_text());
    let log = worker.log_text();
    assert!(
        log.contains("job released: claimed before the connection broke"),
        "{log}"
    );
    assert_eq!(
        db.count("status = 'pending' AND attempts = 0 AND suspicion = 0 AND batch_id IS NULL")
            .await,
        3,
        "{log}"
    );
    assert!(db.runs().is_empty());
}

/// The instance's connection drops and the server, up, turns its reconnects down (here its
/// account is locked; in production too many connections, say). The server lists no
/// connection of the instance, so another instance's reaper puts its job back two passes
/// later: the instance stops the handler before that, rather than wait for the fence of a
/// server that does not answer, and the job never runs twice at once.
#[tokio::test(flavor = "multi_thread")]
async fn reconnects_turned_down_stop_the_handlers_before_the_reaper_puts_back() {
    let db = TestDb::new("reconnect_refused").await;
    let (user, password) = common::account(&db, "refused", |_| true).await;
    let mut admin = db.conn().await;
    // One second of lock wait: a statement's limit, and the fence of a silent server, are 6 s.
    // Reaper passes 3 s apart: the claims go back 3 to 6 s after the connection, and the
    // fence is 1.5 s (the loss itself is noticed within a second or so).
    let direct = db.config_with_lock_wait("concurrency = 1", "1s");
    edited(
        &direct,
        &direct,
        &[("interval = \"500ms\"", "interval = \"3s\"")],
    );
    let locked = db.path("locked.toml");
    let as_user = db.url_as(&user, &password);
    edited(&direct, &locked, &[(db.url.as_str(), as_user.as_str())]);

    std::fs::write(db.path("slow"), "").unwrap();
    let a = Worker::start(&locked, "a");
    let id = db.insert("q", &["slow-if-flag"]).await[0];
    while db.runs().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = db.runs()[0].3 as i32;
    let b = Worker::start(&direct, "b");
    b.wait_log("consumer: connected", 20).await;

    admin
        .query_drop(format!("ALTER USER '{user}'@'%' ACCOUNT LOCK"))
        .await
        .unwrap();
    let conns: Vec<u64> = admin
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?",
            (user.as_str(),),
        )
        .await
        .unwrap();
    for c in conns {
        let _ = admin.query_drop(format!("KILL CONNECTION {c}")).await;
    }
    // The job runs again on b: by then the first run is dead.
    let start = Instant::now();
    let mut died = None;
    while db.runs().len() < 2 {
        if died.is_none() && !alive(first) {
            died = Some(start.elapsed());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never ran again: {}",
            b.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let again = start.elapsed();
    assert!(
        died.is_some() && !alive(first),
        "the first run was alive when the job ran again after {again:?}:\n{}",
        a.log_text()
    );
    assert!(a
        .log_text()
        .contains("consumer: no answer from the database"));
    admin
        .query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await
        .unwrap();
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
}

/// A partition: the instance's host is cut off from the server without a reset (the proxy
/// holds every byte and closes nothing). The instance kills its handler once the server has
/// not answered for its fence; the server drops the silent connection after the session's
/// wait_timeout, and the reaper of an instance on the server's side puts the job back. It
/// runs again, and only once its first run is dead; when the network heals, the cut-off
/// instance's late release changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_instance_kills_its_handlers_before_their_jobs_run_elsewhere() {
    let db = TestDb::new("partition").await;
    let proxy = Proxy::new();
    proxy.up().await;
    // Lock waits of 1 s: a statement's limit and the fence are 6 s, the session's
    // wait_timeout 42 s.
    let base = db.config_with_lock_wait("concurrency = 1", "1s");
    let cut = db.path("cut.toml");
    let url = proxy.url(&db);
    edited(&base, &cut, &[(db.url.as_str(), url.as_str())]);
    let direct = db.path("direct.toml");
    std::fs::copy(&base, &direct).unwrap();

    std::fs::write(db.path("slow"), "").unwrap();
    let a = Worker::start(&cut, "a");
    let id = db.insert("q", &["slow-if-flag"]).await[0];
    while db.runs().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = db.runs()[0].3 as i32;
    let b = Worker::start(&direct, "b");
    b.wait_log("consumer: connected", 20).await;

    let cut_at = Instant::now();
    proxy.freeze();
    a.wait_log("consumer: no answer from the database", 40)
        .await;
    let fenced = cut_at.elapsed();
    let start = Instant::now();
    while alive(first) {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the handler outlived the fence"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fenced >= Duration::from_secs(5), "fenced after {fenced:?}");
    std::fs::remove_file(db.path("slow")).unwrap();

    // The server drops the silent connection; the job runs again on the server's side.
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 90)
        .await;
    let runs = db.runs();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1].2, "b");
    assert!(b.log_text().contains("reaper: stale claim put back"));

    // Healed: the cut-off instance's release is fenced out.
    proxy.thaw();
    let start = Instant::now();
    while a.log_text().matches("consumer: connected").count() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}",
            a.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, attempts, ..) = db.job(id).await;
    assert_eq!((status.as_str(), attempts), ("done", 1));
    assert_eq!(db.runs().len(), 2);
}

/// A blip: the connection drops while a handler runs, and before the instance is back the
/// reaper of another instance has put the job back (as it does for a connection the server
/// no longer lists) and that instance runs it. At the reconnect the first instance finds its
/// claim gone and stops its handler: the job does not go on running twice at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_gone_at_the_reconnect_stops_its_handler() {
    let db = TestDb::new("gone_at_reconnect").await;
    let proxy = Proxy::new();
    proxy.up().await;
    let config = config_through(&db, &proxy, "proxied.toml", &[]);
    std::fs::write(db.path("slow"), "").unwrap();
    let a = Worker::start(&config, "a");
    let id = db.insert("q", &["slow-if-flag"]).await[0];
    while db.runs().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = db.runs()[0].3 as i32;

    // Away; the claim goes back, as the reaper puts back those of a connection that is gone.
    proxy.down();
    db.conn()
        .await
        .exec_drop(
            "UPDATE myjob_jobs SET status = 'pending', batch_id = NULL, owner_conn = NULL, \
             owner_server = NULL, worker = NULL, claimed_at = NULL WHERE id = ?",
            (id,),
        )
        .await
        .unwrap();
    proxy.up().await;
    a.wait_log(
        &format!("job's handler stopped: its claim was put back while the connection was away, for another worker to run job_id={id}"),
        30,
    )
    .await;
    let start = Instant::now();
    while alive(first) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the handler of a claim that was gone went on running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.wait_log("job's handler ended: its claim had been put back", 10)
        .await;
    // The job is pending, for any worker: this one claims it anew and runs it to the end.
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
    assert_eq!(db.runs().len(), 2, "{:?}", db.runs());
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
}
