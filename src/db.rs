//! Database connections: opening a dedicated connection, reconnecting with backoff, and
//! telling which server (and which start of it) a connection id belongs to.
//!
//! myjob never uses a pool for claims: a claimer's `CONNECTION_ID()` is how the reaper knows
//! the claimer is alive, so the connection must live exactly as long as the claimer does.

use std::fmt;
use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, OptsBuilder};
use tokio_util::sync::CancellationToken;
use tracing::warn;

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

/// Which statements of a session wait for the cluster on a Galera node: see [`causal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Causal {
    /// Reads (SELECT, SHOW): the schema check and the operator commands.
    Reads,
    /// Reads and writes: `myjob lock`'s lease, which judges a row by its time.
    Everything,
}

/// On a Galera node, makes the session's statements wait until the node has applied every
/// write the cluster committed before them (`wsrep_sync_wait`). A node applies other nodes'
/// commits a moment after they commit; without the wait, a read through it may not see a
/// `myjob migrate` or an enqueue just committed through another node. It costs a round trip
/// of the cluster per statement, so the claim's hot path never asks for it. Elsewhere it does
/// nothing: MySQL has no `wsrep_on`, and a MariaDB outside a cluster says OFF. Says whether
/// the server is a Galera node (so that a caller on a long-lived connection knows to call
/// [`causal_off`] after).
pub async fn causal(conn: &mut Conn, what: Causal) -> anyhow::Result<bool> {
    let wsrep: Option<(String, String)> = conn
        .query_first("SHOW VARIABLES LIKE 'wsrep_on'")
        .await
        .context("asking whether the server is a Galera node")?;
    if !wsrep.is_some_and(|(_, on)| on.eq_ignore_ascii_case("ON")) {
        return Ok(false);
    }
    // Bits: 1 reads, 2 UPDATE and DELETE, 4 INSERT and REPLACE.
    let mask = match what {
        Causal::Reads => 1,
        Causal::Everything => 7,
    };
    conn.query_drop(format!("SET SESSION wsrep_sync_wait = {mask}"))
        .await
        .context("asking the Galera node for causal reads")?;
    Ok(true)
}

/// Ends what [`causal`] began, on a Galera node: the session's statements stop waiting for
/// the cluster (the claim's hot path must not pay a cluster round trip per statement).
pub async fn causal_off(conn: &mut Conn) -> anyhow::Result<()> {
    conn.query_drop("SET SESSION wsrep_sync_wait = 0")
        .await
        .context("ending the Galera node's causal reads")
}

/// What [`try_lock`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedLock {
    /// Taken by this connection: held until it is released or the connection ends.
    Held,
    /// Another connection holds it.
    Busy,
    /// The server refuses lock functions: some MariaDB Galera releases do with wsrep on
    /// (MDEV-30473). The caller then acts without it, its writes fenced by what they change.
    Unsupported,
}

/// Tries to take the named lock `prefix.<database>` without waiting. Named after the
/// database, so that separate myjob databases on one server each get their own.
pub async fn try_lock(conn: &mut Conn, prefix: &str) -> anyhow::Result<NamedLock> {
    const ER_NOT_SUPPORTED_YET: u16 = 1235;
    let got: Result<Option<(Option<i64>,)>, _> = conn
        .exec_first(
            "SELECT GET_LOCK(LEFT(CONCAT(?, '.', DATABASE()), 64), 0)",
            (prefix,),
        )
        .await;
    match got {
        Ok(Some((Some(1),))) => Ok(NamedLock::Held),
        Ok(_) => Ok(NamedLock::Busy),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NOT_SUPPORTED_YET => {
            Ok(NamedLock::Unsupported)
        }
        Err(e) => Err(e).with_context(|| format!("taking the lock {prefix}")),
    }
}

/// Releases what [`try_lock`] took.
pub async fn release_lock(conn: &mut Conn, prefix: &str) -> anyhow::Result<()> {
    conn.exec_drop(
        "DO RELEASE_LOCK(LEFT(CONCAT(?, '.', DATABASE()), 64))",
        (prefix,),
    )
    .await
    .with_context(|| format!("releasing the lock {prefix}"))
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

/// The longest the two statements of an identity reading may take together: the uptime is
/// whole seconds, so a reading is off by at most this plus a second, within the two seconds
/// [`ServerId::same_life`] allows.
const IDENTITY_SKEW: Duration = Duration::from_millis(500);
/// How many readings [`ServerId::of`] makes before it gives up on the connection.
const IDENTITY_TRIES: u32 = 3;

/// Which server a connection id belongs to: `host:port/start`, where start is the server's
/// start time in Unix seconds. Connection ids restart at 1 when the server restarts, so an id
/// alone cannot say whether its claimer is alive. A Galera node adds `/galera:<uuid>`, its
/// member id in the cluster, new at each start: the reapers of the other nodes tell by the
/// cluster's member list whether the node a claim was made through is still there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerId {
    pub host_port: String,
    pub started: i64,
    pub galera: Option<String>,
}

