use std::time::Duration;

use super::*;

fn load_str(text: &str) -> Result<Settings, String> {
    from_text(text)
}

const MINIMAL: &str = "[database]\nurl = \"mysql://root@127.0.0.1:3306/test\"\n";

#[test]
fn a_program_is_found_on_path_as_execvp_finds_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (plain, runnable) = (dir.path().join("plain"), dir.path().join("runnable"));
    for d in [&plain, &runnable] {
        std::fs::create_dir(d).unwrap();
    }
    let write = |path: PathBuf, mode: u32| {
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    };
    write(plain.join("h"), 0o644);
    let found = write(runnable.join("h"), 0o755);
    std::fs::create_dir(plain.join("d")).unwrap();
    let search = std::env::join_paths([&plain, &runnable]).unwrap();
    // A file that cannot be run and a directory are passed over, as exec passes them.
    assert_eq!(find_on_path("h", &search), Some(found));
    assert_eq!(find_on_path("d", &search), None);
    assert_eq!(find_on_path("none", &search), None);
}

#[test]
fn defaults_fill_what_is_left_out() {
    let s = load_str(MINIMAL).unwrap();
    assert_eq!(s.worker.concurrency, 8);
    assert_eq!(s.worker.poll_interval, Duration::from_millis(500));
    assert_eq!(s.reaper.stale_after, Duration::from_secs(120));
    assert_eq!(s.database.display, "mysql://root@127.0.0.1:3306/test");
}

#[test]
fn a_rate_limit_is_an_interval_and_a_burst() {
    let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n";
    let rate = |extra: &str| load_str(&format!("{MINIMAL}{q}{extra}")).unwrap().queues[0].rate;
    assert_eq!(rate(""), None);
    assert_eq!(
        rate("rate_limit = \"600/1m\"\n"),
        Some(RateLimit {
            interval_us: 100_000,
            burst: 600
        })
    );
    assert_eq!(
        rate("rate_limit = \"10 / 1s\"\nrate_burst = 1\n"),
        Some(RateLimit {
            interval_us: 100_000,
            burst: 1
        })
    );
    // Faster than one a microsecond: one a microsecond.
    assert_eq!(
        rate("rate_limit = \"1000000/1ms\"\n").unwrap().interval_us,
        1
    );
}

#[test]
fn unknown_keys_name_their_table() {
    let e = load_str(&format!("{MINIMAL}[worker]\nconcurency = 3\n")).unwrap_err();
    assert!(
        e.contains("worker") && e.contains("unknown field `concurency`"),
        "{e}"
    );
}

#[test]
fn bad_values_name_their_key() {
    let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n";
    for (text, key) in [
        (
            format!("{MINIMAL}[worker]\nconcurrency = 0\n"),
            "worker.concurrency",
        ),
        (
            format!("{MINIMAL}[worker]\nconcurrency = 1000000\n"),
            "worker.concurrency",
        ),
        (
            format!("{MINIMAL}[worker]\npoll_interval = \"0s\"\n"),
            "worker.poll_interval",
        ),
        (
            format!("{MINIMAL}[reaper]\nstale_after = \"-5s\"\n"),
            "reaper.stale_after",
        ),
        (
            format!("{MINIMAL}{q}timeout = \"soon\"\n"),
            "queue[0].timeout",
        ),
        (format!("{MINIMAL}{q}{q}"), "queue[1].name"),
        (
            format!("{MINIMAL}[[queue]]\nname = \"a b\"\ncommand = [\"x\"]\n"),
            "queue[0].name",
        ),
        (
            format!("{MINIMAL}[[queue]]\nname = \"a\"\ncommand = []\n"),
            "queue[0].command",
        ),
        (
            format!("{MINIMAL}{q}pass_env = [\"MYJOB_DATABASE_URL\"]\n"),
            "queue[0].pass_env",
        ),
        (
            "[database]\nurl = \"mysql:///test\"\n".to_owned(),
            "database.url",
        ),
        (
            format!("{MINIMAL}{q}max_jobs_per_process = 5\n"),
            "queue[0].max_jobs_per_process",
        ),
        (
            format!("{MINIMAL}{q}persistent = true\nmax_jobs_per_process = 0\n"),
            "queue[0].max_jobs_per_process",
        ),
        (
            format!("{MINIMAL}{q}rate_limit = \"10\"\n"),
            "queue[0].rate_limit",
        ),
        (
            format!("{MINIMAL}{q}rate_limit = \"0/1s\"\n"),
            "queue[0].rate_limit",
        ),
        (
            format!("{MINIMAL}{q}rate_limit = \"10/0s\"\n"),
            "queue[0].rate_limit",
        ),
        (
            format!("{MINIMAL}{q}rate_limit = \"10/500us\"\n"),
            "queue[0].rate_limit",
        ),
        (
            format!("{MINIMAL}{q}rate_burst = 5\n"),
            "queue[0].rate_burst",
        ),
        (
            format!("{MINIMAL}{q}rate_limit = \"10/1s\"\nrate_burst = 0\n"),
            "queue[0].rate_burst",
        ),
        (
            format!("{MINIMAL}{q}persistent = true\nidle_timeout = \"0s\"\n"),
            "queue[0].idle_timeout",
        ),
        ("[worker]\n".to_owned(), "database.url"),
    ] {
        let e = load_str(&text).unwrap_err();
        assert!(e.starts_with(key), "{key}: {e}");
    }
}

