//! The worker against the real MariaDB and real handler processes: exactly-once handling,
//! retries, timeouts, ordering, unique keys, the drain and the reload.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::{edited, myjob, TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_jobs_two_instances_each_handled_exactly_once() {
    let db = TestDb::new("exactly_once").await;
    let config = db.config("concurrency = 4\nbatch_size = 100", "");
    // Inserted as an application would, in multi-row INSERTs of plain SQL.
    let mut conn = db.conn().await;
    for chunk in 0..10 {
        let rows: Vec<String> = (0..1000)
            .map(|i| format!("('q', 'job {}')", chunk * 1000 + i))
            .collect();
        conn.query_drop(format!(
            "INSERT INTO myjob_jobs (queue, payload) VALUES {}",
            rows.join(", ")
        ))
        .await
        .unwrap();
    }
    let mut a = Worker::start(&config, "1");
    let mut b = Worker::start(&config, "2");
    db.wait_count("status = 'done'", 10_000, 240).await;
    a.signal(Signal::SIGTERM);
    b.signal(Signal::SIGTERM);
    assert_eq!(a.wait(30), Some(0), "{}", a.log_text());
    assert_eq!(b.wait(30), Some(0), "{}", b.log_text());

    let runs = db.runs();
    let ids: HashSet<u64> = runs.iter().map(|r| r.0).collect();
    assert_eq!(runs.len(), 10_000, "a job ran more than once");
    assert_eq!(ids.len(), 10_000);
    assert_eq!(db.count("status <> 'done'").await, 0);
    assert_eq!(db.count("attempts <> 1").await, 0);
    // Both instances took part.
    let instances: HashSet<&str> = runs.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(instances, HashSet::from(["1", "2"]));
    // Their output went to the log, tagged with the job id.
    assert!(a.log_text().contains("handled ") && a.log_text().contains("job_id="));
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_retry_with_backoff_then_fail_with_the_error() {
    let db = TestDb::new("retries").await;
    let config = db.config("", "");
    let ids = db.insert("q", &["fail", "perm", "flaky"]).await;
    let _w = Worker::start(&config, "1");
    db.wait_count("status IN ('done', 'failed')", 3, 30).await;

    let (status, attempts, _, _, error) = db.job(ids[0]).await;
    assert_eq!((status.as_str(), attempts), ("failed", 3));
    let error = error.unwrap();
    assert!(
        error.contains("attempt 3 of 3")
            && error.contains("exit status 1")
            && error.contains("boom on attempt 3"),
        "{error}"
    );

    let (status, attempts, _, _, error) = db.job(ids[1]).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("failed", 1),
        "exit 65 is not retried"
    );
    assert!(error.unwrap().contains("permanent failure"));

    let (status, attempts, _, _, _) = db.job(ids[2]).await;
    assert_eq!((status.as_str(), attempts), ("done", 2));

    let runs: Vec<_> = db.runs().into_iter().filter(|r| r.0 == ids[0]).collect();
    assert_eq!(runs.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread")]
async fn backoff_delays_each_retry() {
    let db = TestDb::new("backoff").await;
    // A long backoff, so the delay is plain in run_at.
    let config = db.config("", "");
    edited(
        &config,
        &config,
        &[
            ("backoff = \"100ms\"", "backoff = \"20s\""),
            ("backoff_max = \"200ms\"", "backoff_max = \"1m\""),
        ],
    );
    let ids = db.insert("q", &["fail"]).await;
    let _w = Worker::start(&config, "1");
    // A retry waits out its backoff as `scheduled`, out of the claim's range.
    db.wait_count("status = 'scheduled' AND attempts = 1", 1, 30)
        .await;
    let mut conn = db.conn().await;
    let delay: f64 = conn
        .exec_first(
            "SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), run_at) / 1e6 FROM myjob_jobs WHERE id = ?",
            (ids[0],),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(
        (8.0..=20.0).contains(&delay),
        "first retry due in {delay}s, expected 10-20s less a moment"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_over_its_timeout_is_killed_with_its_children() {
    let db = TestDb::new("timeout").await;
    let config = db.config("kill_grace = \"1s\"", "timeout = \"1s\"");
    edited(
        &config,
        &config,
        &[("max_attempts = 3", "max_attempts = 1")],
    );
    let ids = db.insert("q", &["ignore-term:60"]).await;
    let start = Instant::now();
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'failed'", 1, 20).await;
    assert!(start.elapsed() < Duration::from_secs(15));
    let (_, _, _, _, error) = db.job(ids[0]).await;
    assert!(error.unwrap().contains("timed out after 1s"));
    let log = w.log_text();
    assert!(
        log.contains("SIGTERM to its process group") && log.contains("ignored SIGTERM: SIGKILL"),
        "{log}"
    );
    // The child it left behind died with its process group.
    let child: i32 = std::fs::read_to_string(db.path("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alive =
        std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| !s.contains(") Z "));
    assert!(!alive, "the handler's child {child} outlived it");
}

#[tokio::test(flavor = "multi_thread")]
async fn priority_then_fifo_and_delayed_jobs_wait() {
    let db = TestDb::new("order").await;
    let config = db.config("concurrency = 1\nbatch_size = 1", "");
    let mut conn = db.conn().await;
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, payload, priority) VALUES \
         ('q', 'low1', 0), ('q', 'low2', 0), ('q', 'high1', 5), ('q', 'high2', 5), ('q', 'mid', 1)",
    )
    .await
    .unwrap();
    let c = config.to_str().unwrap();
    let delayed = myjob(
        &[
            "--config", c, "enqueue", "--queue", "q", "--delay", "2s", "later",
        ],
        b"",
    );
    assert!(
        delayed.status.success(),
        "{}",
        String::from_utf8_lossy(&delayed.stderr)
    );
    let delayed_id: u64 = String::from_utf8_lossy(&delayed.stdout)
        .trim()
        .parse()
        .unwrap();

    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 6, 30).await;
    let order: Vec<u64> = db.runs().iter().map(|r| r.0).collect();
    assert_eq!(order, vec![3, 4, 5, 1, 2, delayed_id]);
    let waited: f64 = conn
        .exec_first("SELECT TIMESTAMPDIFF(MICROSECOND, created_at, claimed_at) / 1e6 FROM myjob_jobs WHERE id = ?", (delayed_id,))
        .await
        .unwrap()
        .unwrap();
    assert!(
        waited >= 2.0,
        "the delayed job was claimed {waited}s after it was created"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unique_key_replaces_the_pending_payload_and_refuses_while_running() {
    let db = TestDb::new("unique").await;
    let config = db.config("", "");
    let c = config.to_str().unwrap();
    let enqueue = |key: &str, payload: &str| {
        myjob(
            &[
                "--config",
                c,
                "enqueue",
                "--queue",
                "q",
                "--unique-key",
                key,
                payload,
            ],
            b"",
        )
    };

    let first = enqueue("user-7", "sleep:0");
    let second = enqueue("user-7", "env");
    assert!(first.status.success() && second.status.success());
    assert_eq!(
        first.stdout, second.stdout,
        "the second enqueue returns the pending job's id"
    );
    let id: u64 = String::from_utf8_lossy(&first.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(db.count("1").await, 1);

    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 1, 20).await;
    // The later payload ran, once.
    assert!(db.path(&format!("env.{id}")).exists());
    assert_eq!(db.runs().len(), 1);

    // Once done, the key is free again.
    let third = enqueue("user-7", "slow-if-flag");
    assert_ne!(third.stdout, first.stdout);
    db.wait_count("status = 'done'", 2, 20).await;

    // While a job with the key runs, enqueue refuses (exit 75) rather than lose the payload.
    std::fs::write(db.path("slow"), "").unwrap();
    let running = enqueue("user-8", "slow-if-flag");
    db.wait_count("status = 'claimed' AND unique_key = 'user-8'", 1, 20)
        .await;
    let refused = enqueue("user-8", "other");
    assert_eq!(
        refused.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is running now"));
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count("status = 'done'", 3, 20).await;
    assert!(running.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn handlers_get_a_clean_environment_and_the_payload_on_stdin() {
    let db = TestDb::new("environment").await;
    let config = db.config("", "");
    let ids = db.insert("q", &["env"]).await;
    let _w = Worker::start_with_env(
        &config,
        "7",
        &[("MYJOB_DATABASE_URL", &db.url), ("SECRET_TOKEN", "hunter2")],
    );
    db.wait_count("status = 'done'", 1, 20).await;
    let env = std::fs::read_to_string(db.path(&format!("env.{}", ids[0]))).unwrap();
    let (_, _, batch, _, _) = db.job(ids[0]).await;
    for line in [
        format!("MYJOB_JOB_ID={}", ids[0]),
        "MYJOB_QUEUE=q".into(),
        "MYJOB_ATTEMPT=1".into(),
        "MYJOB_MAX_ATTEMPTS=3".into(),
        format!("MYJOB_BATCH_ID={}", batch.unwrap()),
        "MYJOB_INSTANCE=7".into(),
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from:\n{env}"
        );
    }
    assert!(
        !env.contains("SECRET_TOKEN") && !env.contains("MYJOB_DATABASE_URL"),
        "{env}"
    );
}

/// A script without its `#!` line, named without its path and found on the worker's PATH,
/// runs under /bin/sh, as `execvp` ran it when it searched PATH for myjob: per job and
/// persistent. Started by the path found, the kernel refuses it (ENOEXEC), and every job of
/// the queue failed "Exec format error".
#[tokio::test(flavor = "multi_thread")]
async fn a_script_without_its_interpreter_line_found_on_path_runs_under_sh() {
    let db = TestDb::new("noshebang").await;
    let config = db.path("noshebang.toml");
    let text = std::fs::read_to_string(db.config("concurrency = 2", "")).unwrap();
    db.script(
        "per-job",
        "cat > /dev/null\necho \"$0\" > DIR/ran.$MYJOB_JOB_ID\n",
    );
    db.script(
        "persistent",
        "echo READY\nwhile read -r _ id _ _ _ length; do\n  head -c \"$length\" > /dev/null\n  echo \"$0\" > DIR/ran.$id\n  echo OK\ndone\n",
    );
    let configured = format!("command = [\"{}\"]", db.handler().display());
    let text = text.replace(&configured, "command = [\"per-job\"]")
        + "\n[[queue]]\nname = \"p\"\ncommand = [\"persistent\"]\npersistent = true\n";
    std::fs::write(&config, text).unwrap();
    let search = format!(
        "{}:{}",
        db.path("").display(),
        std::env::var("PATH").unwrap()
    );
    let mut w = Worker::start_with_env(&config, "1", &[("PATH", &search)]);
    let mut ids = db.insert("q", &["a", "b"]).await;
    ids.extend(db.insert("p", &["c", "d"]).await);
    db.wait_count("status = 'done'", 4, 30).await;
    for id in ids {
        let ran = std::fs::read_to_string(db.path(&format!("ran.{id}"))).unwrap();
        assert!(
            ran.trim().ends_with("per-job") || ran.trim().ends_with("persistent"),
            "{ran}"
        );
    }
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(20), Some(0));
    assert!(
        !w.log_text().contains("Exec format error"),
        "{}",
        w.log_text()
    );
}

/// A program on PATH that myjob may not run is passed over for the next one, as `execvp`
/// passes it: here a file with its execute bits on a filesystem mounted `noexec` (which
/// refuses even root). Picked by its mode bits alone, it failed every job with "Permission
/// denied".
#[tokio::test(flavor = "multi_thread")]
async fn a_program_on_path_that_may_not_run_is_passed_over() {
    let db = TestDb::new("noexec").await;
    let config = db.path("noexec.toml");
    let text = std::fs::read_to_string(db.config("concurrency = 2", "")).unwrap();
    let (barred, runnable) = (db.path("barred"), db.path("runnable"));
    std::fs::create_dir(&barred).unwrap();
    std::fs::create_dir(&runnable).unwrap();
    let mount = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "noexec", "tmpfs"])
        .arg(&barred)
        .status()
        .unwrap();
    assert!(mount.success(), "mount: {mount}");
    // Unmounted however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(barred.clone());
    for dir in [&barred, &runnable] {
        let path = dir.join("h");
        let mark = dir.file_name().unwrap().to_str().unwrap();
        let text = format!(
            "#!/bin/sh\ncat > /dev/null\necho {mark} > {}/ran.$MYJOB_JOB_ID\n",
            db.path("").display()
        );
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let configured = format!("command = [\"{}\"]", db.handler().display());
    std::fs::write(&config, text.replace(&configured, "command = [\"h\"]")).unwrap();
    let search = format!(
        "{}:{}:{}",
        barred.display(),
        runnable.display(),
        std::env::var("PATH").unwrap()
    );
    let mut w = Worker::start_with_env(&config, "1", &[("PATH", &search)]);
    let ids = db.insert("q", &["a", "b"]).await;
    db.wait_count("status = 'done'", 2, 30).await;
    for id in ids {
        let ran = std::fs::read_to_string(db.path(&format!("ran.{id}"))).unwrap();
        assert_eq!(ran.trim(), "runnable");
    }
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(20), Some(0));
}

/// A handler named without its path (`command = ["bash", …]`) is found on the worker's PATH
/// and keeps its name as argv[0], and myjob starts it without forking itself: every process
/// it creates shares its memory until the exec (CLONE_VM, as `posix_spawn` does). A fork
/// copies the worker's page tables at each job, three times myjob's CPU per `cat` job.
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_named_without_its_path_is_spawned_not_forked() {
    let db = TestDb::new("spawned").await;
    let config = db.path("spawned.toml");
    let text = std::fs::read_to_string(db.config("concurrency = 4", "")).unwrap();
    let handler = db.handler();
    // bash's own command line: argv[0] as myjob gave it, then the script.
    let probe = db.script(
        "probe.sh",
        "tr '\\0' ' ' < /proc/$$/cmdline > DIR/cmdline.$MYJOB_JOB_ID\ncat > /dev/null\n",
    );
    let named = format!("command = [\"bash\", \"{}\"]", probe.display());
    let configured = format!("command = [\"{}\"]", handler.display());
    std::fs::write(&config, text.replace(&configured, &named)).unwrap();
    let ids = db
        .insert("q", &["a", "b", "c", "d", "e", "f", "g", "h"])
        .await;
    // One file of calls per process and thread (trace.TID), so that no call is split.
    let trace = db.path("trace");
    let wrapper = [
        "strace",
        "-ff",
        "-qq",
        "-e",
        "trace=clone,clone3,fork,vfork",
        "-o",
    ];
    let wrapper: Vec<&str> = wrapper
        .into_iter()
        .chain([trace.to_str().unwrap()])
        .collect();
    let mut w = Worker::start_under(&wrapper, &config, "1");
    db.wait_count("status = 'done'", ids.len() as u64, 30).await;
    // The worker is strace's child, and strace ends with it.
    let children = format!("/proc/{0}/task/{0}/children", w.pid());
    let worker: i32 = std::fs::read_to_string(children)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(worker), Signal::SIGTERM).unwrap();
    w.wait(20);
    let cmdline = std::fs::read_to_string(db.path(&format!("cmdline.{}", ids[0]))).unwrap();
    assert_eq!(cmdline, format!("bash {} ", probe.display()));
    let calls = traced_clones(&trace);
    // myjob's threads: its first one (created by no traced call), and those it made.
    let made: HashSet<u32> = calls.values().flatten().map(|(_, child)| *child).collect();
    let mut mine: Vec<u32> = calls
        .keys()
        .copied()
        .filter(|t| !made.contains(t))
        .collect();
    assert_eq!(mine.len(), 1, "{calls:?}");
    let mut i = 0;
    while i < mine.len() {
        for (call, child) in &calls[&mine[i]] {
            if call.contains("CLONE_THREAD") && !mine.contains(child) {
                mine.push(*child);
            }
        }
        i += 1;
    }
    let processes: Vec<&String> = mine
        .iter()
        .flat_map(|t| &calls[t])
        .filter(|(call, _)| !call.contains("CLONE_THREAD"))
        .map(|(call, _)| call)
        .collect();
    let forks: Vec<&&String> = processes
        .iter()
        .filter(|c| !c.contains("CLONE_VM"))
        .collect();
    assert!(forks.is_empty(), "the worker forked itself: {forks:?}");
    assert!(processes.len() >= ids.len(), "{processes:?}");
}

/// Each traced thread's (trace.TID) calls that made a thread or a process, with the id made.
fn traced_clones(trace: &std::path::Path) -> HashMap<u32, Vec<(String, u32)>> {
    let dir = trace.parent().unwrap();
    let prefix = format!("{}.", trace.file_name().unwrap().to_str().unwrap());
    let mut calls = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(tid) = name.strip_prefix(&prefix).and_then(|t| t.parse().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(dir.join(&name)).unwrap();
        let made = text
            .lines()
            .filter(|l| l.starts_with("clone") || l.contains("fork("))
            .filter_map(|l| {
                let child = l.rsplit("= ").next()?.trim().parse().ok()?;
                Some((l.to_owned(), child))
            })
            .collect();
        calls.insert(tid, made);
    }
    calls
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_running_handlers_and_releases_the_rest() {
    let db = TestDb::new("drain").await;
    let config = db.config("concurrency = 2", "");
    edited(
        &config,
        &config,
        &[("shutdown_timeout = \"5s\"", "shutdown_timeout = \"3s\"")],
    );
    let ids = db.insert("q", &["sleep:1", "sleep:60"]).await;
    let mut w = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 2, 20).await;
    let stop = Instant::now();
    w.signal(Signal::SIGTERM);
    // Claimed no more once stopping.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = db.insert("q", &["sleep:0"]).await;
    assert_eq!(w.wait(20), Some(0), "{}", w.log_text());
    let took = stop.elapsed();
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(10),
        "drain took {took:?}"
    );

    assert_eq!(
        db.job(ids[0]).await.0,
        "done",
        "the short handler finished within the drain"
    );
    let (status, attempts, batch, _, _) = db.job(ids[1]).await;
    assert_eq!(
        (status.as_str(), attempts, batch),
        ("pending", 0, None),
        "killed at the timeout, released without using an attempt"
    );
    let (status, attempts, _, _, _) = db.job(late[0]).await;
    assert_eq!((status.as_str(), attempts), ("pending", 0));
    let log = w.log_text();
    assert!(
        log.contains("shutdown_timeout passed") && log.contains("job released"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_queues_and_keeps_the_old_config_when_the_new_one_is_bad() {
    let db = TestDb::new("reload").await;
    let config = db.config("", "");
    let other = db.insert("other", &["x"]).await;
    let w = Worker::start(&config, "1");
    w.wait_log("ready", 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        db.job(other[0]).await.0,
        "pending",
        "queue 'other' is not configured yet"
    );

    let handler = db.path("handler.sh");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[[queue]]\nname = \"other\"\ncommand = [\"{}\"]\n",
        handler.display()
    ));
    std::fs::write(&config, &text).unwrap();
    w.signal(Signal::SIGHUP);
    db.wait_count("status = 'done'", 1, 20).await;
    assert!(w
        .log_text()
        .contains("reload: new configuration in use; queues: q, other"));

    // A broken file is reported and the running config stays.
    std::fs::write(
        &config,
        text.replace("poll_interval = \"100ms\"", "poll_interval = \"0s\""),
    )
    .unwrap();
    w.signal(Signal::SIGHUP);
    w.wait_log("reload: keeping the configuration in use", 20)
        .await;
    assert!(w.log_text().contains("worker.poll_interval"));
    db.insert("other", &["y"]).await;
    db.wait_count("status = 'done'", 2, 20).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_releases_prefetched_jobs_without_using_an_attempt() {
    let db = TestDb::new("prefetch").await;
    // One slot and quick jobs: the completion rate makes the instance claim ahead.
    let config = db.config("concurrency = 1", "");
    db.insert_rows("(queue, payload)", "('q', 'sleep:0')", 3000)
        .await;
    let mut w = Worker::start(&config, "1");
    db.wait_at_least("status = 'done'", 100, 60).await;
    // One running and at least two claimed ahead: the stop then finds some not started, even
    // if one more starts before the signal is seen.
    db.wait_at_least("status = 'claimed'", 3, 60).await;
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(20), Some(0), "{}", w.log_text());
    assert!(
        w.log_text().contains("claimed ahead but not started"),
        "nothing was prefetched"
    );
    assert_eq!(db.count("status = 'claimed'").await, 0);
    assert_eq!(
        db.count("status = 'pending' AND (attempts <> 0 OR batch_id IS NOT NULL)")
            .await,
        0
    );
    assert_eq!(db.count("status = 'done' AND attempts <> 1").await, 0);
    assert_eq!(
        db.count("status = 'done'").await as usize,
        db.runs().len(),
        "only done jobs ran"
    );
}

/// With 57 of 64 slots busy with long jobs, the 7 free ones are filled at the next poll: a
/// free slot is worth a claim once `poll_interval` has passed, at any concurrency (a claim
/// for fewer than an eighth of the slots waits only while a backlog is draining).
#[tokio::test(flavor = "multi_thread")]
async fn free_slots_are_filled_at_the_poll_at_any_concurrency() {
    let db = TestDb::new("free_slots").await;
    let config = db.config("concurrency = 64", "");
    std::fs::write(db.path("slow"), "").unwrap();
    db.insert_rows("(queue, payload)", "('q', 'slow-if-flag')", 57)
        .await;
    let _w = Worker::start(&config, "1");
    db.wait_count("status = 'claimed'", 57, 30).await;
    db.insert_rows("(queue, payload)", "('q', 'quick')", 7)
        .await;
    // poll_interval is 100 ms; 10 s is slack for a loaded machine.
    db.wait_count("status = 'done'", 7, 10).await;
    assert_eq!(
        db.count("status = 'claimed'").await,
        57,
        "the long ones still run"
    );
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count("status = 'done'", 64, 30).await;
}
