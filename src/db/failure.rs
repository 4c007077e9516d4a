//! What a failed statement says: about the connection it ran on (a lost race, a refusal, a
//! broken connection), and whether the server takes writes.

use std::time::Duration;

use tracing::warn;

/// What a failed statement says about the connection it ran on, and so what to do next. A
/// caller `match`es it: each kind is handled where it can happen, and the compiler checks
/// that none is left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The statement lost a race and rolled back. The connection is fine; the same
    /// statement may well succeed when tried again.
    Conflict(Race),
    /// The server refused this statement for good: a constraint (SQLSTATE class 23), a value
    /// (22), or a trigger's SIGNAL (45). The connection is fine; trying again changes nothing.
    Refused(Refusal),
    /// The server takes no writes: `read_only` or `super_read_only` (1290), or InnoDB's
    /// read-only mode (1836). A replica the url reaches after a failover, a primary demoted:
    /// reads work, writes do not.
    ReadOnly,
    /// The account may not use a table (1142): not granted.
    Denied,
    /// The table or a column is missing (1146, 1054): not migrated.
    Missing,
    /// Another error the server answered with: the statement did not run. Whether the
    /// connection is fine cannot be told, so it is treated as in doubt.
    Server(u16),
    /// No answer from the server: the connection broke, or a statement ran out of its time
    /// limit. A write may have committed.
    Lost,
}

/// The race a statement lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Race {
    /// A deadlock (1213), which is also how a Galera cluster refuses a write that lost
    /// certification to another node's.
    Deadlock,
    /// A lock wait that ran out (`innodb_lock_wait_timeout`, 1205).
    LockWait,
}

/// Why the server refused a statement for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A unique key holds the value already (1062): another writer put it there first.
    Duplicate,
    /// Any other constraint, value or SIGNAL.
    Other,
}

impl Failure {
    /// Whether the connection may be used again, once a ROLLBACK ends what the statement
    /// left open: the server answered, and said nothing against the connection.
    pub fn keeps_connection(self) -> bool {
        match self {
            Failure::Conflict(_) | Failure::Refused(_) => true,
            Failure::ReadOnly
            | Failure::Denied
            | Failure::Missing
            | Failure::Server(_)
            | Failure::Lost => false,
        }
    }
}

/// The first server error in `e`'s chain.
fn server_error(e: &anyhow::Error) -> Option<&mysql_async::ServerError> {
    e.chain()
        .find_map(|c| match c.downcast_ref::<mysql_async::Error>() {
            Some(mysql_async::Error::Server(s)) => Some(s),
            _ => None,
        })
}

/// A lock wait that ran out (`innodb_lock_wait_timeout`): the statement rolled back.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// A deadlock, which is also how a Galera cluster refuses a write that lost certification:
/// the transaction rolled back.
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_DUP_ENTRY: u16 = 1062;
const ER_OPTION_PREVENTS_STATEMENT: u16 = 1290;
const ER_READ_ONLY_MODE: u16 = 1836;
const ER_TABLEACCESS_DENIED: u16 = 1142;
const ER_NO_SUCH_TABLE: u16 = 1146;
const ER_BAD_FIELD_ERROR: u16 = 1054;

/// Sorts an error by the first server error in its chain.
pub fn classify(e: &anyhow::Error) -> Failure {
    let Some(s) = server_error(e) else {
        return Failure::Lost;
    };
    match s.code {
        ER_LOCK_DEADLOCK => Failure::Conflict(Race::Deadlock),
        ER_LOCK_WAIT_TIMEOUT => Failure::Conflict(Race::LockWait),
        ER_DUP_ENTRY => Failure::Refused(Refusal::Duplicate),
        _ if ["22", "23", "45"]
            .iter()
            .any(|class| s.state.starts_with(class)) =>
        {
            Failure::Refused(Refusal::Other)
        }
        ER_OPTION_PREVENTS_STATEMENT | ER_READ_ONLY_MODE => Failure::ReadOnly,
        ER_TABLEACCESS_DENIED => Failure::Denied,
        ER_NO_SUCH_TABLE | ER_BAD_FIELD_ERROR => Failure::Missing,
        code => Failure::Server(code),
    }
}

/// Whether a failed statement says the server takes no writes (see [`Failure::ReadOnly`]).
pub fn is_read_only(e: &anyhow::Error) -> bool {
    classify(e) == Failure::ReadOnly
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
        let deadlock = Failure::Conflict(Race::Deadlock);
        assert_eq!(classify(&server(1213, "40001")), deadlock);
        assert_eq!(
            classify(&server(1205, "HY000")),
            Failure::Conflict(Race::LockWait)
        );
        let duplicate = Failure::Refused(Refusal::Duplicate);
        assert_eq!(classify(&server(1062, "23000")), duplicate);
        for (code, state) in [(1644, "45000"), (1452, "23000"), (1406, "22001")] {
            assert_eq!(
                classify(&server(code, state)),
                Failure::Refused(Refusal::Other)
            );
        }
        // Read-only after a failover, a table not granted, a killed connection: reconnect.
        assert_eq!(classify(&server(1290, "HY000")), Failure::ReadOnly);
        assert_eq!(classify(&server(1836, "HY000")), Failure::ReadOnly);
        assert_eq!(classify(&server(1142, "42000")), Failure::Denied);
        assert_eq!(classify(&server(1143, "42000")), Failure::Server(1143));
        assert_eq!(classify(&server(1146, "42S02")), Failure::Missing);
        assert_eq!(classify(&server(1927, "70100")), Failure::Server(1927));
        assert_eq!(classify(&anyhow::anyhow!("closed")), Failure::Lost);
        for f in [
            Failure::ReadOnly,
            Failure::Denied,
            Failure::Missing,
            Failure::Server(1927),
            Failure::Lost,
        ] {
            assert!(!f.keeps_connection(), "{f:?}");
        }
        assert!(deadlock.keeps_connection() && duplicate.keeps_connection());
    }
}
