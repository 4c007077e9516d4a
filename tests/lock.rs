//! `myjob lock`: mutual exclusion on the server's named locks, or on a Galera cluster on lease
//! rows (tests/run runs these against a node too), with real processes. Lock names carry the
//! test database's name, since named locks are server-wide and tests run at once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{bin, myjob, TestDb};
use mysql_async::prelude::*;

/// Starts `myjob lock` with `args` (the lock's name, options, `--`, the command).
fn start(config: &Path, args: &[&str]) -> Child {
    Command::new(bin())
        .args(["--config", config.to_str().unwrap(), "lock"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn lock(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["--config", config.to_str().unwrap(), "lock"];
    all.extend_from_slice(args);
    let out = myjob(&all, b"");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
}

/// Waits for `path` to hold a pid, and returns it.
async fn pid_in(path: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no pid in {path:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the test's server is a Galera node, where the lock is a lease row.
async fn galera(db: &TestDb) -> bool {
    db.server_id().await.galera.is_some()
}

/// The connection that holds lock `name`, once one does.
async fn holder(db: &TestDb, name: &str) -> u64 {
    let mut conn = db.conn().await;
    let sql = if galera(db).await {
        "SELECT owner_conn FROM myjob_locks WHERE name = ?"
    } else {
        "SELECT IS_USED_LOCK(?)"
    };
    let start = Instant::now();
    loop {
        let id: Option<Option<u64>> = conn.exec_first(sql, (name,)).await.unwrap();
        if let Some(Some(id)) = id {
            return id;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nobody took {name}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_holders_take_turns_and_the_status_is_passed_on() {
    let db = TestDb::new("lock_turns").await;
    let config = db.config("", "");
    let name = format!("{}.turns", db.name);
    let log = db.path("log");
    // Each holder writes start, waits, writes end: with the lock, no two starts in a row.
    let script = format!(
        "echo start >> {l}; sleep 0.5; echo end >> {l}",
        l = log.display()
    );
    let holders: Vec<Child> = (0..3)
        .map(|_| {
            start(
                &config,
                &[&name, "--wait", "30s", "--", "sh", "-c", &script],
            )
        })
        .collect();
    for h in holders {
        let out = h.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, "start\nend\n".repeat(3), "interleaved:\n{text}");

    // The command's status is myjob lock's; a signal's is 128 + its number, as in a shell.
    assert_eq!(
        lock(&config, &[&name, "--", "sh", "-c", "exit 7"]).0,
        Some(7)
    );
    assert_eq!(
        lock(&config, &[&name, "--", "sh", "-c", "kill -9 $$"]).0,
        Some(137)
    );
    let (code, err) = lock(&config, &[&name, "--", "/nonexistent/command"]);
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("/nonexistent/command: cannot start"), "{err}");
    // Released each time: the lock is free now.
    let mut conn = db.conn().await;
    let sql = if galera(&db).await {
        "SELECT COUNT(*) = 0 FROM myjob_locks WHERE name = ?"
    } else {
        "SELECT IS_FREE_LOCK(?)"
    };
    let free: Option<i64> = conn.exec_first(sql, (&name,)).await.unwrap();
    assert_eq!(free, Some(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_lock_is_exit_75_and_the_command_never_runs() {
    let db = TestDb::new("lock_busy").await;
    let config = db.config("", "");
    let name = format!("{}.busy", db.name);
    let mut conn = db.conn().await;
    if galera(&db).await {
        // A lease another host renewed just now.
        conn.exec_drop(
            "INSERT INTO myjob_locks (name, holder, held_by) VALUES (?, 1, 'elsewhere:1')",
            (&name,),
        )
        .await
        .unwrap();
    } else {
        let got: Option<i64> = conn
            .exec_first("SELECT GET_LOCK(?, 0)", (&name,))
            .await
            .unwrap();
        assert_eq!(got, Some(1));
    }
    let marker = db.path("ran");
    let touch = format!("touch {}", marker.display());
    let (code, err) = lock(&config, &[&name, "--", "sh", "-c", &touch]);
    assert_eq!(code, Some(75), "{err}");
    assert!(
        err.contains(&format!("lock {name}: held by another "))
            && err.contains("; not acquired within 0s, so the command did not run"),
        "{err}"
    );
    let began = Instant::now();
    let (code, _) = lock(&config, &[&name, "--wait", "1s", "--", "sh", "-c", &touch]);
    assert_eq!(code, Some(75));
    assert!(
        began.elapsed() >= Duration::from_millis(900),
        "did not wait"
    );
    assert!(!marker.exists(), "the command ran without the lock");

    // Names: empty, or longer than 64 characters, are usage errors.
    let long = "x".repeat(65);
    for bad in ["", long.as_str()] {
        let (code, err) = lock(&config, &[bad, "--", "true"]);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains("<NAME>"), "{err}");
    }
    assert_eq!(lock(&config, &[&"y".repeat(64), "--", "true"]).0, Some(0));
    assert_eq!(lock(&config, &[&name]).0, Some(64), "no command");
}

/// kill -9 of a holding myjob lock: the server frees the lock with the connection, and the
/// command dies too.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_holder_frees_the_lock_and_its_command_dies() {
    let db = TestDb::new("lock_killed").await;
    let config = db.config("", "");
    let name = format!("{}.killed", db.name);
    let pidfile = db.path("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut holder_proc = start(&config, &[&name, "--", "sh", "-c", &script]);
    let command = pid_in(&pidfile).await;
    holder(&db, &name).await;
    holder_proc.kill().unwrap();
    holder_proc.wait().unwrap();
    let start_wait = Instant::now();
    while alive(command) {
        assert!(
            start_wait.elapsed() < Duration::from_secs(5),
            "the command outlived myjob lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A named lock is freed with the connection; a lease once it runs out (20 s here).
    let wait = if galera(&db).await { "40s" } else { "10s" };
    let (code, err) = lock(&config, &[&name, "--wait", wait, "--", "true"]);
    assert_eq!(code, Some(0), "the lock was not freed: {err}");
}

/// A KILL CONNECTION of the holder's connection: the lock is gone, so the command is stopped
/// (here it ignores SIGTERM, so SIGKILL after the grace) and myjob lock exits 75.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_connection_stops_the_command_and_exits_75() {
    let db = TestDb::new("lock_lost").await;
    let config = db.config("", "");
    let name = format!("{}.lost", db.name);
    let pidfile = db.path("pid");
    let script = format!("trap '' TERM; echo $$ > {}; sleep 60", pidfile.display());
    let proc = start(
        &config,
        &[&name, "--kill-grace", "1s", "--", "sh", "-c", &script],
    );
    let command = pid_in(&pidfile).await;
    let conn_id = holder(&db, &name).await;
    let mut conn = db.conn().await;
    let killed = Instant::now();
    conn.query_drop(format!("KILL CONNECTION {conn_id}"))
        .await
        .unwrap();
    let out = proc.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    let lost = if galera(&db).await {
        "its lease could not be renewed"
    } else {
        "the connection that held it was lost"
    };
    assert!(err.contains(&format!("lock {name}: {lost}")), "{err}");
    assert!(err.contains("the command ignored SIGTERM"), "{err}");
    assert!(!alive(command), "the command outlived the lock");
    // A check a second, and a second of grace.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_stops_the_command_and_exits_75() {
    let db = TestDb::new("lock_timeout").await;
    let config = db.config("", "");
    let name = format!("{}.timeout", db.name);
    let pidfile = db.path("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let began = Instant::now();
    let (code, err) = lock(
        &config,
        &[&name, "--timeout", "1s", "--", "sh", "-c", &script],
    );
    assert_eq!(code, Some(75), "{err}");
    assert!(
        err.contains(&format!(
            "lock {name}: the command held it past --timeout 1s, so it was stopped"
        )),
        "{err}"
    );
    assert!(began.elapsed() < Duration::from_secs(30));
    let command = pid_in(&pidfile).await;
    assert!(!alive(command));
    let (code, err) = lock(&config, &[&name, "--timeout", "soon", "--", "true"]);
    assert_eq!(code, Some(64), "{err}");
}

/// The lease statements on every server (on a Galera cluster they stand in for GET_LOCK): a
/// lease is taken once, renewed only by its holder, taken over once it has run out, and
/// released only by its holder.
#[tokio::test(flavor = "multi_thread")]
async fn lease_rows_are_taken_renewed_expired_and_released() {
    use myjob::store::locks::{self, Holder};
    let db = TestDb::new("lock_lease").await;
    let mut a_conn = db.conn().await;
    let mut b_conn = db.conn().await;
    let a = Holder {
        token: 1,
        held_by: "a:1",
    };
    let b = Holder {
        token: 2,
        held_by: "b:2",
    };
    let lease = Duration::from_secs(3);
    let name = "Report";
    assert!(locks::take(&mut a_conn, name, &a, lease).await.unwrap());
    assert!(
        !locks::take(&mut b_conn, "report", &b, lease).await.unwrap(),
        "names are case-insensitive"
    );
    assert!(locks::renew(&mut a_conn, name, 1).await.unwrap());
    assert!(
        locks::renew(&mut a_conn, name, 1).await.unwrap(),
        "a renewal always changes the row"
    );
    assert!(!locks::renew(&mut b_conn, name, 2).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(locks::renew(&mut a_conn, name, 1).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !locks::take(&mut b_conn, name, &b, lease).await.unwrap(),
        "renewed 1.5 s ago"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        locks::take(&mut b_conn, name, &b, lease).await.unwrap(),
        "run out"
    );
    assert!(
        !locks::renew(&mut a_conn, name, 1).await.unwrap(),
        "taken over"
    );
    locks::release(&mut a_conn, name, 1).await.unwrap();
    let holder: Option<(u64, String, bool)> = a_conn
        .query_first("SELECT holder, held_by, owner_conn = CONNECTION_ID() FROM myjob_locks")
        .await
        .unwrap();
    assert_eq!(holder, Some((2, "b:2".to_owned(), false)));
    locks::release(&mut b_conn, name, 2).await.unwrap();
    let left: Option<u64> = a_conn
        .query_first("SELECT COUNT(*) FROM myjob_locks")
        .await
        .unwrap();
    assert_eq!(left, Some(0));
}

/// The server frees a named lock the moment its holder's connection dies, while the holder
/// notices only at its next check and then gives its command `--kill-grace`. A holder that
/// gets the lock then waits that out: the two commands never overlap. A lock released by its
/// holder passes on at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_lost_with_its_connection_passes_on_only_after_the_command_is_stopped() {
    let db = TestDb::new("lock_lost_overlap").await;
    let config = db.config("", "");
    let name = format!("{}.overlap", db.name);
    let (pid1, verdict) = (db.path("pid1"), db.path("verdict"));
    // The first command ignores SIGTERM: it lives on for the whole grace after its lock is lost.
    let first_script = format!("trap '' TERM; echo $$ > {p}; sleep 60", p = pid1.display());
    let mut first = start(
        &config,
        &[&name, "--kill-grace", "2s", "--", "sh", "-c", &first_script],
    );
    let pid = pid_in(&pid1).await;
    let conn_id = holder(&db, &name).await;
    // The second waits for the lock, and says whether the first command still ran at its start.
    let second_script = format!(
        "if kill -0 {pid} 2>/dev/null; then echo overlap; else echo alone; fi > {v}",
        v = verdict.display()
    );
    let second = start(
        &config,
        &[&name, "--wait", "60s", "--", "sh", "-c", &second_script],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    db.conn()
        .await
        .query_drop(format!("KILL CONNECTION {conn_id}"))
        .await
        .unwrap();

    let out = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(&verdict).unwrap().trim(),
        "alone",
        "the second command started while the first still ran:\n{err}"
    );
    assert_eq!(first.wait().unwrap().code(), Some(75));
    assert!(!alive(pid));

    // Released by its holder, the lock passes on without a wait.
    let (code, err) = lock(&config, &[&name, "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = lock(&config, &[&name, "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("waiting"), "{err}");
}

/// Without myjob_locks (never migrated) a holder cannot tell whether the last one released
/// the lock: it says so, waits out a holder's stop, and runs the command.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_marker_table_a_holder_waits_and_says_why() {
    let db = TestDb::empty("lock_no_table").await;
    if galera(&db).await {
        // A lease needs the table: without it myjob lock refuses to run there.
        return;
    }
    let config = db.config("", "");
    let name = format!("{}.no_table", db.name);
    let started = Instant::now();
    let (code, err) = lock(&config, &[&name, "--kill-grace", "1s", "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("cannot keep its marker"), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(7), "{err}");
}

/// The holder's host is cut off without a reset (a partition: the proxy holds every byte and
/// closes nothing). It stops its command once its check goes unanswered; the server drops its
/// silent connection after the session's wait_timeout (30 s), not the default 8 hours, and
/// the lock passes on, once the cut-off holder's command is surely dead.
#[tokio::test(flavor = "multi_thread")]
async fn a_holder_cut_off_without_a_reset_loses_the_lock_in_seconds() {
    let db = TestDb::new("lock_partition").await;
    if galera(&db).await {
        // The lease expires by itself there (a_killed_holder_frees_the_lock_and_its_command_dies).
        return;
    }
    let proxy = common::proxy::Proxy::new();
    proxy.up().await;
    let config = db.config("", "");
    let cut = db.path("cut.toml");
    let url = proxy.url(&db);
    common::edited(&config, &cut, &[(db.url.as_str(), url.as_str())]);
    let name = format!("{}.partition", db.name);
    let (pid1, verdict) = (db.path("pid1"), db.path("verdict"));
    let first_script = format!("echo $$ > {p}; sleep 300", p = pid1.display());
    let mut first = start(
        &cut,
        &[&name, "--kill-grace", "1s", "--", "sh", "-c", &first_script],
    );
    let pid = pid_in(&pid1).await;
    holder(&db, &name).await;
    proxy.freeze();

    let second_script = format!(
        "if kill -0 {pid} 2>/dev/null; then echo overlap; else echo alone; fi > {v}",
        v = verdict.display()
    );
    let second = start(
        &config,
        &[&name, "--wait", "90s", "--", "sh", "-c", &second_script],
    );
    let out = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(&verdict).unwrap().trim(),
        "alone",
        "{err}"
    );
    // The cut-off holder exits too, though its connection never answers again.
    let start = Instant::now();
    let status = loop {
        if let Some(status) = first.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = first.kill();
            panic!("the cut-off holder hangs after losing the lock");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(75));
}