#[test]
fn the_shipped_configs_are_valid() {
    for text in [
        include_str!("../../config/myjob.toml"),
        include_str!("../../config/local.toml"),
        include_str!("../../examples/sms/myjob.toml"),
        include_str!("../../examples/flash-sale/myjob.toml"),
    ] {
        // The password file exists only where the example is installed.
        load_str(&text.replace("password_file", "# password_file")).unwrap();
    }
    let s = load_str(include_str!("../../config/myjob.toml")).unwrap();
    // The reference file documents the defaults: it must not drift from them.
    let d = load_str(MINIMAL).unwrap();
    // Commented out, as it is computed: the figure it shows is the default's.
    let shown = format!("# max_payload_bytes = {}\n", d.worker.max_payload_bytes);
    assert_eq!(
        (s.worker, s.reaper, s.retention),
        (d.worker, d.reaper, d.retention)
    );
    assert!(
        include_str!("../../config/myjob.toml").contains(&shown),
        "{shown}"
    );
}

#[test]
fn a_url_that_would_lose_its_password_is_refused_without_echoing_it() {
    let url = |u: &str| load_str(&format!("[database]\nurl = \"{u}\"\n"));
    for good in [
        "mysql://app@127.0.0.1:3306/app",
        "mysql://app:@127.0.0.1:3306/app",
        "mysql://app:p@ss@127.0.0.1:3306/app",
        "mysql://app:%2Fs3cr3t@127.0.0.1:3306/app",
        "mysql://app:a:b@127.0.0.1:3306/app?prefer_socket=false",
        "mysql://app:pw@127.0.0.1:3306/app?socket=/run/a@b/mysqld.sock",
    ] {
        assert!(url(good).is_ok(), "{good}: {:?}", url(good).err());
    }
    for bad in [
        "mysql://app:/s3cr3t@127.0.0.1:3306/app",
        "mysql://app:12/s3cr3t@127.0.0.1:3306/app",
        "mysql://app:a/b@c@127.0.0.1:3306/app",
        "mysql://app:q?x@127.0.0.1:3306/app",
        "mysql://app:h#x@127.0.0.1:3306/app",
    ] {
        let e = url(bad).unwrap_err();
        assert!(
            e.contains("database.url: ") && e.contains("percent-encode"),
            "{e}"
        );
        assert!(
            !e.contains("s3cr3t") && !e.contains("q?x") && !e.contains("h#x"),
            "{e}"
        );
    }
}

#[test]
fn the_default_payload_limit_shares_two_gibibytes_among_the_jobs_held() {
    let d = load_str(MINIMAL).unwrap();
    assert_eq!(d.worker.max_payload_bytes, 16_777_215);
    assert_eq!(default_max_payload(1, 1), MAX_PAYLOAD_BYTES);
    assert_eq!(default_max_payload(64, 1000), 2_018_311);
    assert_eq!(default_max_payload(1024, 1000), 1_061_009);
    assert_eq!(
        default_max_payload(1024, 1000 * 1000),
        super::worker::MIN_DEFAULT_PAYLOAD_BYTES
    );
    for (c, b) in [(8, 100), (64, 100), (1024, 1000)] {
        assert!(default_max_payload(c, b) * (c + b) <= PAYLOADS_HELD);
    }
    // As the reference file says it.
    let gib = PAYLOADS_HELD >> 30;
    let example = include_str!("../../config/myjob.toml").replace("\n# ", " ");
    assert!(
        example.contains(&format!("By default {gib} GiB shared among them")),
        "config/myjob.toml should give {gib} GiB"
    );
    let e = load_str(&format!(
        "{MINIMAL}[worker]\nmax_payload_bytes = 16777216\n"
    ))
    .unwrap_err();
    assert!(
        e.contains("worker.max_payload_bytes: 16777216 is out of range"),
        "{e}"
    );
}

#[test]
fn wrong_types_name_their_key() {
    let e = load_str(&format!("{MINIMAL}[worker]\nconcurrency = \"eight\"\n")).unwrap_err();
    assert!(e.contains("worker.concurrency"), "{e}");
    let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\npersistent = \"yes\"\n";
    let e = load_str(&format!("{MINIMAL}{q}")).unwrap_err();
    assert!(e.contains("queue[0].persistent"), "{e}");
}

