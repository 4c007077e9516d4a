//! The docs against the code and against real output, so that they cannot drift: every
//! console block of README.md and docs/ that shows myjob's output is run against a real
//! server holding the rows the example implies; the lists the docs give (exit codes, the
//! handler's variables, connections per instance) against the code or a running instance;
//! every shipped config through `check-config`, each commented-out example uncommented in
//! turn; and the contributing page's tables against the files they name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{myjob, TestDb, Worker};
use mysql_async::prelude::*;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// README.md and every page of docs/, with their paths.
fn pages() -> Vec<(String, String)> {
    let mut pages = vec![("README.md".to_owned(), read("README.md"))];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_str().unwrap());
        pages.push((name.clone(), read(&name)));
    }
    pages
}

/// One `$ myjob …` line of a console block and the output shown under it.
#[derive(Debug)]
struct Shown {
    args: Vec<String>,
    output: Vec<String>,
}

/// The console blocks of `text`, each as its `$ myjob` commands that show output.
fn console_blocks(text: &str) -> Vec<Vec<Shown>> {
    let mut blocks = Vec::new();
    let mut block: Option<Vec<Shown>> = None;
    for line in text.lines() {
        // A block inside a list item is indented.
        let line = line.trim_start();
        match (&mut block, line) {
            (None, "```console") => block = Some(Vec::new()),
            (Some(_), "```") => blocks.push(block.take().unwrap()),
            (Some(b), l) if l.starts_with("$ ") => {
                // A comment after the command, `  # …`, is the docs' own.
                let command = l[2..].split("  #").next().unwrap().trim();
                let words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
                b.push(Shown {
                    args: words,
                    output: Vec::new(),
                });
            }
            (Some(b), l) => {
                if let Some(last) = b.last_mut() {
                    last.output.push(l.to_owned());
                }
            }
            (None, _) => {}
        }
    }
    blocks
        .into_iter()
        .map(|b: Vec<Shown>| {
            b.into_iter()
                .filter(|s| s.args.first().is_some_and(|w| w == "myjob") && !s.output.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|b: &Vec<Shown>| !b.is_empty())
        .collect()
}

/// A line as compared: columns aligned by runs of spaces count as one space, and what no
/// fixture can pin is masked: a queue's age (`42s`, `1m 5s`) is `<age>`, a time (`2026-11-27
/// 01:00:00`, `2026-11-23T07:01:02.000000Z`) `<time>`.
fn masked(line: &str) -> String {
    let is_age = |w: &str| {
        w.len() > 1
            && w.ends_with(['s', 'm', 'h', 'd'])
            && w[..w.len() - 1].bytes().all(|b| b.is_ascii_digit())
    };
    let shape = |w: &str, pattern: &str| {
        w.len() >= pattern.len()
            && w.bytes().zip(pattern.bytes()).all(|(b, p)| match p {
                b'9' => b.is_ascii_digit(),
                _ => b == p,
            })
    };
    let mut out: Vec<String> = Vec::new();
    for w in line.split_whitespace() {
        let word = if is_age(w) {
            "<age>"
        } else if shape(w, "9999-99-99") || shape(w, "99:99:99") {
            "<time>"
        } else {
            w
        };
        // `1m 5s` is one age, `2026-11-27 01:00:00` one time.
        if (word == "<age>" || word == "<time>") && out.last().is_some_and(|l| l == word) {
            continue;
        }
        out.push(word.to_owned());
    }
    out.join(" ")
}

/// Inserts `n` rows of `values` (SQL, one row) into the columns `columns` of `myjob_jobs`.
async fn rows(db: &TestDb, columns: &str, values: &str, n: usize) {
    db.insert_rows(columns, values, n).await;
}

/// The rows the example of `first` implies, in `db`; and what the config needs beside the
/// examples' queues.
async fn fixture(db: &TestDb, first: &[String]) -> &'static str {
    let cols = "(queue, payload, status, run_at, finished_at)";
    match first[1..].join(" ").as_str() {
        "stats" => {
            rows(db, cols, "('email', 'x', 'done', NOW(6), NOW(6))", 9120).await;
            rows(
                db,
                cols,
                "('sms', 'x', 'pending', NOW(6) - INTERVAL 42 SECOND, NULL)",
                1208,
            )
            .await;
            rows(
                db,
                "(queue, payload, status, concurrency_key)",
                "('sms', 'x', 'blocked', 'k')",
                3,
            )
            .await;
            rows(db, "(queue, payload, status)", "('sms', 'x', 'suspect')", 1).await;
            rows(
                db,
                cols,
                "('sms', 'x', 'scheduled', NOW(6) + INTERVAL 1 HOUR, NULL)",
                14,
            )
            .await;
            rows(
                db,
                "(queue, payload, status, claimed_at)",
                "('sms', 'x', 'claimed', NOW(6))",
                8,
            )
            .await;
            rows(db, cols, "('sms', 'x', 'done', NOW(6), NOW(6))", 5318).await;
            rows(db, cols, "('sms', 'x', 'failed', NOW(6), NOW(6))", 3).await;
            rows(db, cols, "('sms', 'x', 'cancelled', NOW(6), NOW(6))", 1).await;
        }
        "list --status failed" => {
            let mut conn = db.conn().await;
            conn.query_drop("SET time_zone = '+00:00'").await.unwrap();
            conn.query_drop(
                "INSERT INTO myjob_jobs (id, queue, payload, status, attempts, max_attempts, \
                     run_at, created_at, claimed_at, finished_at, batch_id, owner_conn, \
                     owner_server, worker, last_error) \
                 VALUES (4711, 'sms', REPEAT('x', 27), 'failed', 5, 5, '2026-11-23 07:01:02', \
                     '2026-11-23 06:50:40', '2026-11-23 07:01:02.004112', \
                     '2026-11-23 07:01:03', 8841962517, 31337, 'db1:3306/1763900000', \
                     'app1:812:1', 'attempt 5 of 5: exit status 1; stderr: gateway said 503')",
            )
            .await
            .unwrap();
        }
        "schedules" => {
            let mut conn = db.conn().await;
            conn.query_drop(
                "INSERT INTO myjob_schedule_ticks (schedule, tick, job_id, definition) \
                 VALUES ('nightly-report', NOW(6) - INTERVAL 1 HOUR, 4711, \
                     'cron \"0 2 * * *\" in Europe/Berlin')",
            )
            .await
            .unwrap();
            return "[[schedule]]\nname = \"nightly-report\"\nqueue = \"reports\"\n\
                    cron = \"0 2 * * *\"\ntimezone = \"Europe/Berlin\"\n\n\
                    [[schedule]]\nname = \"sync-prices\"\nqueue = \"prices\"\n\
                    every = \"5m\"\ncatch_up = \"none\"\n";
        }
        "cancel 4712 4713" => {
            let mut conn = db.conn().await;
            conn.query_drop(
                "INSERT INTO myjob_jobs (id, queue, payload, status) VALUES (4712, 'sms', 'x', 'pending')",
            )
            .await
            .unwrap();
            conn.query_drop(
                "INSERT INTO myjob_jobs (id, queue, payload, status, batch_id, owner_conn, \
                     claimed_at, attempts) \
                 VALUES (4713, 'sms', 'x', 'claimed', 7, 999999999, NOW(6), 1)",
            )
            .await
            .unwrap();
        }
        // [retention]'s defaults: done 7 days, failed and cancelled 30.
        "purge" => {
            let old = "NOW(6) - INTERVAL 40 DAY";
            rows(
                db,
                cols,
                &format!("('email', 'x', 'done', {old}, {old})"),
                1200,
            )
            .await;
            rows(
                db,
                cols,
                &format!("('email', 'x', 'failed', {old}, {old})"),
                38,
            )
            .await;
            rows(
                db,
                cols,
                &format!("('email', 'x', 'cancelled', {old}, {old})"),
                2,
            )
            .await;
            let days2 = "NOW(6) - INTERVAL 2 DAY";
            rows(
                db,
                cols,
                &format!("('sms', 'x', 'done', {days2}, {days2})"),
                812,
            )
            .await;
            rows(db, cols, "('sms', 'x', 'failed', NOW(6), NOW(6))", 3).await;
        }
        other => panic!("no fixture for the docs' `myjob {other}`: add one to tests/docs.rs"),
    }
    ""
}

#[tokio::test(flavor = "multi_thread")]
async fn every_console_block_is_what_myjob_prints() {
    let mut checked = 0;
    for (page, text) in pages() {
        for (i, block) in console_blocks(&text).into_iter().enumerate() {
            let db = TestDb::new(&format!("docs_block_{checked}")).await;
            let extra = fixture(&db, &block[0].args).await;
            // The examples' queues, which `stats` lists whether or not they have jobs.
            let config = db.path("docs.toml");
            std::fs::write(
                &config,
                format!(
                    "[database]\nurl = \"{}\"\n\n[[queue]]\nname = \"email\"\ncommand = [\"/bin/true\"]\n\n\
                     [[queue]]\nname = \"sms\"\ncommand = [\"/bin/true\"]\n\n{extra}",
                    db.url
                ),
            )
            .unwrap();
            for shown in &block {
                let mut args = vec!["--config", config.to_str().unwrap()];
                args.extend(shown.args[1..].iter().map(String::as_str));
                let out = myjob(&args, b"");
                assert!(
                    out.status.success(),
                    "{page}, block {i}: `{}` failed: {out:?}",
                    shown.args.join(" ")
                );
                let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(masked)
                    .collect();
                let want: Vec<String> = shown.output.iter().map(|l| masked(l)).collect();
                assert_eq!(
                    got,
                    want,
                    "{page}, block {i}: `{}` prints otherwise than the docs show",
                    shown.args.join(" ")
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} console blocks found");
}

/// The rows of a Markdown table whose first cell is a code span: the code spans.
fn first_cells(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .map(|c| c.trim().trim_matches('`').to_owned())
        .collect()
}

#[test]
fn the_exit_codes_page_lists_the_codes_the_code_has() {
    let page = read("docs/exit-codes.md");
    let listed: BTreeSet<u8> = first_cells(&page)
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    let mut codes: BTreeSet<u8> = myjob::error::ExitCode::ALL
        .iter()
        .map(|c| *c as u8)
        .collect();
    codes.insert(0);
    assert_eq!(listed, codes);
    // The codes only a few commands exit with: each of those commands is named in the row.
    let row = |code: &str| {
        page.lines()
            .find(|l| l.starts_with(&format!("| {code} |")))
            .unwrap()
            .to_owned()
    };
    for (code, variant) in [("65", "Data"), ("75", "TempFail")] {
        let mut commands = Vec::new();
        for dir in ["src/cli", "src/cli/lock", "src"] {
            for e in std::fs::read_dir(root().join(dir)).unwrap() {
                let path = e.unwrap().path();
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if !text.contains(&format!("ExitCode::{variant}")) {
                    continue;
                }
                let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
                let command = match (dir, stem.as_str()) {
                    ("src/cli/lock", "mod") => "lock".to_owned(),
                    (_, "mod" | "error" | "table") => continue,
                    (_, s) => s.to_owned(),
                };
                commands.push(command);
            }
        }
        assert!(!commands.is_empty(), "{variant}");
        let row = row(code);
        for c in commands {
            assert!(
                row.contains(&c),
                "the row of {code} does not name `{c}`: {row}"
            );
        }
    }
}

/// The README's table of a job's variables is what a handler gets.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_names_every_variable_a_handler_gets() {
    let readme = read("README.md");
    let listed: BTreeSet<String> = first_cells(&readme)
        .into_iter()
        .filter(|c| c.starts_with("MYJOB_"))
        .collect();
    let db = TestDb::new("docs_env").await;
    let config = db.config("", "");
    let id = db.insert("q", &["env"]).await[0];
    let _w = Worker::start(&config, "1");
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 30)
        .await;
    let env = std::fs::read_to_string(db.path(&format!("env.{id}"))).unwrap();
    let got: BTreeSet<String> = env
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_owned()))
        .filter(|k| k.starts_with("MYJOB_"))
        .collect();
    assert_eq!(
        listed, got,
        "the README's variables and the handler's differ"
    );
}

