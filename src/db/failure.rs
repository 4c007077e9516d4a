//! What a failed statement says: about the connection it ran on (a lost race, a refusal, a
//! broken connection), and whether the server takes writes.

use std::time::Duration;

use tracing::warn;

/// What a failed statement says about the connection it ran on, and so what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A deadlock (1213, which is also how Galera reports a write that lost a certification
    /// conflict to another node) or a lock wait timeout (1205): the statement lost a race.
    /// The connection is fine; the same statement may well succeed when tried again.
    Conflict,
    /// The server refused this statement for good: a constraint (SQLSTATE class 23), a value
    /// (22), or a trigger's SIGNAL (45). The connection is fine; trying again changes nothing.
    Refused,
    /// Anything else: the connection is broken, or in doubt.
    Connection,
}

/// The first server error in `e`'s chain.
fn server_error(e: &anyhow::Error) -> Option<&mysql_async::ServerError> {
    e.chain()
        .find_map(|c| match c.downcast_ref::<mysql_async::Error>() {
            Some(mysql_async::Error::Server(s)) => Some(s),
            _ => None,
        })
}

/// The code of the first server error in `e`'s chain, if any.
pub fn server_code(e: &anyhow::Error) -> Option<u16> {
    server_error(e).map(|s| s.code)
}

/// A lock wait that ran out (`innodb_lock_wait_timeout`): the statement rolled back.
pub const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// A deadlock, which is also how a Galera cluster refuses a write that lost certification:
/// the transaction rolled back.
pub const ER_LOCK_DEADLOCK: u16 = 1213;

/// Sorts an error by the first driver error in its chain.
pub fn classify(e: &anyhow::Error) -> Failure {
    match server_error(e) {
        Some(s) if s.code == ER_LOCK_DEADLOCK || s.code == ER_LOCK_WAIT_TIMEOUT => {
            Failure::Conflict
        }
        Some(s)
            if ["22", "23", "45"]
                .iter()
                .any(|class| s.state.starts_with(class)) =>
        {
            Failure::Refused
        }
        _ => Failure::Connection,
    }
}

/// Whether a failed statement says the server takes no writes: `read_only` or
/// `super_read_only` (1290), or InnoDB's read-only mode (1836). A replica the url reaches
/// after a failover, a primary demoted: reads work, writes do not.
pub fn is_read_only(e: &anyhow::Error) -> bool {
    const ER_OPTION_PREVENTS_STATEMENT: u16 = 1290;
    const ER_READ_ONLY_MODE: u16 = 1836;
    matches!(
        server_code(e),
        Some(ER_OPTION_PREVENTS_STATEMENT | ER_READ_ONLY_MODE)
    )
}

/// Says once that the server takes no writes, and once that it does again, for one loop
/// that writes: a read-only server must not fill the journal with a line per attempt.
#[derive(Debug, Default)]
pub struct ReadOnly {
    since: Option<std::time::Instant>,
}

impl ReadOnly {
    /// A statement of `who` failed: when it is because the server is read-only, says so the
    /// first time, and returns true.
    pub fn failed(&mut self, who: &str, e: &anyhow::Error) -> bool {
        if !is_read_only(e) {
            return false;
        }
        if self.since.is_none() {
            warn!(
                "{who}: the server is read-only ({}); trying again with a growing pause until a writable server answers",
                crate::error::chain(&**e)
            );
            self.since = Some(std::time::Instant::now());
        }
        true
    }

    /// Whether the last write of `who` failed because the server is read-only.
    pub fn is_on(&self) -> bool {
        self.since.is_some()
    }

    /// A write of `who` succeeded.
    pub fn wrote(&mut self, who: &str) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                after = %humantime::format_duration(Duration::from_secs(since.elapsed().as_secs())),
                "{who}: the server accepts writes again"
            );
        }
    }
}

/// A one-line description of a driver error, each cause once: mysql_async's own Display of
/// some errors spans several lines, and repeats its source's text.
pub fn describe(e: &mysql_async::Error) -> String {
    crate::error::chain(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_what_they_say_of_the_connection() {
        let server = |code, state: &str| {
            anyhow::Error::new(mysql_async::Error::Server(mysql_async::ServerError {
                code,
                message: "m".into(),
                state: state.into(),
            }))
            .context("writing outcomes")
        };
        assert_eq!(classify(&server(1213, "40001")), Failure::Conflict);
        assert_eq!(classify(&server(1205, "HY000")), Failure::Conflict);
        assert_eq!(classify(&server(1644, "45000")), Failure::Refused);
        assert_eq!(classify(&server(1452, "23000")), Failure::Refused);
        assert_eq!(classify(&server(1406, "22001")), Failure::Refused);
        // Read-only after a failover, a killed connection: reconnect.
        assert_eq!(classify(&server(1290, "HY000")), Failure::Connection);
        assert_eq!(classify(&server(1927, "70100")), Failure::Connection);
        assert_eq!(classify(&anyhow::anyhow!("closed")), Failure::Connection);
    }
}
