//! Property tests of what people type: the config file and durations. Whatever the input,
//! the answer is a settings value or one line naming the file and the key, never a panic.
//! The number of cases is bounded (PROPTEST_CASES overrides it), so CI time is too.

use std::path::Path;
use std::time::Duration;

use myjob::config::{
    parse_duration, Settings, MIN_BACKOFF, MIN_KILL_GRACE, MIN_POLL_INTERVAL, MIN_REAPER_INTERVAL,
    MIN_SHUTDOWN_TIMEOUT, MIN_STALE_AFTER, MIN_TIMEOUT,
};
use proptest::prelude::*;

/// A config that loads, and the keys whose values the structured test replaces.
const BASE: &str = r#"[database]
url = "mysql://u@127.0.0.1:3306/app"

[worker]
concurrency = 4
batch_size = 50
poll_interval = "500ms"
shutdown_timeout = "30s"
kill_grace = "5s"

[reaper]
interval = "30s"
stale_after = "2m"

[[queue]]
name = "sms"
command = ["/bin/true"]
timeout = "5m"
max_attempts = 3
backoff = "10s"
backoff_max = "1h"
pass_env = ["TZ"]
"#;

const KEYS: [&str; 15] = [
    "url",
    "concurrency",
    "batch_size",
    "poll_interval",
    "shutdown_timeout",
    "kill_grace",
    "interval",
    "stale_after",
    "name",
    "command",
    "timeout",
    "max_attempts",
    "backoff",
    "backoff_max",
    "pass_env",
];

/// The duration keys of [`BASE`]: as written there, as an error names it, and its floor.
const FLOORS: [(&str, &str, Duration); 8] = [
    ("poll_interval", "worker.poll_interval", MIN_POLL_INTERVAL),
    (
        "shutdown_timeout",
        "worker.shutdown_timeout",
        MIN_SHUTDOWN_TIMEOUT,
    ),
    ("kill_grace", "worker.kill_grace", MIN_KILL_GRACE),
    ("interval", "reaper.interval", MIN_REAPER_INTERVAL),
    ("stale_after", "reaper.stale_after", MIN_STALE_AFTER),
    ("timeout", "queue[0].timeout", MIN_TIMEOUT),
    ("backoff", "queue[0].backoff", MIN_BACKOFF),
    ("backoff_max", "queue[0].backoff_max", MIN_BACKOFF),
];

/// [`BASE`] with `key`'s line set to `key = value`.
fn with_value(key: &str, value: &str) -> String {
    BASE.lines()
        .map(|l| {
            if l.split(" = ").next() == Some(key) {
                format!("{key} = {value}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn load(dir: &Path, text: &[u8]) -> Result<Settings, String> {
    let path = dir.join("myjob.toml");
    std::fs::write(&path, text).unwrap();
    Settings::load(&path).map_err(|e| e.to_string())
}

/// Any TOML value, as text, including ones of the wrong type and odd strings.
fn toml_value() -> impl Strategy<Value = String> {
    let text = |s: String| toml::Value::String(s).to_string();
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| toml::Value::Float(f).to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        ".{0,20}".prop_map(text),
        "[0-9]{1,6} ?(ns|us|ms|s|m|h|d|w|y|years|x)?".prop_map(text),
        "-[0-9]{1,3}s".prop_map(text),
        prop::collection::vec(".{0,8}", 0..3).prop_map(|v| {
            toml::Value::Array(v.into_iter().map(toml::Value::String).collect()).to_string()
        }),
        Just("{}".to_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_bytes_give_settings_or_one_line_naming_the_file(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let dir = tempfile::tempdir().unwrap();
        if let Err(e) = load(dir.path(), &bytes) {
            prop_assert!(!e.contains('\n'), "{e}");
            prop_assert!(e.starts_with(dir.path().join("myjob.toml").to_str().unwrap()), "{e}");
        }
    }

    #[test]
    fn any_value_for_a_key_gives_settings_or_one_line_naming_that_key(
        key in prop::sample::select(&KEYS[..]),
        value in toml_value(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let text = with_value(key, &value);
        match load(dir.path(), text.as_bytes()) {
            Ok(settings) => {
                // Whatever was accepted is usable: durations in range, sizes in range.
                prop_assert!(settings.worker.concurrency >= 1);
                prop_assert!(settings.worker.poll_interval >= MIN_POLL_INTERVAL);
                prop_assert!(settings.worker.kill_grace >= MIN_KILL_GRACE);
                prop_assert!(settings.reaper.interval >= MIN_REAPER_INTERVAL);
                prop_assert!(settings.reaper.stale_after >= MIN_STALE_AFTER);
                prop_assert!(settings.queues[0].timeout >= MIN_TIMEOUT);
                prop_assert!(settings.queues[0].backoff >= MIN_BACKOFF);
                prop_assert!(!settings.queues[0].command.is_empty());
            }
            Err(e) => {
                prop_assert!(!e.contains('\n'), "{e}");
                prop_assert!(e.contains(key), "{key} = {value}: {e}");
            }
        }
    }

    #[test]
    fn a_duration_below_its_keys_floor_is_refused_naming_the_key_and_the_floor(
        (key, named, floor) in prop::sample::select(&FLOORS[..]),
        n in 0u64..3000,
        unit in prop::sample::select(&["ns", "us", "ms", "s"][..]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let value = format!("{n}{unit}");
        let d = humantime::parse_duration(&value).unwrap();
        let text = with_value(key, &format!("\"{value}\""));
        let got = load(dir.path(), text.as_bytes());
        if d < floor {
            let e = got.expect_err(&value);
            prop_assert!(!e.contains('\n'), "{e}");
            prop_assert!(e.contains(&format!("{named}: \"{value}\"")), "{key} = {value}: {e}");
            let floor = humantime::format_duration(floor).to_string();
            prop_assert!(e.contains(&format!("minimum is {floor}")) || e.contains(&format!("minimum of {floor}")), "{key} = {value}: {e}");
        } else if key == "backoff_max" && d < Duration::from_secs(10) {
            // Above the floor, but shorter than the backoff of BASE.
            let e = got.expect_err(&value);
            prop_assert!(e.contains("backoff_max: must not be shorter than backoff"), "{e}");
        } else {
            let settings = got.map_err(|e| TestCaseError::fail(format!("{key} = {value}: {e}")))?;
            prop_assert!(settings.worker.poll_interval >= MIN_POLL_INTERVAL);
        }
    }

    #[test]
    fn durations_parse_or_explain_in_one_line(text in "\\PC{0,24}") {
        match parse_duration(&text) {
            Ok(d) => {
                prop_assert!(!d.is_zero());
                prop_assert!(d <= Duration::from_secs(10 * 365 * 24 * 3600));
            }
            Err(e) => prop_assert!(!e.contains('\n'), "{e}"),
        }
    }

    #[test]
    fn durations_people_write_mean_what_they_say(n in 1u64..1_000_000, unit in 0usize..4) {
        let (suffix, scale) = [("ms", 1u64), ("s", 1000), ("m", 60_000), ("h", 3_600_000)][unit];
        let d = parse_duration(&format!("{n}{suffix}")).unwrap_or(Duration::MAX);
        let want = Duration::from_millis(n * scale);
        if want <= Duration::from_secs(10 * 365 * 24 * 3600) {
            prop_assert_eq!(d, want);
        }
    }
}
