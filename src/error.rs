//! Exit codes (sysexits) and the error type that carries one up to `main`.
//!
//! Library code returns `anyhow` chains; the command that fails picks the exit code with
//! [`OrExit::or_exit`] at the point where it knows what kind of failure it is, and `main`
//! prints the whole chain once, on one line.

use std::fmt;

/// The exit codes myjob uses, from sysexits(3), so that scripts and systemd can tell a typo
/// in the config (don't restart) from a database that is down (try again later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCode {
    /// The command line was wrong.
    Usage = 64,
    /// The input data (a payload, a queue name, a duration) was wrong.
    Data = 65,
    /// The database could not be reached.
    Unavailable = 69,
    /// A bug or an unexpected internal failure.
    Software = 70,
    /// Try again later (a unique job is running right now).
    TempFail = 75,
    /// The configuration file, or the schema it points at, is wrong.
    Config = 78,
}

impl ExitCode {
    /// Every code myjob exits with but 0, for the docs' table to be checked against.
    pub const ALL: [ExitCode; 6] = [
        ExitCode::Usage,
        ExitCode::Data,
        ExitCode::Unavailable,
        ExitCode::Software,
        ExitCode::TempFail,
        ExitCode::Config,
    ];
}

/// An error with the exit code the process should end with.
#[derive(Debug)]
pub struct Error {
    pub code: ExitCode,
    pub source: anyhow::Error,
}

impl Error {
    pub fn new(code: ExitCode, source: impl Into<anyhow::Error>) -> Self {
        Error {
            code,
            source: source.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&chain(&*self.source))
    }
}

/// The whole cause chain of `e` on one line, "a: b: c", each cause once. Many errors (the
/// driver's, std's I/O errors) already end their own message with their source's, which
/// anyhow's `{:#}` would then print again: "I/O error: I/O error: closed: closed".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let messages: Vec<String> = std::iter::successors(Some(e), |e| e.source())
        .map(|e| e.to_string())
        .collect();
    let mut parts: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let message = messages[i].as_str();
        i += 1;
        let own = match messages.get(i) {
            // "a: b" above "b": keep "a", then "b".
            Some(next) if message.ends_with(next.as_str()) => {
                message[..message.len() - next.len()].trim_end_matches([':', ' '])
            }
            // The source quoted inside the message: the message says it all.
            Some(_) => {
                while messages
                    .get(i)
                    .is_some_and(|n| message.contains(n.as_str()))
                {
                    i += 1;
                }
                message
            }
            None => message,
        };
        if !own.is_empty() && parts.last() != Some(&own) {
            parts.push(own);
        }
    }
    parts
        .join(": ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Attaches an exit code to any error.
pub trait OrExit<T> {
    fn or_exit(self, code: ExitCode) -> Result<T, Error>;
}

impl<T, E: Into<anyhow::Error>> OrExit<T> for Result<T, E> {
    fn or_exit(self, code: ExitCode) -> Result<T, Error> {
        self.map_err(|e| Error::new(code, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_chain_is_printed_once() {
        let io = std::io::Error::other("connection closed");
        let driver = mysql_async::Error::Io(mysql_async::IoError::Io(io));
        let e = anyhow::Error::new(driver).context("writing outcomes");
        assert_eq!(
            chain(&*e),
            "writing outcomes: Input/output error: connection closed"
        );
        let e = anyhow::anyhow!("b").context("a");
        assert_eq!(chain(&*e), "a: b");
        let server = mysql_async::Error::Server(mysql_async::ServerError {
            code: 1205,
            message: "Lock wait timeout exceeded".into(),
            state: "HY000".into(),
        });
        let e = anyhow::Error::new(server).context("staging");
        assert_eq!(
            chain(&*e),
            "staging: Server error: `ERROR 1205 (HY000): Lock wait timeout exceeded'"
        );
    }
}
