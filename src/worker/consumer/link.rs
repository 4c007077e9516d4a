//! The link: the consumer's one connection, whose `CONNECTION_ID()` marks its claims as
//! alive. It owns the connection's life: connecting with a backoff, reading the server's
//! identity, the keepalive, and the reconnect after a loss. While it is down the consumer
//! keeps turning: handlers finish, prefetched jobs start, outcomes wait.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::DatabaseSettings;
use crate::db::{self, Backoff, ServerId};
use crate::error::chain;

/// How long the connection may sit without a query before it is pinged, so that a server's
/// `wait_timeout` never closes it under a long-running handler.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// How much longer than a lock wait (`database.lock_wait_timeout`) any of the consumer's
/// statements may take before its connection counts as lost: see [`Link::limit`].
const STATEMENT_SLACK: Duration = Duration::from_secs(5);

/// The longest a connection and its setup (identity, adopting the claims) may take.
const SETUP_LIMIT: Duration = Duration::from_secs(15);

/// What the server's `wait_timeout` for this session adds to the longest the consumer can
/// take to stop its handlers: see [`session_wait_timeout`].
const WAIT_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

/// How long a consumer goes without an answer before it stops its handlers (see
/// [`Link::fence`]): half of `stale_after`, and never less than one statement's limit.
fn fence_for(limit: Duration, stale_after: Duration) -> Duration {
    (stale_after / 2).max(limit)
}

/// The session's `wait_timeout`: the server drops the connection of a consumer it has not
/// heard from for this long, and the reaper then puts its claims back. Longer than the
/// consumer can take to stop its handlers once the server stops answering (the last
/// answer may come a statement's limit after the server last heard from it; then the
/// fence, and the loop's longest wait), so that a handler cut off by a partition is dead
/// before its job can run elsewhere; short enough that a host gone without a reset (power
/// lost, a partition) gives its claims back in a minute or two, not after hours of TCP
/// keepalive or the server's default of 8 hours.
pub fn session_wait_timeout(db: &DatabaseSettings, stale_after: Duration) -> Duration {
    let limit = statement_limit(db);
    limit + fence_for(limit, stale_after) + limit.max(SETUP_LIMIT) + WAIT_TIMEOUT_MARGIN
}

/// The longest one of the consumer's statements may take (see [`Link::limit`]).
fn statement_limit(db: &DatabaseSettings) -> Duration {
    Duration::from_secs(db.lock_wait_timeout) + STATEMENT_SLACK
}

pub struct Link {
    db: DatabaseSettings,
    state: State,
    /// Counts on until a statement succeeds again, so that a connection that works and a
    /// statement that always fails cannot make a tight connect-fail loop.
    backoff: Backoff,
    /// The longest one statement may take (see [`Link::limit`]).
    limit: Duration,
    /// When the server last answered on this link.
    last_answer: Instant,
    /// How long without an answer the consumer stops its handlers (see [`Link::fence`]);
    /// set at each connect, with the session's `wait_timeout` that it must stay under.
    fence: Duration,
    /// The server refused a write as read-only: said once, and the backoff is not reset by
    /// reads until a write succeeds again (see [`Link::wrote`]).
    read_only: db::ReadOnly,
    /// Told once the first connection is up and the server's identity read: the daemon sends
    /// READY=1 only then.
    connected: Option<oneshot::Sender<()>>,
}

/// Whether the link is connected, with what each state needs.
enum State {
    /// Connected. Claims made on `conn` carry `server` as their `owner_server`; the keepalive
    /// pings after [`KEEPALIVE`] without a statement since `last_query`.
    Up {
        conn: Conn,
        server: String,
        last_query: Instant,
    },
    /// Not connected: the next attempt is due at `reconnect_at`. `refused`: the server itself
    /// turned the last attempt down (see [`Link::refused_fence`]).
    Down {
        reconnect_at: Instant,
        refused: bool,
    },
}

/// A connection just made, with the identity of its server, before the consumer adopts its
/// claims on it (see [`Link::connect_if_due`]).
pub struct Fresh {
    pub conn: Conn,
    pub server: String,
    /// The fence that goes with the session's `wait_timeout` (see [`Link::fence`]).
    fence: Duration,
}

impl Link {
    pub fn new(db: DatabaseSettings, connected: oneshot::Sender<()>) -> Self {
        let limit = statement_limit(&db);
        Link {
            db,
            state: State::Down {
                reconnect_at: Instant::now(),
                refused: false,
            },
            backoff: Backoff::default(),
            limit,
            last_answer: Instant::now(),
            fence: limit,
            read_only: db::ReadOnly::default(),
            connected: Some(connected),
        }
    }