#[test]
fn retention_keeps_finished_jobs_for_an_age_or_for_ever() {
    let d = load_str(MINIMAL).unwrap().retention;
    let day = Duration::from_secs(86_400);
    assert_eq!(
        (d.done, d.failed, d.cancelled),
        (Some(7 * day), Some(30 * day), Some(30 * day))
    );
    let s = load_str(&format!(
        "{MINIMAL}[retention]\ndone = \"0s\"\nfailed = \"forever\"\n"
    ))
    .unwrap()
    .retention;
    assert_eq!(
        s.ages(),
        [("done", Duration::ZERO), ("cancelled", 30 * day)]
    );
    for bad in ["\"soon\"", "\"-1d\"", "\"\"", "7"] {
        let e = load_str(&format!("{MINIMAL}[retention]\nfailed = {bad}\n")).unwrap_err();
        assert!(e.contains("retention.failed"), "{bad}: {e}");
    }
}

#[test]
fn metrics_listen_gives_each_numbered_instance_its_port() {
    let on = MetricsSettings {
        listen: Some("127.0.0.1:17100".parse().unwrap()),
        explicit: true,
    };
    assert_eq!(
        on.address_for("3").unwrap(),
        Some("127.0.0.1:17103".parse().unwrap())
    );
    assert!(on
        .address_for("web")
        .unwrap_err()
        .contains("\"web\" has no number"));
    let high = MetricsSettings {
        listen: Some("127.0.0.1:65535".parse().unwrap()),
        explicit: true,
    };
    assert!(high.address_for("1").unwrap_err().contains("past 65535"));
    let off = MetricsSettings {
        listen: None,
        explicit: true,
    };
    assert_eq!(off.address_for("web"), Ok(None));
    let queue = "[[queue]]\nname = \"q\"\ncommand = [\"true\"]\n";
    // On by default, on 17100 + N; an instance without a number then serves nothing.
    let default = load_str(&format!("{MINIMAL}{queue}")).unwrap();
    assert_eq!(
        default.metrics.address_for("2"),
        Ok(Some("127.0.0.1:17102".parse().unwrap()))
    );
    assert_eq!(default.metrics.address_for("web"), Ok(None));
    let off = load_str(&format!("{MINIMAL}[metrics]\nlisten = \"\"\n{queue}")).unwrap();
    assert_eq!(off.metrics.listen, None);
    let bad = load_str(&format!("{MINIMAL}[metrics]\nlisten = \"here\"\n{queue}")).unwrap_err();
    assert!(
        bad.contains("metrics.listen") && bad.contains("is not ADDRESS:PORT"),
        "{bad}"
    );
}

#[test]
fn intervals_have_a_floor_named_with_their_key() {
    let q = "[[queue]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n";
    let p = format!("{q}persistent = true\n");
    let b = format!("{q}backoff = \"100ms\"\n");
    // (the table the key is in, the key, a value below its floor, the floor)
    for (table, key, below, floor) in [
        ("[worker]\n", "worker.poll_interval", "1us", "10ms"),
        ("[worker]\n", "worker.poll_interval", "9ms", "10ms"),
        ("[worker]\n", "worker.kill_grace", "1ms", "100ms"),
        ("[worker]\n", "worker.kill_grace", "0s", "100ms"),
        ("[reaper]\n", "reaper.interval", "99ms", "100ms"),
        ("[reaper]\n", "reaper.stale_after", "999ms", "1s"),
        ("[reaper]\n", "reaper.stale_after", "0s", "1s"),
        (q, "queue[0].timeout", "10ms", "100ms"),
        (q, "queue[0].backoff", "1ns", "100ms"),
        (&b, "queue[0].backoff_max", "50ms", "100ms"),
        (&p, "queue[0].idle_timeout", "500ms", "1s"),
    ] {
        let name = key.rsplit('.').next().unwrap();
        let with = |v: &str| load_str(&format!("{MINIMAL}{table}{name} = \"{v}\"\n"));
        let e = with(below).unwrap_err();
        assert!(e.starts_with(&format!("{key}: ")), "{key}: {e}");
        assert!(
            e.contains(&format!("the minimum is {floor}"))
                || e.contains(&format!("the minimum of {floor}")),
            "{key}: {e}"
        );
        assert!(!e.contains('\n'), "{e}");
        // The floor itself is accepted.
        with(floor).unwrap_or_else(|e| panic!("{key} = {floor}: {e}"));
    }
    let e = load_str(&format!("{MINIMAL}[worker]\npoll_interval = \"1us\"\n")).unwrap_err();
    assert_eq!(
        e,
        "worker.poll_interval: \"1us\" is shorter than the minimum of 10ms"
    );
    // A zero shutdown_timeout means something: on SIGTERM the handlers are killed at once
    // and their jobs released.
    let s = load_str(&format!("{MINIMAL}[worker]\nshutdown_timeout = \"0s\"\n")).unwrap();
    assert_eq!(s.worker.shutdown_timeout, Duration::ZERO);
}

#[test]
fn durations_read_like_people_write_them() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("").is_err());
    assert!(parse_duration("99999999999999999999h").is_err());
}
