//! The commands' contracts: exit codes and one-line errors for bad configs and bad jobs, the
//! schema checks, and `migrate` run twice.

use crate::common::{edited, myjob, TestDb};
use mysql_async::prelude::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one error line, with the log's timestamp and level cut off.
fn error_line(out: &std::process::Output) -> String {
    let text = stderr(out);
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{text}");
    errors[0]
        .split_once("ERROR ")
        .map_or(errors[0], |(_, m)| m)
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_configs_exit_78_naming_file_and_key() {
    let db = TestDb::new("bad_configs").await;
    let good = std::fs::read_to_string(db.config("", "")).unwrap();
    let not_executable = db.path("plain.sh");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("empty", String::new(), "database.url: missing"),
        (
            "unknown key",
            good.replace("[worker]", "[worker]\nthreads = 4"),
            "unknown field `threads`",
        ),
        (
            "wrong type",
            good.replace("[worker]", "[worker]\nconcurrency = \"four\""),
            "worker.concurrency",
        ),
        (
            "zero duration",
            good.replace("stale_after = \"2s\"", "stale_after = \"0s\""),
            "reaper.stale_after: \"0s\" must be longer than zero",
        ),
        (
            "negative duration",
            good.replace("interval = \"500ms\"", "interval = \"-5s\""),
            "reaper.interval",
        ),
        (
            "concurrency 0",
            good.replace("[worker]", "[worker]\nconcurrency = 0"),
            "worker.concurrency: 0 is out of range",
        ),
        (
            "concurrency huge",
            good.replace("[worker]", "[worker]\nconcurrency = 1000000"),
            "worker.concurrency: 1000000 is out of range",
        ),
        (
            "empty command",
            good.replace(
                &format!("command = [\"{}\"]", db.path("handler.sh").display()),
                "command = []",
            ),
            "queue[0].command: must name a program",
        ),
        (
            "missing handler",
            good.replace("handler.sh", "nowhere.sh"),
            "queue[0].command",
        ),
        (
            "not executable",
            good.replace("handler.sh", "plain.sh"),
            "is not executable",
        ),
        (
            "duplicate queue",
            format!("{good}\n[[queue]]\nname = \"q\"\ncommand = [\"/bin/true\"]\n"),
            "queue[1].name: queue \"q\" is defined twice",
        ),
        (
            "no host",
            good.replace(&db.url, "mysql:///test"),
            "database.url: has no host",
        ),
        (
            "bad password file",
            good.replace(&db.url, "mysql://myjob@127.0.0.1:3306/x")
                .replace(
                    "[database]",
                    &format!(
                        "[database]\npassword_file = \"{}\"",
                        db.dir.path().display()
                    ),
                ),
            "database.password_file: cannot read",
        ),
    ];
    for (what, text, needle) in cases {
        let path = db.path("bad.toml");
        std::fs::write(&path, &text).unwrap();
        let p = path.to_str().unwrap();
        for args in [
            vec!["--config", p, "check-config"],
            vec!["--config", p, "run"],
        ] {
            let out = myjob(&args, b"");
            assert_eq!(out.status.code(), Some(78), "{what}: {}", stderr(&out));
            let line = error_line(&out);
            assert!(line.contains(p), "{what}: the file is not named: {line}");
            assert!(
                line.contains(needle),
                "{what}: expected {needle:?} in: {line}"
            );
        }
    }
    // A binary file.
    let path = db.path("binary.toml");
    std::fs::write(&path, [0u8, 159, 146, 150, 0xff, 0]).unwrap();
    let out = myjob(&["--config", path.to_str().unwrap(), "check-config"], b"");
    assert_eq!(out.status.code(), Some(78));
    assert!(error_line(&out).contains("is not a UTF-8 text file"));
    // A missing file.
    let out = myjob(
        &["--config", "/nonexistent/myjob.toml", "check-config"],
        b"",
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(error_line(&out).contains("/nonexistent/myjob.toml: cannot read"));
    // And the good one passes.
    let out = myjob(
        &[
            "--config",
            db.path("myjob.toml").to_str().unwrap(),
            "check-config",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_jobs_exit_65_and_insert_nothing() {
    let db = TestDb::new("bad_jobs").await;
    let config = db.config("", "");
    let c = config.to_str().unwrap();
    let long_key = "k".repeat(192);
    let huge = vec![b'x'; 16 * 1024 * 1024];
    let cases: Vec<(Vec<&str>, &[u8], &str)> = vec![
        (vec!["--queue", "has space", "x"], b"", "--queue"),
        (vec!["--queue", "it's", "x"], b"", "--queue"),
        (vec!["--unique-key", &long_key, "x"], b"", "--unique-key"),
        (vec!["--delay", "soon", "x"], b"", "--delay"),
        (vec!["--delay", "-5s", "x"], b"", "--delay"),
        (vec!["--max-attempts", "0", "x"], b"", "--max-attempts"),
        (vec!["-"], &huge, "payload: larger than"),
    ];
    for (args, stdin, needle) in cases {
        let mut all = vec!["--config", c, "enqueue"];
        all.extend(&args);
        let out = myjob(&all, stdin);
        assert_eq!(out.status.code(), Some(65), "{args:?}: {}", stderr(&out));
        assert!(
            error_line(&out).contains(needle),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(db.count("1").await, 0);
    // Over the config's max_payload_bytes: its workers would fail it unread.
    let small = db.path("small.toml");
    edited(
        &config,
        &small,
        &[("[worker]\n", "[worker]\nmax_payload_bytes = 1000\n")],
    );
    let s = small.to_str().unwrap();
    let out = myjob(&["--config", s, "enqueue", "-"], &[b'x'; 1001]);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        error_line(&out).contains("payload: 1001 bytes are over worker.max_payload_bytes (1000)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(db.count("1").await, 0);
    let out = myjob(&["--config", s, "enqueue", "-"], &[b'x'; 1000]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    db.conn()
        .await
        .query_drop("DELETE FROM myjob_jobs")
        .await
        .unwrap();

    // A job the server refuses (here a trigger's SIGNAL) is bad input too: 65, one line.
    let mut conn = db.conn().await;
    conn.query_drop(
        "CREATE TRIGGER refuse BEFORE INSERT ON myjob_jobs FOR EACH ROW \
         IF NEW.queue = 'refused' THEN \
           SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no jobs for this queue'; \
         END IF",
    )
    .await
    .unwrap();
    let out = myjob(&["--config", c, "enqueue", "--queue", "refused", "x"], b"");
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        error_line(&out).contains("no jobs for this queue"),
        "{}",
        stderr(&out)
    );
    conn.query_drop("DROP TRIGGER refuse").await.unwrap();

    // `-` with an empty stdin is an empty payload, and a payload at the limit fits.
    let out = myjob(&["--config", c, "enqueue", "-"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(db.count("payload = ''").await, 1);
    // A payload at the column's limit fits if the server's max_allowed_packet lets it
    // through, and is refused clearly if not.
    let mut conn = db.conn().await;
    let packet: u64 = conn
        .query_first("SELECT @@max_allowed_packet")
        .await
        .unwrap()
        .unwrap();
    let out = myjob(&["--config", c, "enqueue", "--queue", "q", "-"], &huge[1..]);
    if packet > 17 * 1024 * 1024 {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(db.count("LENGTH(payload) = 16777215").await, 1);
    } else {
        assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
        assert!(error_line(&out).contains("max_allowed_packet"));
        assert_eq!(db.count("1").await, 1);
    }
    // Usage errors are 64.
    assert_eq!(
        myjob(&["--config", c, "enqueue", "--priority", "high"], b"")
            .status
            .code(),
        Some(64)
    );
    assert_eq!(myjob(&["frobnicate"], b"").status.code(), Some(64));
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_twice_does_nothing_and_run_refuses_a_wrong_schema() {
    let db = TestDb::empty("schema").await;
    let config = db.config("", "");
    let c = config.to_str().unwrap();

    let out = myjob(&["--config", c, "run"], b"");
    assert_eq!(out.status.code(), Some(78));
    assert!(error_line(&out).contains("run `myjob migrate` first"));
    // migrate --check says the same, and changes nothing.
    let out = myjob(&["--config", c, "migrate", "--check"], b"");
    assert_eq!(out.status.code(), Some(78));
    assert!(error_line(&out).contains("run `myjob migrate` first"));

    let first = myjob(&["--config", c, "migrate"], b"");
    assert!(first.status.success(), "{}", stderr(&first));
    let all: Vec<u32> = (1..=myjob::store::schema::latest()).collect();
    assert!(
        String::from_utf8_lossy(&first.stdout).contains(&format!("applied migrations: {all:?}"))
    );
    let second = myjob(&["--config", c, "migrate"], b"");
    assert!(String::from_utf8_lossy(&second.stdout).contains("schema is up to date"));
    let check = myjob(&["--config", c, "migrate", "--check"], b"");
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    let mut conn = db.conn().await;
    let n: Option<u64> = conn
        .query_first("SELECT COUNT(*) FROM myjob_schema_migrations")
        .await
        .unwrap();
    assert_eq!(n, Some(all.len() as u64));

    conn.query_drop(
        "INSERT INTO myjob_schema_migrations (version, name) VALUES (99, 'from the future')",
    )
    .await
    .unwrap();
    for cmd in [&["run"][..], &["migrate", "--check"]] {
        let out = myjob(&[&["--config", c][..], cmd].concat(), b"");
        assert_eq!(out.status.code(), Some(78), "{cmd:?}");
        assert!(
            error_line(&out).contains("newer than this myjob knows"),
            "{cmd:?}"
        );
    }

    // The database unreachable: enqueue and migrate (--check too) say so with 69.
    let port = db
        .url
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    edited(&config, &config, &[(&port, "127.0.0.1:1")]);
    let out = myjob(&["--config", c, "enqueue", "x"], b"");
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let line = error_line(&out);
    assert!(
        line.starts_with("database mysql://") && line.contains(": cannot connect: "),
        "{line}"
    );
    let out = myjob(&["--config", c, "migrate", "--check"], b"");
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
}

/// Text from the database (a queue name, a unique key, a worker, an error) reaches the
/// operator's terminal only with its control characters replaced: no escape sequence, carriage
/// return or C1 control in `list`, `show` or `stats`. JSON keeps the text, escaped by serde.
#[tokio::test(flavor = "multi_thread")]
async fn human_output_carries_no_terminal_controls() {
    let db = TestDb::new("cli_controls").await;
    let config = db.config("", "");
    let c = config.to_str().unwrap();
    // The enqueue command refuses such a queue name: an application's plain INSERT does not.
    let mut conn = db.conn().await;
    conn.exec_drop(
        "INSERT INTO myjob_jobs (queue, payload, unique_key, worker, last_error) \
         VALUES (?, 'x', ?, ?, ?)",
        (
            "q\x1b[31mred",
            "key\x1b]0;title\x07\r",
            "host\u{9b}2J:1:1",
            "boom \x1b[2J\x7f\u{85}end",
        ),
    )
    .await
    .unwrap();
    let id = conn.last_insert_id().unwrap().to_string();
    let controls = |s: &str| s.chars().filter(|&c| c.is_control() && c != '\n').count();
    for args in [
        vec!["--config", c, "list"],
        vec!["--config", c, "show", &id],
        vec!["--config", c, "stats"],
    ] {
        let out = myjob(&args, b"");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(
            !out.stdout.contains(&0x1b),
            "{args:?}: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(controls(&text), 0, "{args:?}: {text:?}");
        assert!(text.contains("q\u{FFFD}[31mred"), "{args:?}: {text:?}");
    }
    // JSON is for programs: the text as it is.
    let out = myjob(&["--config", c, "show", &id, "--json"], b"");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["unique_key"], "key\x1b]0;title\x07\r");
    assert_eq!(doc["queue"], "q\x1b[31mred");
}

/// `myjob generate` (the package's man pages and completions): a page per visible command and
/// one for the config, none for the hidden ones; a completion per shell; a bad directory is
/// a one-line usage error.
#[test]
fn generate_writes_the_man_pages_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = myjob(&["generate", "man", d], b"");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    for page in [
        "myjob.1",
        "myjob-run.1",
        "myjob-enqueue.1",
        "myjob-lock.1",
        "myjob.toml.5",
    ] {
        assert!(pages.iter().any(|p| p == page), "{page} missing: {pages:?}");
    }
    assert!(
        !pages
            .iter()
            .any(|p| p.contains("guard") || p.contains("generate")),
        "{pages:?}"
    );
    let run = std::fs::read_to_string(dir.path().join("myjob-run.1")).unwrap();
    assert!(run.contains("instance"), "{run}");

    for (shell, marker) in [
        ("bash", "_myjob()"),
        ("zsh", "#compdef myjob"),
        ("fish", "complete -c myjob"),
    ] {
        let out = myjob(&["generate", "completions", shell], b"");
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("check-config"), "{shell}");
        assert!(
            !script.contains("guard") && !script.contains("generate"),
            "{shell}: a hidden subcommand is offered"
        );
    }

    let missing = dir.path().join("no/such/dir");
    let out = myjob(&["generate", "man", missing.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(64));
    assert!(
        error_line(&out).starts_with(&format!(
            "{}: cannot write the man pages",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );
}
