//! The log outside the journal: plain text on a terminal or a file, `<N>`-prefixed text on a
//! journal stream whose journald socket is not there, lines the same as before the journal's
//! fields (the job's span does not show); and `myjob show --log` on a host with no journal.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::{myjob, TestDb, Worker};
use nix::sys::signal::Signal;

/// Whether journald's native socket is on this host: then a journal stream's lines go there.
fn journald_here() -> bool {
    Path::new("/run/systemd/journal/socket").exists()
}

/// The log's lines about `id`, with their timestamps and levels cut off.
fn lines_about(log: &str, id: u64) -> Vec<String> {
    let tag = format!("job_id={id} ");
    let end = format!("job_id={id}");
    log.lines()
        .filter(|l| l.contains(&tag) || l.ends_with(&end))
        .map(|l| {
            let text = l.split_once("  INFO ").map_or(l, |(_, t)| t);
            let text = text.split_once(" ERROR ").map_or(text, |(_, t)| t);
            text.trim().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_gets_plain_lines_without_the_jobs_span() {
    let db = TestDb::new("logs_text").await;
    let config = db.config("", "");
    let ids = db.insert("q", &["hello", "perm"]).await;
    let mut w = Worker::start(&config, "1");
    db.wait_count("status IN ('done', 'failed')", 2, 30).await;
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(30), Some(0));
    let log = w.log_text();
    let ok = ids[0];
    assert_eq!(
        lines_about(&log, ok),
        [
            format!("job started job_id={ok} attempt=1 queue=q"),
            format!("handled {ok} job_id={ok} stream=\"stdout\""),
            format!("job done job_id={ok} attempt=1"),
        ],
    );
    let perm = ids[1];
    assert!(
        log.lines().any(|l| l.contains(" ERROR ")
            && l.ends_with(&format!(
                "job failed: permanent failure on attempt 1: exit status 65; stderr: bad payload job_id={perm} attempt=1"
            ))),
        "{log}"
    );
    // The text has timestamps, and no span: `job{job_id=…}:` would prefix each line in it.
    assert!(log.lines().all(|l| l.starts_with("20")), "{log}");
    assert!(!log.contains("job{") && !log.contains("batch_id="), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_journal_stream_without_journald_gets_priority_prefixed_lines() {
    let db = TestDb::new("logs_stream").await;
    let config = db.config("", "");
    let ids = db.insert("q", &["hello", "perm"]).await;
    // The log file as the journal's stream: JOURNAL_STREAM names its device and inode.
    let log = config.with_file_name("stream.log");
    std::fs::write(&log, "").unwrap();
    let meta = std::fs::metadata(&log).unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let mut w =
        Worker::start_appending_with_env(&config, "1", &log, &[("JOURNAL_STREAM", &stream)]);
    db.wait_count("status IN ('done', 'failed')", 2, 30).await;
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait(30), Some(0));
    let text = w.log_text();
    let (ok, perm) = (ids[0], ids[1]);
    if journald_here() {
        // The lines went to journald itself.
        assert!(!text.contains(&format!("job done job_id={ok}")), "{text}");
        return;
    }
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        format!("<6>job started job_id={ok} attempt=1 queue=q"),
        format!("<6>handled {ok} job_id={ok} stream=\"stdout\""),
        format!("<6>job done job_id={ok} attempt=1"),
        format!("<3>job failed: permanent failure on attempt 1: exit status 65; stderr: bad payload job_id={perm} attempt=1"),
        "<6>ready".into(),
        "<6>stopped".into(),
    ] {
        assert!(lines.contains(&want.as_str()), "no {want:?} in:\n{text}");
    }
    assert!(lines.iter().all(|l| l.starts_with('<')), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn show_log_says_plainly_when_this_host_has_no_journal() {
    let db = TestDb::new("logs_show").await;
    let config = db.config("", "");
    let journals = ["/run/log/journal", "/var/log/journal"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| d.flatten())
        .filter_map(|machine| std::fs::read_dir(machine.path()).ok())
        .flat_map(|d| d.flatten())
        .any(|f| f.path().extension().is_some_and(|e| e == "journal"));
    let out = myjob(
        &["--config", config.to_str().unwrap(), "show", "42", "--log"],
        b"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if journals {
        // A host with a journal: job 42's lines, or a line saying there are none.
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(!stdout.is_empty());
        return;
    }
    assert_eq!(out.status.code(), Some(69), "{stdout}{stderr}");
    assert!(
        stderr.contains("job 42: no journal on this host") && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}