/// The connections of the test database's instance, as the server lists them.
async fn connections(db: &TestDb) -> usize {
    let mut conn = db.conn().await;
    let rows: Vec<mysql_async::Row> = conn.query("SHOW PROCESSLIST").await.unwrap();
    let own: u64 = conn
        .query_first("SELECT CONNECTION_ID()")
        .await
        .unwrap()
        .unwrap();
    rows.into_iter()
        .filter(|r| r.get::<Option<String>, _>(3).flatten().as_deref() == Some(db.name.as_str()))
        .filter(|r| r.get::<u64, _>(0) != Some(own))
        .count()
}

async fn wait_connections(db: &TestDb, n: usize) {
    let start = Instant::now();
    loop {
        let got = connections(db).await;
        if got == n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{got} connections, {n} expected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How it works gives up to five connections an instance: the consumer's, the reaper's and
/// the stager's, one more once scraped, one more with schedules.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_holds_the_connections_the_docs_give() {
    let docs = read("docs/how-it-works.md");
    assert!(docs.contains("**Up to five connections per instance**"));
    let db = TestDb::new("docs_connections").await;
    let port = common::scrape::free_port();
    let base = std::fs::read_to_string(db.config("", "")).unwrap().replace(
        "listen = \"\"",
        &format!("listen = \"127.0.0.1:{}\"", port - 1),
    );
    let plain = db.path("plain.toml");
    std::fs::write(&plain, &base).unwrap();
    let worker = Worker::start(&plain, "1");
    worker.wait_log("ready", 20).await;
    wait_connections(&db, 3).await;
    common::scrape::get(port, "/metrics", None);
    wait_connections(&db, 4).await;
    drop(worker);
    wait_connections(&db, 0).await;
    let scheduled = db.path("scheduled.toml");
    std::fs::write(
        &scheduled,
        format!("{base}\n[[schedule]]\nname = \"s\"\nqueue = \"q\"\nevery = \"1h\"\n"),
    )
    .unwrap();
    let worker = Worker::start(&scheduled, "1");
    worker.wait_log("ready", 20).await;
    common::scrape::get(port, "/metrics", None);
    wait_connections(&db, 5).await;
}

/// A shipped config as `check-config` can take it here: handlers that are not on this
/// machine become /bin/true, and the files it names (a password, a CA) are the test's own.
fn runnable(text: &str, dir: &Path) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        if let Some(rest) = line.strip_prefix("command = [\"") {
            let program = rest.split('"').next().unwrap();
            let exists = root().join(program).exists() || Path::new(program).exists();
            if !exists {
                line = line.replacen(program, "/bin/true", 1);
            }
        }
        out += &line.replace("/etc/myjob/", &format!("{}/", dir.display()));
        out.push('\n');
    }
    out
}

