//! Least privilege and secrets: the daemon, its reaper included, runs with exactly the
//! GRANTs the README gives; the database password shows up nowhere it could leak (logs,
//! `--help`, error messages, STATUS=, the handler's environment, `ps`); and a password file
//! readable by every user is warned about.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common;
use crate::common::{account, edited, kill_recorded_handlers, myjob, NotifySocket, TestDb, Worker};
use mysql_async::prelude::*;
use nix::sys::signal::Signal;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_grants_suffice_and_the_password_leaks_nowhere() {
    let db = TestDb::new("least_priv").await;
    let (user, password) = account(&db, "lp", |_| true).await;
    // The password's random part, which no other text holds by chance.
    let token = password.trim_start_matches("Secret-").to_owned();
    let mut admin = db.conn().await;

    // Instance 1 reads the password from a password_file (0600), instance 2 from its url in
    // a file every user may read: the second is warned about.
    // A rate limit too high to hold anything back: its budget in myjob_queues is taken
    // under the README's GRANTs too.
    // A schedule too, into a queue no instance serves: its ticks are recorded, and the old
    // ones pruned, under the README's GRANTs.
    let base = db.config(
        "concurrency = 4",
        "rate_limit = \"1000/1s\"\n\n[[schedule]]\nname = \"tick\"\nqueue = \"ticks\"\nevery = \"1s\"\n",
    );
    let url = format!("url = \"{}\"", db.url);
    let opts = mysql_async::Opts::from_url(&db.url).unwrap();
    let host_db = format!("{}:{}/{}", opts.ip_or_hostname(), opts.tcp_port(), db.name);
    let secret_file = db.path("password");
    std::fs::write(&secret_file, format!("{password}\n")).unwrap();
    chmod(&secret_file, 0o600);
    let with_file = db.path("with-file.toml");
    let file_url = format!(
        "url = \"mysql://{user}@{host_db}\"\npassword_file = \"{}\"",
        secret_file.display()
    );
    edited(&base, &with_file, &[(url.as_str(), file_url.as_str())]);
    chmod(&with_file, 0o644);
    let with_url = db.path("with-url.toml");
    let inline_url = format!("url = \"mysql://{user}:{password}@{host_db}\"");
    edited(&base, &with_url, &[(url.as_str(), inline_url.as_str())]);
    chmod(&with_url, 0o644);

    let notify = NotifySocket::new(&db);
    let debug = [
        ("MYJOB_LOG", "debug"),
        ("NOTIFY_SOCKET", notify.path.to_str().unwrap()),
    ];
    let mut one = Worker::start_with_env(&with_file, "1", &debug);
    std::fs::write(db.path("slow"), "").unwrap();
    let held = db.insert("q", &["slow-if-flag"; 4]).await;
    db.wait_count("status = 'claimed' AND worker LIKE '%:1'", 4, 20)
        .await;
    let two = Worker::start_with_env(&with_url, "2", &debug);
    let envs = db.insert("q", &["env"]).await;
    db.wait_count(&format!("id = {} AND status = 'done'", envs[0]), 1, 20)
        .await;

    // ps, while both instances and four handlers run.
    let ps = std::process::Command::new("ps")
        .args(["-e", "ww", "-o", "pid,args"])
        .output()
        .unwrap();
    let ps_env = std::process::Command::new("ps")
        .args(["eww", "-o", "pid,args", "-p"])
        .arg(format!("{},{}", one.pid(), two.pid()))
        .output()
        .unwrap();

    // The least-privileged reaper (instance 2's) puts back the jobs of a killed instance 1.
    one.signal(Signal::SIGKILL);
    one.wait(10);
    kill_recorded_handlers(&db, "1");
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count(
        &format!(
            "id IN ({}) AND status = 'done' AND worker LIKE '%:2'",
            held.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        4,
        30,
    )
    .await;
    assert!(two.log_text().contains("reaper: stale claim put back"));
    assert!(!two.log_text().contains("PROCESS"), "{}", two.log_text());

    // Each tick once; no statement of the scheduler's refused.
    db.wait_at_least("queue = 'ticks'", 2, 10).await;
    common::ticks::assert_each_once(&db, "tick", 1, "ticks").await;
    for w in [&one, &two] {
        assert!(!w.log_text().contains("denied"), "{}", w.log_text());
    }

    // The warning, only where the password is exposed.
    let warning = "database.url holds a password and the file is readable by every user";
    assert!(two.log_text().contains(warning), "{}", two.log_text());
    assert!(
        !one.log_text().contains("readable by every user"),
        "{}",
        one.log_text()
    );
    chmod(&secret_file, 0o644);
    let check = myjob(
        &["--config", with_file.to_str().unwrap(), "check-config"],
        b"",
    );
    assert!(check.status.success());
    let stderr = String::from_utf8_lossy(&check.stderr).into_owned();
    assert!(
        stderr.contains("database.password_file") && stderr.contains("is readable by every user"),
        "{stderr}"
    );

    // Error messages that name the database: a wrong port, and a wrong password's neighbour.
    let bad_port = db.path("bad-port.toml");
    let port = format!(":{}/", opts.tcp_port());
    edited(&with_url, &bad_port, &[(port.as_str(), ":1/")]);
    let unreachable = myjob(
        &[
            "--config",
            bad_port.to_str().unwrap(),
            "enqueue",
            "--queue",
            "q",
            "x",
        ],
        b"",
    );
    assert_eq!(unreachable.status.code(), Some(69));
    let no_db = db.path("no-db.toml");
    edited(
        &with_url,
        &no_db,
        &[(db.name.as_str(), "myjob_t_nonexistent")],
    );
    let denied = myjob(
        &[
            "--config",
            no_db.to_str().unwrap(),
            "enqueue",
            "--queue",
            "q",
            "x",
        ],
        b"",
    );
    assert_ne!(denied.status.code(), Some(0));

    let mut places = vec![
        ("instance 1's log".to_owned(), one.log_text()),
        ("instance 2's log".to_owned(), two.log_text()),
        (
            "STATUS= and other notifications".to_owned(),
            notify.messages().join("\n"),
        ),
        (
            "the handler's environment".to_owned(),
            std::fs::read_to_string(db.path(&format!("env.{}", envs[0]))).unwrap(),
        ),
        (
            "ps".to_owned(),
            String::from_utf8_lossy(&ps.stdout).into_owned(),
        ),
        (
            "ps e (environment)".to_owned(),
            String::from_utf8_lossy(&ps_env.stdout).into_owned(),
        ),
    ];
    for (what, out) in [
        ("check-config", &check),
        ("unreachable", &unreachable),
        ("unknown database", &denied),
    ] {
        places.push((
            what.to_owned(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ));
    }
    for args in [&["--help"][..], &["run", "--help"], &["enqueue", "--help"]] {
        let mut full = vec!["--config", with_url.to_str().unwrap()];
        full.extend_from_slice(args);
        let out = myjob(&full, b"");
        places.push((
            format!("myjob {}", args.join(" ")),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    }
    assert!(
        places[0].1.contains("job started"),
        "no debug lines in the log?"
    );
    assert!(places[2].1.contains("STATUS="), "no STATUS= seen");
    assert!(
        places[3].1.contains("MYJOB_JOB_ID="),
        "no handler environment recorded"
    );
    assert!(places[4].1.contains("myjob"), "ps shows no myjob");
    for (what, text) in &places {
        assert!(
            !text.contains(&password) && !text.contains(&token),
            "the password appears in {what}:\n{text}"
        );
    }
    drop(two);
    admin
        .query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await
        .unwrap();
}

/// An account with the GRANTs from before `myjob_queues` existed: the worker says once that it
/// cannot see pauses, and runs every job all the same.
#[tokio::test(flavor = "multi_thread")]
async fn without_select_on_the_paused_queues_jobs_still_run() {
    let db = TestDb::new("no_pauses").await;
    let (user, password) = account(&db, "np", |g| !g.contains("myjob_queues")).await;
    let mut admin = db.conn().await;
    let config = db.config_as(&user, &password);
    let ids = db.insert("q", &["a", "b", "c"]).await;
    let w = Worker::start(&config, "1");
    db.wait_count("status = 'done'", ids.len() as u64, 30).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let log = w.log_text();
    assert_eq!(
        log.matches("claiming every queue, paused or not").count(),
        1,
        "{log}"
    );
    let _ = admin
        .query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await;
}