impl ServerId {
    /// Reads the identity of the server `conn` is connected to, the same way on every server:
    /// MySQL 5.7+ moved `information_schema.GLOBAL_STATUS` to performance_schema, which
    /// MariaDB leaves off by default, while `SHOW GLOBAL STATUS` works everywhere (and
    /// shows no wsrep_ variables where there is no Galera).
    ///
    /// The start time is the clock of one statement less the uptime of another, so a stall
    /// between the two (a lost packet, a stunned VM) would shift it by as long: the claims of
    /// such a connection would name a server no reaper stamps, look dead and run again. A
    /// reading whose two statements took longer than [`IDENTITY_SKEW`] is read again.
    pub async fn of(conn: &mut Conn) -> anyhow::Result<ServerId> {
        let mut slowest = Duration::ZERO;
        for _ in 0..IDENTITY_TRIES {
            let asked = tokio::time::Instant::now();
            let id = Self::read(conn).await?;
            let took = asked.elapsed();
            if took <= IDENTITY_SKEW {
                return Ok(id);
            }
            slowest = slowest.max(took);
        }
        anyhow::bail!(
            "reading the server's start time: {IDENTITY_TRIES} readings each took longer than {}ms (up to {}ms), so it cannot be told to the second",
            IDENTITY_SKEW.as_millis(),
            slowest.as_millis()
        )
    }

    /// One reading of the identity, in two statements.
    async fn read(conn: &mut Conn) -> anyhow::Result<ServerId> {
        let status: Vec<(String, String)> = conn
            .query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Uptime', 'wsrep_gcomm_uuid')")
            .await
            .context("reading the server's uptime")?;
        let value = |name: &str| {
            status
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let uptime: i64 = value("Uptime")
            .and_then(|v| v.parse().ok())
            .context("the server reports no uptime")?;
        let galera = value("wsrep_gcomm_uuid").filter(|v| !v.is_empty());
        let row: Option<(String, i64, i64)> = conn
            .query_first("SELECT @@hostname, @@port, UNIX_TIMESTAMP()")
            .await
            .context("reading the server's identity")?;
        let (host, port, now) = row.context("the server reports no hostname")?;
        Ok(ServerId {
            host_port: format!("{host}:{port}"),
            started: now - uptime,
            galera,
        })
    }

    /// Parses what [`ServerId`]'s Display wrote into `owner_server`.
    pub fn parse(s: &str) -> Option<ServerId> {
        let (rest, galera) = match s.rsplit_once("/galera:") {
            Some((rest, uuid)) if !uuid.is_empty() => (rest, Some(uuid.to_owned())),
            _ => (s, None),
        };
        let (host_port, started) = rest.rsplit_once('/')?;
        Some(ServerId {
            host_port: host_port.to_owned(),
            started: started.parse().ok()?,
            galera,
        })
    }

    /// The same server, started at the same time. Start times are computed from a whole-second
    /// uptime, so two readings of one start may differ by a second; a restart within two
    /// seconds of the previous start is not a real case.
    pub fn same_life(&self, other: &ServerId) -> bool {
        self.host_port == other.host_port
            // abs_diff: an owner_server is a producer's to write, any start time included.
            && self.started.abs_diff(other.started) <= 2
            && self.galera == other.galera
    }
}

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host_port, self.started)?;
        if let Some(uuid) = &self.galera {
            write!(f, "/galera:{uuid}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ids_round_trip_and_tolerate_a_second() {
        let a = ServerId {
            host_port: "db:3306".into(),
            started: 1000,
            galera: None,
        };
        assert_eq!(ServerId::parse(&a.to_string()), Some(a.clone()));
        let node = ServerId {
            galera: Some("29ab696b-e67e-11f1-aee0-3a699539bd45".into()),
            ..a.clone()
        };
        assert_eq!(
            node.to_string(),
            "db:3306/1000/galera:29ab696b-e67e-11f1-aee0-3a699539bd45"
        );
        assert_eq!(ServerId::parse(&node.to_string()), Some(node.clone()));
        assert!(!a.same_life(&node));
        assert!(a.same_life(&ServerId {
            started: 1001,
            ..a.clone()
        }));
        assert!(!a.same_life(&ServerId {
            started: 1300,
            ..a.clone()
        }));
        assert!(!a.same_life(&ServerId {
            host_port: "db2:3306".into(),
            ..a.clone()
        }));
        assert_eq!(ServerId::parse("db:3306"), None);
        assert_eq!(ServerId::parse("db:3306/soon"), None);
    }

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
