//! Opening a connection: myjob's session settings on it, a bound on how long it may take, a
//! check that no proxy answers for the server, and the backoff between attempts.

use std::fmt;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, OptsBuilder};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::describe;
use crate::config::DatabaseSettings;
use crate::error::ExitCode;

/// What myjob sets on every session rather than inherit from the server's configuration:
/// - READ COMMITTED: a claim skips rows it does not take instead of holding their locks
///   (InnoDB's semi-consistent read), whatever the server's default isolation is;
/// - UTC: `NOW(6) + INTERVAL …` (due times, backoff, stale claims) is computed in the session
///   time zone, and a zone with daylight saving would shift it by an hour twice a year;
/// - a strict SQL mode without surprises: values that do not fit are errors, not silent
///   truncation, no engine is substituted for InnoDB by `migrate`, and none of ANSI_QUOTES,
///   PIPES_AS_CONCAT or NO_BACKSLASH_ESCAPES changes what myjob's SQL means;
/// - bounded lock waits (`database.lock_wait_timeout`, 15 s by default) for a row lock (the
///   server's default is 50 s) and for a metadata lock (an `ALTER TABLE`, a `LOCK TABLES`, an
///   online schema change; the default is a day), so a blocked statement fails, is logged and
///   tried again, well within the unit's WatchdogSec of 60 s, instead of hanging the loop
///   until the watchdog kills it.
fn session_setup(lock_wait_timeout: u64) -> Vec<String> {
    vec![
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".into(),
        format!(
            "SET SESSION time_zone = '+00:00', \
             sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', \
             innodb_lock_wait_timeout = {lock_wait_timeout}, lock_wait_timeout = {lock_wait_timeout}"
        ),
    ]
}

/// Why a connection could not be made, by what can be done about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The server is down, unreachable, slow, or refused the login: it may work later.
    Unavailable,
    /// TLS was asked for and failed: the server has none, or its certificate does not verify.
    /// Retrying does not help until the configuration or the server changes.
    Tls,
    /// Something between myjob and the server answers for it (see [`check_not_proxied`]).
    Proxied,
}

/// A failed connection attempt: one line naming the database (never its password).
#[derive(Debug)]
pub struct ConnectError {
    pub failure: ConnectFailure,
    /// `mysql://user@host:port/db`.
    pub database: String,
    pub message: String,
    /// The server itself turned the login down (too many connections, a locked or unknown
    /// account, a host blocked): it is up, and lists no connection of ours.
    pub answered: bool,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.failure {
            ConnectFailure::Unavailable => "cannot connect",
            ConnectFailure::Tls => "TLS failed",
            ConnectFailure::Proxied => "refused",
        };
        write!(f, "database {}: {what}: {}", self.database, self.message)
    }
}

impl std::error::Error for ConnectError {}

impl ConnectError {
    /// A multiplexing proxy is a configuration to change (78); the rest may work later (69).
    pub fn exit_code(&self) -> ExitCode {
        match self.failure {
            ConnectFailure::Proxied => ExitCode::Config,
            ConnectFailure::Unavailable | ConnectFailure::Tls => ExitCode::Unavailable,
        }
    }
}

/// Opens one connection with myjob's session settings, and checks that its
/// `CONNECTION_ID()` is the server's own: see [`check_not_proxied`].
pub async fn connect(db: &DatabaseSettings) -> Result<Conn, ConnectError> {
    let fail = |failure, message: String| ConnectError {
        failure,
        database: db.display.clone(),
        message,
        answered: false,
    };
    // Fencing reads affected-row counts as "rows changed", so CLIENT_FOUND_ROWS (which counts
    // rows matched) stays off whatever the url asks for.
    let mut builder = OptsBuilder::from_opts(db.opts.clone()).client_found_rows(false);
    if db.opts.max_allowed_packet().is_none() {
        builder = builder.max_allowed_packet(Some(READ_PACKET_LIMIT));
    }
    let opts = builder.init(session_setup(db.lock_wait_timeout));
    let mut conn = match tokio::time::timeout(CONNECT_TIMEOUT, Conn::new(opts)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            let failure = if is_tls_error(&e) {
                ConnectFailure::Tls
            } else {
                ConnectFailure::Unavailable
            };
            let answered = matches!(e, mysql_async::Error::Server(_));
            return Err(ConnectError {
                answered,
                ..fail(failure, describe(&e))
            });
        }
        Err(_) => {
            return Err(fail(
                ConnectFailure::Unavailable,
                format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
            ))
        }
    };
    let id: Result<Option<u64>, _> = conn.query_first("SELECT CONNECTION_ID()").await;
    match id {
        Ok(Some(id)) => {
            check_not_proxied(conn.id(), id).map_err(|m| fail(ConnectFailure::Proxied, m))?
        }
        Ok(None) => {
            return Err(fail(
                ConnectFailure::Unavailable,
                "no CONNECTION_ID()".into(),
            ))
        }
        Err(e) => return Err(fail(ConnectFailure::Unavailable, describe(&e))),
    }
    Ok(conn)
}