    /// The connection, when it is up.
    pub fn conn(&mut self) -> Option<&mut Conn> {
        match &mut self.state {
            State::Up { conn, .. } => Some(conn),
            State::Down { .. } => None,
        }
    }

    /// The connection, when it is up, with the `owner_server` of claims made on it.
    pub fn claimer(&mut self) -> Option<(&mut Conn, &str)> {
        match &mut self.state {
            State::Up { conn, server, .. } => Some((conn, server.as_str())),
            State::Down { .. } => None,
        }
    }

    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up { .. })
    }

    /// A statement ran: the keepalive waits again.
    pub fn used(&mut self) {
        let now = Instant::now();
        if let State::Up { last_query, .. } = &mut self.state {
            *last_query = now;
        }
        self.last_answer = now;
    }

    /// The longest one of the consumer's statements may take: a lock wait and some. A
    /// statement that has no answer by then runs on a connection in doubt (a partition, a
    /// host gone without a reset), which is dropped rather than waited on for the kernel's
    /// quarter of an hour of retransmissions (see [`db::within`]).
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// How long the server has not answered on this link, connected or not.
    pub fn silent_for(&self) -> Duration {
        self.last_answer.elapsed()
    }

    /// How long the consumer may go without an answer before it stops its handlers: half of
    /// `stale_after` (a restart of the server or a blip is ridden out), and never less than
    /// one statement's limit (see [`fence_for`]). The loop notices at its next turn, which
    /// waits at most for one statement, or for a connection and its setup.
    pub fn fence(&self) -> Duration {
        self.fence
    }

    /// How long the consumer may go without an answer before it stops its handlers, when the
    /// server is up but turns its reconnects down (too many connections, say): the server
    /// lists no connection of this instance's, so another instance's reaper puts its claims
    /// back two passes after it lost its connection, one `interval` apart. The handlers stop
    /// at half that. Otherwise [`Link::fence`]: a server that does not answer runs no reaper,
    /// and one that restarted judges earlier claims by their server's heartbeat.
    pub fn refused_fence(&self, interval: Duration) -> Option<Duration> {
        matches!(self.state, State::Down { refused: true, .. })
            .then(|| (interval / 2).min(self.fence))
    }

    /// A statement succeeded: the connection works, and the backoff starts over, unless the
    /// server is read-only, where reads work and writes do not.
    pub fn succeeded(&mut self) {
        self.used();
        if !self.read_only.is_on() {
            self.backoff.reset();
        }
    }

    /// A write succeeded: the server takes writes, whatever it said before.
    pub fn wrote(&mut self) {
        self.read_only.wrote("consumer");
        self.succeeded();
    }

    /// The connection failed: it is dropped (which closes it, so its id leaves the
    /// processlist) and a reconnect is due after the backoff.
    pub fn lost(&mut self, e: &anyhow::Error) {
        // A read-only server is said once; a new connection may reach a writable one.
        if !self.read_only.failed("consumer", e) {
            warn!("consumer: database error, reconnecting: {}", chain(&**e));
        }
        self.state = State::Down {
            reconnect_at: Instant::now() + self.backoff.count(),
            refused: false,
        };
    }

    /// The next thing the link needs time for: a reconnect when down, a ping when up.
    pub fn deadline(&self) -> Instant {
        match self.state {
            State::Up { last_query, .. } => last_query + KEEPALIVE,
            State::Down { reconnect_at, .. } => reconnect_at,
        }
    }

    /// Pings the connection if it has been quiet for [`KEEPALIVE`].
    pub async fn keepalive(&mut self) {
        let State::Up {
            conn, last_query, ..
        } = &mut self.state
        else {
            return;
        };
        if Instant::now() < *last_query + KEEPALIVE {
            return;
        }
        let ping = async {
            conn.ping()
                .await
                .map_err(|e| anyhow::anyhow!(db::describe(&e)))
        };
        match db::within(self.limit, ping).await {
            Ok(()) => self.used(),
            Err(e) => self.lost(&e),
        }
    }

    /// When the link is down and its backoff has passed, one attempt to connect. A new
    /// connection is handed back with its server's identity, for the consumer to adopt its
    /// claims on before [`Link::install`]; a failure is logged and waits for the backoff.
    pub async fn connect_if_due(&mut self, stale_after: Duration) -> Option<Fresh> {
        match self.state {
            State::Down { reconnect_at, .. } if Instant::now() >= reconnect_at => {}
            _ => return None,
        }
        let fence = fence_for(self.limit, stale_after);
        let wait_timeout = session_wait_timeout(&self.db, stale_after);
        let setup = async {
            let mut conn = db::connect(&self.db).await?;
            let server = ServerId::of(&mut conn)
                .await
                .context("setting up the connection")?;
            db::set_wait_timeout(&mut conn, wait_timeout)
                .await
                .context("setting up the connection: wait_timeout")?;
            Ok::<_, anyhow::Error>(Fresh {
                conn,
                server: server.to_string(),
                fence,
            })
        };
        let result = db::within(SETUP_LIMIT, setup).await;
        match result {
            Ok(fresh) => Some(fresh),
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }

    /// Connecting, or setting up the new connection, failed.
    pub fn failed(&mut self, e: &anyhow::Error) {
        let refused = e
            .downcast_ref::<db::ConnectError>()
            .is_some_and(|c| c.answered);
        self.state = State::Down {
            reconnect_at: Instant::now() + self.backoff.failed("consumer", e),
            refused,
        };
    }

    /// Puts a connection that is set up into use.
    pub fn install(&mut self, fresh: Fresh, adopted: u64) {
        let id = fresh.conn.id();
        if adopted > 0 {
            info!(
                connection = id,
                adopted, "consumer: connected; adopted the claims of running jobs"
            );
        } else {
            info!(connection = id, "consumer: connected");
        }
        self.state = State::Up {
            conn: fresh.conn,
            server: fresh.server,
            last_query: Instant::now(),
        };
        self.fence = fresh.fence;
        self.used();
        if let Some(tx) = self.connected.take() {
            let _ = tx.send(());
        }
    }

    /// Closes the connection at the end of a stop.
    pub async fn close(&mut self) {
        let down = State::Down {
            reconnect_at: Instant::now(),
            refused: false,
        };
        if let State::Up { conn, .. } = std::mem::replace(&mut self.state, down) {
            let _ = conn.disconnect().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_connect_waits_for_a_growing_backoff() {
        // Nothing listens on port 1: a real connect that is refused at once.
        let db = DatabaseSettings::from_url("mysql://myjob@127.0.0.1:1/test").unwrap();
        let (tx, mut rx) = oneshot::channel();
        let mut link = Link::new(db, tx);
        assert!(!link.is_up());
        assert!(
            link.deadline() <= Instant::now(),
            "the first attempt is due at once"
        );
        assert!(link
            .connect_if_due(Duration::from_secs(120))
            .await
            .is_none());
        let first = link.deadline() - Instant::now();
        assert!(first > Duration::from_millis(100), "{first:?}");
        assert!(
            link.connect_if_due(Duration::from_secs(120))
                .await
                .is_none(),
            "not due again before the backoff"
        );
        tokio::time::sleep_until(link.deadline()).await;
        assert!(link
            .connect_if_due(Duration::from_secs(120))
            .await
            .is_none());
        let second = link.deadline() - Instant::now();
        assert!(second > first, "{second:?} after {first:?}");
        assert!(rx.try_recv().is_err(), "no READY without a connection");
    }

    /// docs/servers.md gives the formula and its figure at the defaults; it must be this.
    #[test]
    fn the_documented_wait_timeout_is_the_sessions() {
        let db = DatabaseSettings::from_url("mysql://myjob@127.0.0.1:3306/test").unwrap();
        let stale_after = Duration::from_secs(120);
        let limit = statement_limit(&db);
        let fence = fence_for(limit, stale_after);
        let (l, f, s, m) = (
            limit.as_secs(),
            fence.as_secs(),
            limit.max(SETUP_LIMIT).as_secs(),
            WAIT_TIMEOUT_MARGIN.as_secs(),
        );
        let total = session_wait_timeout(&db, stale_after).as_secs();
        assert_eq!(l + f + s + m, total);
        let docs = include_str!("../../../docs/servers.md").replace("\n  ", " ");
        let said = format!("{total} s by default ({l} + {f} + {s} + {m})");
        assert!(docs.contains(&said), "docs/servers.md should say {said:?}");
        assert!(docs.contains("`lock_wait_timeout` plus 5 s") && STATEMENT_SLACK.as_secs() == 5);
    }
}
