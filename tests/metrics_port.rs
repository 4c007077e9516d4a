//! The metrics port against a local user who holds it open: a thousand connections that send
//! nothing and two hundred that send half a header, against a worker whose descriptors are
//! few (`ulimit -n 256`). The port must cost the worker neither its handlers' descriptors,
//! nor its CPU, nor its memory; and it must serve a scrape again once they are gone.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::scrape::{free_port, get};
use crate::common::{KillOnDrop, TestDb};
use nix::libc;

/// This process's own descriptor limit, raised to its hard limit: the test holds 1,200.
fn raise_own_limit() {
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
        assert!(l.rlim_cur >= 1400, "the test needs 1,400 descriptors");
    }
}

/// Ticks of CPU (user and system) the process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A field of /proc/PID/status in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_idle_and_two_hundred_half_sent_connections_starve_nothing() {
    raise_own_limit();
    let db = TestDb::new("metrics_port").await;
    let port = free_port();
    let base = std::fs::read_to_string(db.config("concurrency = 4", "")).unwrap();
    let config = db.path("port.toml");
    std::fs::write(
        &config,
        base.replace(
            "listen = \"\"",
            &format!("listen = \"127.0.0.1:{}\"", port - 1),
        ),
    )
    .unwrap();
    let log = db.path("worker.log");
    let mut worker = Command::new(common::bin());
    worker
        .args([
            "--config",
            config.to_str().unwrap(),
            "run",
            "--instance",
            "1",
        ])
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
    unsafe {
        worker.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let worker = KillOnDrop(worker.spawn().unwrap());
    let pid = worker.0.id();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let start = Instant::now();
    while !log_text().contains("metrics: serving") {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let baseline_kib = status_kib(pid, "VmRSS:");

    // A thousand connections that send nothing, two hundred that send a header without end.
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let connect = || TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(connect());
    }
    let mut half = Vec::new();
    let chunk = format!("GET /metrics HTTP/1.1\r\nX-Long: {}", "a".repeat(4096));
    for _ in 0..200 {
        let mut s = connect();
        s.set_nonblocking(true).unwrap();
        // As much of 400 KB as the socket takes now.
        for _ in 0..100 {
            if s.write_all(chunk.as_bytes()).is_err() {
                break;
            }
        }
        half.push(s);
    }

    // Jobs run meanwhile, each a process with three pipes: none may fail for a descriptor.
    let ids = db.insert("q", &["ok"; 200]).await;
    db.wait_count("status = 'done' AND attempts = 1", 200, 60)
        .await;
    assert_eq!(db.count("status <> 'done'").await, 0, "{}", log_text());
    assert_eq!(ids.len(), 200);

    // At rest while the connections are still held: under a tenth of a core over 3 s.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = cpu_ticks(pid) - before;
    assert!(
        used * 10 < ticks_per_s * 3,
        "{used} ticks of CPU in 3 s with the connections held\n{}",
        log_text()
    );
    // Memory: the half-sent headers are not kept (80 MB if they were).
    let peak_kib = status_kib(pid, "VmHWM:");
    assert!(
        peak_kib < baseline_kib + 24 * 1024,
        "peak {peak_kib} KiB, {baseline_kib} KiB before the connections"
    );
    eprintln!(
        "held: {used} CPU ticks of {ticks_per_s}/s over 3 s; RSS {baseline_kib} KiB before, peak {peak_kib} KiB"
    );
    let text = log_text();
    assert!(
        text.contains("metrics: 16 connections are open, the most the port takes"),
        "{text}"
    );

    // A connection that sends nothing is closed by the port within its header timeout.
    let mut one = idle.pop().unwrap();
    one.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 64];
    let began = Instant::now();
    let n = one.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "an idle connection got an answer");
    assert!(began.elapsed() < Duration::from_secs(12));

    // Gone, they leave the port to its scraper.
    drop(idle);
    drop(half);
    let start = Instant::now();
    loop {
        let scraped = std::panic::catch_unwind(|| get(port, "/metrics", None));
        if let Ok((200, _, body)) = scraped {
            assert!(body.contains("myjob_jobs_started_total"));
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no scrape served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(worker);
}