/// Runs a statement (or a few) that must answer within `limit`. A network that drops packets
/// without a reset (a partition, a host gone) leaves a statement waiting for the kernel's
/// retransmissions, a quarter of an hour: the error instead says the connection is in doubt,
/// and the caller drops it.
pub async fn within<T>(
    limit: Duration,
    statement: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(limit, statement).await {
        Ok(result) => result,
        Err(_) => Err(anyhow::anyhow!(
            "no answer from the database within {}s",
            limit.as_secs()
        )),
    }
}

/// Has the server close this session after `idle` without a statement (`wait_timeout`): a
/// connection whose host is gone without a reset must not hold its locks, claims or open
/// transaction for the server's default of 8 hours.
pub async fn set_wait_timeout(conn: &mut Conn, idle: Duration) -> Result<(), mysql_async::Error> {
    conn.query_drop(format!(
        "SET SESSION wait_timeout = {}",
        idle.as_secs().max(1)
    ))
    .await
}

/// Whether a driver error comes from TLS: the server has none, a certificate does not
/// verify, or the handshake broke. rustls reports through the I/O error it returns.
fn is_tls_error(e: &mysql_async::Error) -> bool {
    use mysql_async::{DriverError, Error, IoError};
    match e {
        Error::Io(IoError::Tls(_)) => true,
        Error::Io(IoError::Io(io)) => io
            .get_ref()
            .is_some_and(|inner| inner.is::<rustls::Error>()),
        Error::Driver(DriverError::NoClientSslFlagFromServer) => true,
        _ => false,
    }
}

/// A claim is owned by the connection id the *server* gave it, and the reaper judges it by
/// the server's processlist. A proxy that answers the client's handshake itself (ProxySQL,
/// MaxScale) gives an id of its own, and keeps server connections in a pool of its own: it
/// may run the client's statements on several of them (multiplexing), and keeps them open
/// after the client has gone, so a dead worker's claims would look alive for as long as the
/// pool keeps its connection. A connection passed through whole (a TCP proxy such as HAProxy
/// in TCP mode, a virtual IP) keeps the two ids equal. The handshake carries only 32 bits of
/// the id.
pub fn check_not_proxied(handshake_id: u32, connection_id: u64) -> Result<(), String> {
    if connection_id & 0xffff_ffff == u64::from(handshake_id) {
        return Ok(());
    }
    Err(format!(
        "the connection id from the handshake ({handshake_id}) is not CONNECTION_ID() ({connection_id}): \
         a proxy answers for the server (ProxySQL, MaxScale) and pools or shares its connections, \
         while myjob's claims are owned by their connection; connect to the server directly or \
         through a TCP proxy (HAProxy in TCP mode, a virtual IP)"
    ))
}

/// The largest packet myjob accepts from the server. The driver's default is the server's
/// `max_allowed_packet` (16 MiB unless raised), but a claimed row carries its payload, which
/// the column allows up to 16 MiB, plus the other columns: such a row would fail every claim
/// of it. The server's own limit still applies to what is sent to it.
const READ_PACKET_LIMIT: usize = 64 << 20;

/// A connection attempt that hangs (a host that drops packets) must not stall a loop for the
/// kernel's TCP timeout of minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects, retrying with capped exponential backoff while the database is unavailable,
/// until it works or `shutdown` fires. Logs one line per failed attempt (see [`Backoff`]).
/// `Ok(None)` means `shutdown` came first; an error is a failure retrying cannot mend (TLS, a
/// multiplexing proxy). Used at startup, before READY=1; the consumer reconnects one attempt
/// at a time instead, so its loop keeps turning.
pub async fn connect_retrying(
    db: &DatabaseSettings,
    what: &str,
    shutdown: &CancellationToken,
) -> Result<Option<Conn>, ConnectError> {
    let mut backoff = Backoff::default();
    loop {
        match connect(db).await {
            Ok(conn) => return Ok(Some(conn)),
            Err(e) if e.failure != ConnectFailure::Unavailable => return Err(e),
            Err(e) => {
                let delay = backoff.failed(what, &e.into());
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// The wait between connection attempts: 0.2 s, doubling up to 10 s. Each failure is logged
/// once, with its attempt number and the wait: one line per attempt, never a flood.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// Logs a failed attempt and returns how long to wait before the next.
    pub fn failed(&mut self, what: &str, e: &anyhow::Error) -> Duration {
        let delay = self.count();
        warn!(attempt = self.failures, retry_in = ?delay, "{what}: {}", crate::error::chain(&**e));
        delay
    }

    /// Counts a failure and returns how long to wait before the next attempt.
    pub fn count(&mut self) -> Duration {
        self.failures += 1;
        Duration::from_millis(200)
            .saturating_mul(1 << (self.failures - 1).min(6))
            .min(Duration::from_secs(10))
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multiplexing_proxy_is_told_apart() {
        assert!(check_not_proxied(7, 7).is_ok());
        // Only 32 bits of the id travel in the handshake.
        assert!(check_not_proxied(5, (1 << 32) + 5).is_ok());
        let e = check_not_proxied(7, 12).unwrap_err();
        assert!(
            e.contains("(7)") && e.contains("(12)") && e.contains("proxy"),
            "{e}"
        );
    }
}
