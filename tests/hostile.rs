//! Odd job rows and rude handlers, with real processes: payloads with NUL bytes, invalid
//! UTF-8 or the column's full 16 MiB; a handler that writes 100 MiB, one that closes stdin
//! early, one that leaves a child behind. None may crash a worker, corrupt its log, or lose
//! the job.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::{TestDb, Worker};
use mysql_async::prelude::*;

/// One script for every queue of these tests; the queue's name picks what it does.
const ODD_HANDLER: &str = r#"#!/bin/sh
case "$MYJOB_QUEUE" in
  raw)
    cat > DIR/in.$MYJOB_JOB_ID
    printf 'out\000nul \377\376 bad utf-8 \033[31m escape\r\n'
    printf 'err\000\377\n' >&2 ;;
  big) wc -c > DIR/in.$MYJOB_JOB_ID ;;
  flood) yes 0123456789 | head -c 104857600 ;;
  longline) head -c 104857600 /dev/zero | tr '\000' y ;;
  closer) exec 0<&-; sleep 0.2; echo "closed stdin" ;;
  orphan) sleep 300 & echo $! > DIR/child.$MYJOB_JOB_ID ;;
esac
"#;

/// A config with one queue per behaviour of [`ODD_HANDLER`].
fn odd_config(db: &TestDb) -> std::path::PathBuf {
    let script = db.script("odd.sh", ODD_HANDLER);
    let mut queues = String::new();
    for q in ["raw", "big", "flood", "longline", "closer", "orphan"] {
        queues += &format!(
            "\n[[queue]]\nname = \"{q}\"\ncommand = [\"{}\"]\nmax_attempts = 1\n",
            script.display()
        );
    }
    db.config("concurrency = 4", &queues)
}

