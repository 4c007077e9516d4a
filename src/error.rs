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
        // `{:#}` prints the whole cause chain on one line: "a: b: c".
        write!(f, "{:#}", self.source)
    }
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