/// `myjob check-config` of `text`: its exit code and its stderr.
fn check(text: &str, dir: &Path, name: &str) -> (Option<i32>, String) {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = myjob(&["--config", path.to_str().unwrap(), "check-config"], b"");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `# key = value` in a table that is not itself commented out: the line's index.
fn commented_keys(text: &str) -> Vec<usize> {
    let mut in_commented_table = false;
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('[') {
            in_commented_table = false;
        } else if line.starts_with("# [") {
            in_commented_table = true;
        } else if !in_commented_table {
            let setting = line.strip_prefix("# ").unwrap_or("");
            let key = setting.split(" = ").next().unwrap_or("");
            if setting.contains(" = ")
                && !key.is_empty()
                && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            {
                found.push(i);
            }
        }
    }
    found
}

#[test]
fn every_shipped_config_passes_check_config_with_each_example_uncommented() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("db-password"), "secret\n").unwrap();
    std::fs::write(
        dir.path().join("db-ca.pem"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in ["db-password", "db-ca.pem"] {
        std::fs::set_permissions(dir.path().join(f), std::fs::Permissions::from_mode(0o600))
            .unwrap();
    }
    let mut shipped = vec![
        "config/myjob.toml".to_owned(),
        "config/local.toml".to_owned(),
    ];
    for e in std::fs::read_dir(root().join("examples")).unwrap() {
        let toml = e.unwrap().path().join("myjob.toml");
        if toml.exists() {
            shipped.push(toml.strip_prefix(root()).unwrap().display().to_string());
        }
    }
    assert!(shipped.len() >= 4, "{shipped:?}");
    for name in &shipped {
        let text = runnable(&read(name), dir.path());
        let (code, err) = check(&text, dir.path(), "shipped.toml");
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    // The reference file's commented-out examples, each in turn. A key that applies only
    // beside another (rate_burst with rate_limit, a persistent queue's keys) comes with it.
    let reference = runnable(&read("config/myjob.toml"), dir.path());
    let lines: Vec<&str> = reference.lines().collect();
    let companions = [
        ("rate_burst", "rate_limit"),
        ("max_jobs_per_process", "persistent"),
        ("idle_timeout", "persistent"),
    ];
    for i in commented_keys(&reference) {
        let key = lines[i][2..].split(" = ").next().unwrap();
        let mut variant: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
        variant[i] = lines[i][2..].to_owned();
        if key == "password_file" {
            // Not with a password in the url: the reference's has none.
            assert!(!lines
                .iter()
                .any(|l| l.starts_with("url = \"mysql://myjob:")));
        }
        for (k, with) in companions {
            if k == key {
                if with == "persistent" {
                    let at = variant
                        .iter()
                        .position(|l| l == "persistent = false")
                        .unwrap();
                    variant[at] = "persistent = true".into();
                } else {
                    let at = lines
                        .iter()
                        .position(|l| l.starts_with(&format!("# {with} = ")))
                        .unwrap();
                    variant[at] = lines[at][2..].to_owned();
                }
            }
        }
        let (code, err) = check(&variant.join("\n"), dir.path(), "variant.toml");
        assert_eq!(
            code,
            Some(0),
            "config/myjob.toml with `{}` uncommented: {err}",
            lines[i]
        );
    }
    // The commented-out [[schedule]]: once with its cron (and time zone), once with its
    // every, each with the rest of its keys.
    let at = lines.iter().position(|l| *l == "# [[schedule]]").unwrap();
    for drop in ["every", "cron"] {
        let mut variant: Vec<String> = lines[..at].iter().map(|l| (*l).to_owned()).collect();
        for l in &lines[at..] {
            let setting = &l[2..];
            let key = setting.split(" = ").next().unwrap_or("");
            let skip = key == drop || (drop == "cron" && key == "timezone");
            if *l == "# [[schedule]]" || (setting.contains(" = ") && !skip) {
                variant.push(setting.to_owned());
            }
        }
        let text = variant
            .join("\n")
            .replace("queue = \"reports\"", "queue = \"default\"");
        let (code, err) = check(&text, dir.path(), "schedule.toml");
        assert_eq!(
            code,
            Some(0),
            "the [[schedule]] example without `{drop}`: {err}"
        );
    }
}

#[test]
fn the_contributing_page_names_every_source_and_test_file() {
    let page = read("docs/contributing.md");
    let named =
        |path: &str| page.contains(&format!("`{path}`")) || page.contains(&format!("`{path}/`"));
    // Every file and folder under src/: by its path, or by its name in its folder's row.
    let rows: Vec<&str> = page.lines().filter(|l| l.starts_with("| `src/")).collect();
    let mut missing = Vec::new();
    let mut dirs = vec![String::from("src")];
    while let Some(dir) = dirs.pop() {
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| `{dir}/`")))
            .copied()
            .unwrap_or("");
        for e in std::fs::read_dir(root().join(&dir)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_str().unwrap().to_owned();
            let path = format!("{dir}/{name}");
            let in_row = row.contains(&format!("`{name}`")) || row.contains(&format!("`{name}/`"));
            if !named(&path) && !in_row {
                missing.push(path.clone());
            }
            if e.file_type().unwrap().is_dir() {
                dirs.push(path);
            }
        }
    }
    for e in std::fs::read_dir(root().join("tests")).unwrap() {
        let name = e.unwrap().file_name().to_str().unwrap().to_owned();
        if name.ends_with(".rs") && !named(&format!("tests/{name}")) {
            missing.push(format!("tests/{name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/contributing.md does not name {missing:?}"
    );
    // And names nothing that is gone.
    for cell in first_cells(&page) {
        for path in cell.split("`, `") {
            let path = path.trim_matches('`');
            if path.starts_with("src/") || path.starts_with("tests/") {
                assert!(
                    root().join(path).exists(),
                    "docs/contributing.md names {path}, which is gone"
                );
            }
        }
    }
}
