//! The persistent handler protocol, version 1, as bytes: what myjob writes on the process's
//! stdin and what it accepts on its stdout. Nothing here does I/O.
//!
//! - The process writes `READY\n` once, when it can take a job.
//! - For each job myjob writes `JOB <id> <attempt> <max_attempts> <batch_id> <length>\n` and
//!   exactly `<length>` payload bytes, nothing else.
//! - The process answers one line: `OK`, `RETRY <reason>` or `FAIL <reason>`.
//!
//! Any other line on stdout is a protocol error.

use crate::store::jobs::{BatchId, JobId};
use crate::worker::handler::output::clean;

/// The value of `MYJOB_PROTOCOL` in a persistent process's environment.
pub const VERSION: &str = "1";

/// The process's first line.
pub const READY: &[u8] = b"READY";

/// The longest line accepted on a persistent process's stdout, newline excluded. A reason is
/// for `last_error`, not for data.
pub const MAX_ANSWER: usize = 64 * 1024;

/// The header that precedes a job's payload.
pub fn header(
    id: JobId,
    attempt: u32,
    max_attempts: u32,
    batch_id: BatchId,
    length: usize,
) -> Vec<u8> {
    format!("JOB {id} {attempt} {max_attempts} {batch_id} {length}\n").into_bytes()
}

/// What a process said about its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// Retried with backoff, like a non-zero exit.
    Retry(String),
    /// Failed for good, like exit 65.
    Fail(String),
}

/// Reads an answer line (without its `\n`). The reason is everything after the first space,
/// and may be empty; an error says what was wrong, in words fit for `last_error`.
pub fn answer(line: &[u8]) -> Result<Answer, String> {
    let (word, rest) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    let reason = || or_none(clean(rest.unwrap_or_default()).trim().to_owned());
    match word {
        b"OK" if rest.is_none() => Ok(Answer::Ok),
        b"RETRY" => Ok(Answer::Retry(reason())),
        b"FAIL" => Ok(Answer::Fail(reason())),
        _ => Err(format!(
            "protocol error: the handler wrote {} on stdout (expected OK, RETRY <reason> or FAIL <reason>)",
            quote(line)
        )),
    }
}

fn or_none(reason: String) -> String {
    if reason.is_empty() {
        "(no reason given)".into()
    } else {
        reason
    }
}

/// A line as it may appear in a message: cleaned, at most 200 characters, in quotes.
pub fn quote(line: &[u8]) -> String {
    let text = clean(line);
    let mut short: String = text.chars().take(200).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    format!("{short:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_one_line_of_five_numbers() {
        assert_eq!(
            header(JobId::new(42), 1, 10, BatchId::new(7), 5),
            b"JOB 42 1 10 7 5\n"
        );
    }

    #[test]
    fn answers_are_read_exactly() {
        assert_eq!(answer(b"OK"), Ok(Answer::Ok));
        assert_eq!(
            answer(b"RETRY gateway 503"),
            Ok(Answer::Retry("gateway 503".into()))
        );
        assert_eq!(
            answer(b"FAIL bad number"),
            Ok(Answer::Fail("bad number".into()))
        );
        assert_eq!(
            answer(b"RETRY"),
            Ok(Answer::Retry("(no reason given)".into()))
        );
        assert_eq!(
            answer(b"FAIL \x1b[31m"),
            Ok(Answer::Fail("\u{FFFD}[31m".into()))
        );
        for bad in [
            &b"ok"[..],
            b"OK then",
            b"READY",
            b"",
            b"OK\r",
            b"DONE",
            b" OK",
        ] {
            let e = answer(bad).unwrap_err();
            assert!(e.starts_with("protocol error: the handler wrote"), "{e}");
        }
    }

    #[test]
    fn a_long_line_is_shortened_in_messages() {
        let q = quote(&[b'x'; 1000]);
        assert!(q.chars().count() < 210 && q.ends_with("…\""), "{q}");
    }
}
