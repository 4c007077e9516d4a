//! Database connections: opening a dedicated connection, reconnecting with backoff, and
//! telling which server (and which start of it) a connection id belongs to.
//!
//! myjob never uses a pool for claims: a claimer's `CONNECTION_ID()` is how the reaper knows
//! the claimer is alive, so the connection must live exactly as long as the claimer does.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, OptsBuilder};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Opens one connection. Sessions read committed data, so a claim skips rows it does not take
/// instead of holding their locks (InnoDB's semi-consistent read).
pub async fn connect(opts: &Opts) -> anyhow::Result<Conn> {
    // Fencing reads affected-row counts as "rows changed", so CLIENT_FOUND_ROWS (which counts
    // rows matched) stays off whatever the url asks for.
    let mut builder = OptsBuilder::from_opts(opts.clone()).client_found_rows(false);
    if opts.max_allowed_packet().is_none() {
        builder = builder.max_allowed_packet(Some(READ_PACKET_LIMIT));
    }
    let opts = builder.init(vec![
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    ]);
    match tokio::time::timeout(CONNECT_TIMEOUT, Conn::new(opts)).await {
        Ok(conn) => conn.map_err(|e| anyhow::anyhow!(describe(&e))),
        Err(_) => anyhow::bail!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
    }
}

/// The largest packet myjob accepts from the server. The driver's default is the server's
/// `max_allowed_packet` (16 MiB unless raised), but a claimed row carries its payload, which
/// the column allows up to 16 MiB, plus the other columns: such a row would fail every claim
/// of it. The server's own limit still applies to what is sent to it.
const READ_PACKET_LIMIT: usize = 64 << 20;

/// A connection attempt that hangs (a host that drops packets) must not stall a loop for the
/// kernel's TCP timeout of minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects, retrying with capped exponential backoff until it works or `shutdown` fires.
/// Logs one line per failed attempt (see [`Backoff`]). `None` means `shutdown` came first.
/// Used at startup, before READY=1; the consumer reconnects one attempt at a time instead, so
/// its loop keeps turning.
pub async fn connect_retrying(
    opts: &Opts,
    what: &str,
    shutdown: &CancellationToken,
) -> Option<Conn> {
    let mut backoff = Backoff::default();
    loop {
        match connect(opts).await {
            Ok(conn) => return Some(conn),
            Err(e) => {
                let delay = backoff.failed(what, &e);
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
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
        self.failures += 1;
        let delay = Duration::from_millis(200)
            .saturating_mul(1 << (self.failures - 1).min(6))
            .min(Duration::from_secs(10));
        warn!(attempt = self.failures, retry_in = ?delay, "{what}: cannot connect to the database: {e:#}");
        delay
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A one-line description of a driver error. mysql_async's own Display of some errors spans
/// several lines; logs and exit messages want one.
pub fn describe(e: &mysql_async::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which server a connection id belongs to: `host:port/start`, where start is the server's
/// start time in Unix seconds. Connection ids restart at 1 when the server restarts, so an id
/// alone cannot say whether its claimer is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerId {
    pub host_port: String,
    pub started: i64,
}

impl ServerId {
    /// Reads the identity of the server `conn` is connected to.
    pub async fn of(conn: &mut Conn) -> anyhow::Result<ServerId> {
        let row: Option<(String, i64, i64)> = conn
            .query_first(
                "SELECT @@hostname, @@port, UNIX_TIMESTAMP() - CAST(VARIABLE_VALUE AS SIGNED) \
                 FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'",
            )
            .await
            .context("reading the server's identity")?;
        let (host, port, started) = row.context("the server reports no uptime")?;
        Ok(ServerId {
            host_port: format!("{host}:{port}"),
            started,
        })
    }

    /// Parses what [`ServerId`]'s Display wrote into `owner_server`.
    pub fn parse(s: &str) -> Option<ServerId> {
        let (host_port, started) = s.rsplit_once('/')?;
        Some(ServerId {
            host_port: host_port.to_owned(),
            started: started.parse().ok()?,
        })
    }

    /// The same server, started at the same time. Start times are computed from a whole-second
    /// uptime, so two readings of one start may differ by a second; a restart within two
    /// seconds of the previous start is not a real case.
    pub fn same_life(&self, other: &ServerId) -> bool {
        self.host_port == other.host_port && (self.started - other.started).abs() <= 2
    }
}

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host_port, self.started)
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
        };
        assert_eq!(ServerId::parse(&a.to_string()), Some(a.clone()));
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
    }
}
