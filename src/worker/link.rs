//! The link: the consumer's one connection, whose `CONNECTION_ID()` marks its claims as
//! alive. It owns the connection's life: connecting with a backoff, reading the server's
//! identity, the keepalive, and the reconnect after a loss. While it is down the consumer
//! keeps turning: handlers finish, prefetched jobs start, outcomes wait.

use std::time::Duration;

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

pub struct Link {
    db: DatabaseSettings,
    conn: Option<Conn>,
    /// `owner_server` for claims made on `conn`.
    server: String,
    /// While `conn` is None: when to try connecting again.
    reconnect_at: Instant,
    /// Counts on until a statement succeeds again, so that a connection that works and a
    /// statement that always fails cannot make a tight connect-fail loop.
    backoff: Backoff,
    /// The server refused a write as read-only: said once, and the backoff is not reset by
    /// reads until a write succeeds again (see [`Link::wrote`]).
    read_only: db::ReadOnly,
    last_query: Instant,
    /// Told once the first connection is up and the server's identity read: the daemon sends
    /// READY=1 only then.
    connected: Option<oneshot::Sender<()>>,
}

/// A connection just made, with the identity of its server, before the consumer adopts its
/// claims on it (see [`Link::connect_if_due`]).
pub struct Fresh {
    pub conn: Conn,
    pub server: String,
}

impl Link {
    pub fn new(db: DatabaseSettings, connected: oneshot::Sender<()>) -> Self {
        Link {
            db,
            conn: None,
            server: String::new(),
            reconnect_at: Instant::now(),
            backoff: Backoff::default(),
            read_only: db::ReadOnly::default(),
            last_query: Instant::now(),
            connected: Some(connected),
        }
    }

    /// The connection, when it is up.
    pub fn conn(&mut self) -> Option<&mut Conn> {
        self.conn.as_mut()
    }

    /// The connection, when it is up, with the `owner_server` of claims made on it.
    pub fn claimer(&mut self) -> Option<(&mut Conn, &str)> {
        Some((self.conn.as_mut()?, &self.server))
    }

    pub fn is_up(&self) -> bool {
        self.conn.is_some()
    }

    /// A statement ran: the keepalive waits again.
    pub fn used(&mut self) {
        self.last_query = Instant::now();
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
        self.conn = None;
        self.reconnect_at = Instant::now() + self.backoff.count();
    }

    /// The next thing the link needs time for: a reconnect when down, a ping when up.
    pub fn deadline(&self) -> Instant {
        match self.conn {
            Some(_) => self.last_query + KEEPALIVE,
            None => self.reconnect_at,
        }
    }

    /// Pings the connection if it has been quiet for [`KEEPALIVE`].
    pub async fn keepalive(&mut self) {
        if Instant::now() < self.last_query + KEEPALIVE {
            return;
        }
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match conn.ping().await {
            Ok(()) => self.used(),
            Err(e) => self.lost(&anyhow::anyhow!(db::describe(&e))),
        }
    }

    /// When the link is down and its backoff has passed, one attempt to connect. A new
    /// connection is handed back with its server's identity, for the consumer to adopt its
    /// claims on before [`Link::install`]; a failure is logged and waits for the backoff.
    pub async fn connect_if_due(&mut self) -> Option<Fresh> {
        if self.conn.is_some() || Instant::now() < self.reconnect_at {
            return None;
        }
        let result = match db::connect(&self.db).await {
            Ok(mut conn) => match ServerId::of(&mut conn).await {
                Ok(server) => Ok(Fresh {
                    conn,
                    server: server.to_string(),
                }),
                Err(e) => Err(e.context("setting up the connection")),
            },
            Err(e) => Err(e.into()),
        };
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
        self.reconnect_at = Instant::now() + self.backoff.failed("consumer", e);
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
        self.conn = Some(fresh.conn);
        self.server = fresh.server;
        self.used();
        if let Some(tx) = self.connected.take() {
            let _ = tx.send(());
        }
    }

    /// Closes the connection at the end of a stop.
    pub async fn close(&mut self) {
        if let Some(conn) = self.conn.take() {
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
        assert!(link.connect_if_due().await.is_none());
        let first = link.deadline() - Instant::now();
        assert!(first > Duration::from_millis(100), "{first:?}");
        assert!(
            link.connect_if_due().await.is_none(),
            "not due again before the backoff"
        );
        tokio::time::sleep_until(link.deadline()).await;
        assert!(link.connect_if_due().await.is_none());
        let second = link.deadline() - Instant::now();
        assert!(second > first, "{second:?} after {first:?}");
        assert!(rx.try_recv().is_err(), "no READY without a connection");
    }
}
