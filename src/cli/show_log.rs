//! `myjob show ID --log`: one job's lines from the journal of this host, every instance's,
//! in order. myjob writes them with `MYJOB_JOB_ID` (see `logging`), and `journalctl` does the
//! reading: the journal's files, its permissions and its order are its own.

use std::process::{Command, Stdio};

use anyhow::anyhow;
use serde_json::Value;

use crate::error::{Error, ExitCode};

/// Where journald keeps its files: volatile, then persistent; one folder per machine id.
const JOURNAL_DIRS: [&str; 2] = ["/run/log/journal", "/var/log/journal"];

pub fn run(id: u64) -> Result<(), Error> {
    // journalctl given a match prints nothing, and exits 0, when there is no journal at all.
    if !journal_files() {
        return Err(no_journal(
            id,
            "no journal files in /run/log/journal or /var/log/journal",
        ));
    }
    let out = Command::new("journalctl")
        .args(["--no-pager", "--output=json", "--all"])
        .arg(format!("MYJOB_JOB_ID={id}"))
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(out) => out,
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
    let hints = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(Error::new(
            ExitCode::Unavailable,
            anyhow!(
                "job {id}: journalctl {}: {}",
                out.status,
                hints.lines().next().unwrap_or("no message")
            ),
        ));
    }
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|entry| line(&entry))
        .collect();
    if lines.is_empty() {
        // journalctl's own hints (a user who may read only their own journal) say why.
        eprint!("{hints}");
        println!("job {id}: no lines in this host's journal");
        return Ok(());
    }
    let mut text = lines.join("\n");
    text.push('\n');
    print!("{text}");
    Ok(())
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

/// One entry as `TIME HOST UNIT LEVEL MESSAGE`, the time in UTC.
fn line(entry: &Value) -> String {
    let field = |name: &str| -> Option<String> {
        match entry.get(name)? {
            Value::String(s) => Some(s.clone()),
            // A value that is not UTF-8 comes as an array of its bytes.
            Value::Array(bytes) => Some(
                String::from_utf8_lossy(
                    &bytes
                        .iter()
                        .filter_map(|b| b.as_u64().map(|b| b as u8))
                        .collect::<Vec<u8>>(),
                )
                .into_owned(),
            ),
            _ => None,
        }
    };
    let time = field("__REALTIME_TIMESTAMP")
        .and_then(|us| us.parse::<u64>().ok())
        .map(|us| {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us);
            humantime::format_rfc3339_micros(at).to_string()
        })
        .unwrap_or_else(|| "-".into());
    let unit = field("_SYSTEMD_UNIT")
        .or_else(|| field("MYJOB_INSTANCE").map(|i| format!("instance {i}")))
        .unwrap_or_else(|| "-".into());
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
    }
}