/// Peak resident memory of a process, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn odd_payloads_reach_the_handler_byte_for_byte_and_odd_output_stays_one_line() {
    let db = TestDb::new("odd_payloads").await;
    let config = odd_config(&db);
    let mut conn = db.conn().await;
    let payloads: Vec<Vec<u8>> = vec![
        b"a\0b\0\0c".to_vec(),
        vec![0xff, 0xfe, 0x80, 0x00, b'x', 0xc3],
        b"\x1b[2J\r\nline two\n".to_vec(),
        Vec::new(),
    ];
    let mut ids = Vec::new();
    for p in &payloads {
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload) VALUES ('raw', ?)",
            (p.clone(),),
        )
        .await
        .unwrap();
        ids.push(conn.last_insert_id().unwrap());
    }
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", ids.len() as u64, 30).await;
    for (id, p) in ids.iter().zip(&payloads) {
        let got = std::fs::read(db.path(&format!("in.{id}"))).unwrap();
        assert_eq!(&got, p, "job {id}'s payload changed on its way");
    }

    // The log: still one event per line, valid UTF-8, no raw NUL, escape or carriage return;
    // the odd bytes shown as U+FFFD.
    let log = std::fs::read(&worker.log).unwrap();
    let log = String::from_utf8(log).expect("the log is valid UTF-8");
    assert!(!log.contains(['\0', '\x1b', '\r']), "{log:?}");
    let out = log
        .lines()
        .find(|l| l.contains(&format!("job_id={} stream=\"stdout\"", ids[0])))
        .unwrap_or_else(|| panic!("no stdout line for job {}:\n{log}", ids[0]));
    assert!(
        out.contains("out\u{FFFD}nul \u{FFFD}\u{FFFD} bad utf-8 \u{FFFD}[31m escape"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payload_of_the_columns_full_16_mib_is_handled() {
    let db = TestDb::new("payload_16m").await;
    let config = odd_config(&db);
    // Made on the server, so the INSERT itself is small; the claim must read a row bigger
    // than the server's default max_allowed_packet (16 MiB).
    let id = db
        .insert_sql("INSERT INTO myjob_jobs (queue, payload) VALUES ('big', REPEAT('x', 16777215))")
        .await;
    let small = db.insert("q", &["x"]).await[0];
    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id IN ({id}, {small}) AND status = 'done'"), 2, 60)
        .await;
    let got = std::fs::read_to_string(db.path(&format!("in.{id}"))).unwrap();
    assert_eq!(got.trim(), "16777215");
    assert!(
        !worker.log_text().contains("reconnecting"),
        "{}",
        worker.log_text()
    );
}

/// Eight payloads of 15 MiB at concurrency 8, over a limit of 1 MiB: each fails with a reason
/// that names the limit, its payload never loaded, and the worker's memory stays where it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_over_max_payload_bytes_fails_its_job_without_being_loaded() {
    let db = TestDb::new("payload_limit").await;
    let config = db.config("concurrency = 8\nmax_payload_bytes = 1048576", "");
    db.insert_rows(
        "(queue, payload)",
        "('q', REPEAT('x', 15 * 1024 * 1024))",
        8,
    )
    .await;
    let fits = db
        .insert_sql("INSERT INTO myjob_jobs (queue, payload) VALUES ('q', REPEAT('y', 1048576))")
        .await;
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'failed'", 8, 60).await;
    db.wait_count(&format!("id = {fits} AND status = 'done'"), 1, 30)
        .await;
    let mut conn = db.conn().await;
    let errors: Vec<String> = conn
        .query("SELECT last_error FROM myjob_jobs WHERE status = 'failed'")
        .await
        .unwrap();
    for e in &errors {
        assert_eq!(
            e,
            "permanent failure on attempt 1: its payload of 15728640 bytes is over \
             worker.max_payload_bytes (1048576), and was not loaded: raise the limit, or pass a \
             reference to the data instead"
        );
    }
    // 8 × 15 MiB would be 120 MiB, half again as much at the peak.
    let peak = peak_rss_kib(worker.pid());
    assert!(peak < 48 * 1024, "peak RSS {peak} KiB");
    let runs = std::fs::read_to_string(db.path("runs")).unwrap_or_default();
    assert_eq!(
        runs.lines().count(),
        1,
        "only the job that fits ran: {runs}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_writing_100_mib_is_logged_in_part_and_costs_no_memory() {
    let db = TestDb::new("flood").await;
    let config = odd_config(&db);
    let worker = Worker::start(&config, "1");
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for q in ["flood", "longline"] {
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload) VALUES (?, '')",
            (q,),
        )
        .await
        .unwrap();
        ids.push(conn.last_insert_id().unwrap());
    }
    db.wait_count("status = 'done'", 2, 120).await;

    let log = worker.log_text();
    for id in &ids {
        let lines = log
            .lines()
            .filter(|l| l.contains(&format!("job_id={id} stream=\"stdout\"")))
            .count();
        // 1,000 lines of output, then one line saying how many more there were.
        assert_eq!(lines, 1001, "job {id}: {lines} lines logged");
    }
    // `yes` writes 11-byte lines (and a last, cut one); the long line is split every 4 KiB.
    let flood_lines = 104_857_600u64.div_ceil(11);
    let long_lines = 104_857_600u64 / 4096;
    for more in [flood_lines - 1000, long_lines - 1000] {
        assert!(
            log.contains(&format!("{more} more lines not logged")),
            "{more}"
        );
    }
    // Lines longer than 4 KiB are split, so no log line is much longer.
    assert!(log.lines().all(|l| l.len() < 4096 + 200));
    let peak = peak_rss_kib(worker.pid());
    assert!(peak < 40 * 1024, "peak RSS {peak} KiB");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_that_closes_stdin_early_or_leaves_a_child_behind() {
    let db = TestDb::new("rude_handlers").await;
    let config = odd_config(&db);
    let mut conn = db.conn().await;
    // 1 MiB: more than a pipe holds, so myjob is still writing when stdin is closed.
    let big = vec![b'z'; 1 << 20];
    conn.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload) VALUES ('closer', ?)",
        (big,),
    )
    .await
    .unwrap();
    let closer = conn.last_insert_id().unwrap();
    let orphan = db
        .insert_sql("INSERT INTO myjob_jobs (queue, payload) VALUES ('orphan', '')")
        .await;
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 2, 30).await;
    let log = worker.log_text();
    assert!(
        log.contains(&format!("closed stdin job_id={closer} stream=\"stdout\"")),
        "{log}"
    );

    // The handler's child was killed with its process group once the handler exited.
    let child: i32 = std::fs::read_to_string(db.path(&format!("child.{orphan}")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let start = Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{child}/stat")).ok();
        // Gone, or a zombie waiting for init to reap it.
        if state.is_none_or(|s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z')) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the handler's child {child} outlived it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A descriptor myjob inherited without FD_CLOEXEC (a careless parent, a shell's `7>file`)
/// is not passed on to its handlers: they get stdin, stdout and stderr only.
#[tokio::test(flavor = "multi_thread")]
async fn a_descriptor_myjob_inherited_does_not_reach_its_handlers() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let db = TestDb::new("inherited_fd").await;
    let script = db.script(
        "fds.sh",
        "#!/bin/sh\nls /proc/self/fd > DIR/fds.$MYJOB_JOB_ID\n",
    );
    let config = db.config(
        "",
        &format!(
            "\n[[queue]]\nname = \"fds\"\ncommand = [\"{}\"]\n",
            script.display()
        ),
    );
    let log = std::fs::File::create(db.path("worker.log")).unwrap();
    let leaked = std::fs::File::create(db.path("leaked")).unwrap();
    let leaked_fd = leaked.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_myjob"));
    cmd.args(["--config", config.to_str().unwrap(), "run"])
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: dup2 is async-signal-safe; the closure touches nothing else. dup2 leaves the
    // new descriptor without FD_CLOEXEC, as a parent that forgot it would.
    unsafe {
        cmd.pre_exec(move || match nix::libc::dup2(leaked_fd, 7) {
            7 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    let worker = common::KillOnDrop(cmd.spawn().unwrap());
    drop(leaked);
    // myjob itself has fd 7: the test sets up what it means to.
    let target = std::fs::read_link(format!("/proc/{}/fd/7", worker.0.id())).ok();
    assert_eq!(target, Some(db.path("leaked")));
    let id = db.insert("fds", &[""]).await[0];
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
    drop(worker);
    let fds = std::fs::read_to_string(db.path(&format!("fds.{id}"))).unwrap();
    let fds: Vec<&str> = fds.lines().collect();
    assert!(fds.contains(&"2"), "{fds:?}");
    assert!(
        !fds.contains(&"7"),
        "the handler got myjob's inherited fd 7: {fds:?}"
    );
}
