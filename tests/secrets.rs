//! The database password, in every shape a generator gives it: never in a log line, an
//! error or a journal field; a url whose parse would lose it is refused without echoing it;
//! and files that hold it, or the config that names the handlers, are checked for who may
//! read and write them.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::common;
use crate::common::{myjob, TestDb, Worker};
use mysql_async::prelude::*;

/// Passwords as generators and people write them: base64 with `/` and `+` (one starting
/// with `/`, one with digits before its first `/`), and each character a url gives a meaning.
const SHAPES: &[&str] = &[
    "/s3cr3tPw",
    "12/s3cr3tPw",
    "ab+/cd=ef==",
    "pw@with@at",
    "pw:with:colon",
    "pw?with?query",
    "pw#with#hash",
    "pw%with%pct",
    "pw with space",
    "pwünïcödé",
    "endsWithSlash/",
];

use crate::common::percent_encode as encode;

/// `host:port` of the server under test.
fn host_port() -> String {
    let url = common::server_url();
    let rest = url.split_once("://").unwrap().1;
    rest.rsplit_once('@').map_or(rest, |(_, h)| h).to_owned()
}

/// The pieces of `password` that must appear nowhere: itself, encoded, and its longest run
/// between the characters a url treats apart (what a parse that cut it would show).
fn needles(password: &str) -> Vec<String> {
    let mut n = vec![password.to_owned(), encode(password)];
    if let Some(piece) = password
        .split(['/', '@', ':', '?', '#', '%', '+', '='])
        .max_by_key(|p| p.len())
        .filter(|p| p.len() >= 4)
    {
        n.push(piece.to_owned());
    }
    n
}

fn assert_unsaid(what: &str, text: &str, password: &str) {
    for needle in needles(password) {
        assert!(
            !text.contains(&needle),
            "{what}: the password ({password:?}) shows as {needle:?} in:\n{text}"
        );
    }
}

fn config_with(db: &TestDb, url: &str, name: &str) -> std::path::PathBuf {
    let base = std::fs::read_to_string(db.config("", "")).unwrap();
    let path = db.path(name);
    std::fs::write(&path, base.replace(&db.url, url)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_of_any_shape_is_never_logged_and_a_url_that_loses_it_is_refused() {
    let db = TestDb::new("secrets").await;
    for (i, password) in SHAPES.iter().enumerate() {
        let user = format!("myjob_pw{i}");
        let mut admin = common::create_user(&db, &user, password).await;
        admin
            .query_drop(format!("GRANT ALL ON *.* TO '{user}'@'%'"))
            .await
            .unwrap();

        // Written as the url spec wants it, percent-encoded: it works, and is never said.
        let url = format!(
            "mysql://{user}:{}@{}/{}",
            encode(password),
            host_port(),
            db.name
        );
        let config = config_with(&db, &url, &format!("good{i}.toml"));
        let c = config.to_str().unwrap();
        let checked = myjob(&["--config", c, "check-config"], b"");
        assert_eq!(checked.status.code(), Some(0), "{password:?}: {checked:?}");
        let job = db.insert("q", &["ok"]).await[0];
        let worker = Worker::start(&config, &format!("g{i}"));
        db.wait_count(&format!("id = {job} AND status = 'done'"), 1, 30)
            .await;
        drop(worker);
        let log =
            std::fs::read_to_string(config.with_file_name(format!("worker-g{i}.log"))).unwrap();
        assert!(log.contains(&format!("mysql://{user}@")), "{log}");
        assert_unsaid("a run", &log, password);
        assert_unsaid(
            "check-config",
            &String::from_utf8_lossy(&[checked.stdout, checked.stderr].concat()),
            password,
        );

        // Against a port where nothing listens: the connect retries say the url each time.
        let closed = format!(
            "mysql://{user}:{}@127.0.0.1:9/{}",
            encode(password),
            db.name
        );
        let config = config_with(&db, &closed, &format!("closed{i}.toml"));
        let worker = Worker::start(&config, &format!("c{i}"));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(worker);
        let log =
            std::fs::read_to_string(config.with_file_name(format!("worker-c{i}.log"))).unwrap();
        assert!(log.contains("127.0.0.1:9"), "{log}");
        assert_unsaid("connect retries", &log, password);

        // Written raw: a url whose parse keeps the password whole works; any other is
        // refused, naming the key and not the value.
        let raw = format!("mysql://{user}:{password}@{}/{}", host_port(), db.name);
        let keeps = mysql_async::Opts::from_url(&raw).is_ok_and(|o| {
            o.pass() == Some(*password)
                && o.user() == Some(user.as_str())
                && o.db_name() == Some(db.name.as_str())
        });
        let config = config_with(&db, &raw, &format!("raw{i}.toml"));
        let c = config.to_str().unwrap();
        for command in ["check-config", "run"] {
            let out = myjob(&["--config", c, command], b"");
            let text = String::from_utf8_lossy(&[out.stdout.clone(), out.stderr.clone()].concat())
                .into_owned();
            assert_unsaid(&format!("{command} with a raw url"), &text, password);
            if keeps {
                assert_eq!(command, "check-config");
                assert_eq!(out.status.code(), Some(0), "{password:?}: {text}");
                break;
            }
            assert_eq!(out.status.code(), Some(78), "{password:?}: {text}");
            assert!(
                text.contains(&format!("{c}: database.url: ")) && text.contains("percent-encode"),
                "{password:?}: {text}"
            );
            assert_eq!(text.lines().count(), 1, "{text}");
        }
        admin
            .query_drop(format!("DROP USER '{user}'@'%'"))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_or_password_file_others_may_write_is_warned_of() {
    let db = TestDb::new("writable_config").await;
    // The test account's password moves from the url to a file.
    let opts = mysql_async::Opts::from_url(&db.url).unwrap();
    let password_file = db.path("password");
    std::fs::write(&password_file, opts.pass().unwrap_or("")).unwrap();
    let url = format!(
        "mysql://{}@{}/{}",
        opts.user().unwrap_or("root"),
        host_port(),
        db.name
    );
    let base = std::fs::read_to_string(db.config("", "")).unwrap();
    let config = db.path("shared.toml");
    std::fs::write(
        &config,
        base.replace(&db.url, &url).replace(
            "[database]\n",
            &format!(
                "[database]\npassword_file = \"{}\"\n",
                password_file.display()
            ),
        ),
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let warnings = |mode_config: u32, mode_password: u32| {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode_config)).unwrap();
        std::fs::set_permissions(
            &password_file,
            std::fs::Permissions::from_mode(mode_password),
        )
        .unwrap();
        let out = myjob(&["--config", c, "check-config"], b"");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(warnings(0o640, 0o640), Vec::<String>::new());
    let w = warnings(0o664, 0o640);
    assert!(
        w.len() == 1 && w[0].contains(&format!("{c}: the file is writable by its group")),
        "{w:?}"
    );
    let w = warnings(0o646, 0o602);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("writable by every user"), "{w:?}");
    assert!(
        w[1].contains("database.password_file")
            && w[1].contains("writable by every user")
            && w[1].contains(password_file.to_str().unwrap()),
        "{w:?}"
    );
}
