//! Which server, and which start of it, a connection belongs to (see [`ServerId`]).

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

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
}
