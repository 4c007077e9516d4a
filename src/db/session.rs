//! A background task's own connection, and its life: opened at the first pass that needs it,
//! kept across passes, given up when a failure leaves it in doubt, closed at the stop. The
//! reaper, the stager and the scheduler each hold one; the consumer has its own (`Link`),
//! whose claims are owned by its connection id.
//!
//! Why one type: the three tasks each wrote out the same life (an `Option<Conn>`, the
//! session's `wait_timeout`, a read-only server said once, a backoff, a ROLLBACK or a drop
//! after a failed pass), and a state that belongs to one connection (the stager's lock, the
//! server the reaper reached) must go with it. `T` is that state: it lives in
//! [`Link::Open`] beside the connection, so a new connection never inherits an old one's.

use std::time::Duration;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;
use tracing::warn;

use super::{classify, connect, set_wait_timeout, Backoff, ReadOnly};
use crate::config::DatabaseSettings;
use crate::error::chain;

/// A task's connection and what belongs to it.
pub struct Session<T> {
    /// The task, as its log lines name it (`stager`).
    who: &'static str,
    db: DatabaseSettings,
    link: Link<T>,
    /// While the server is read-only: said once, and again once it takes writes.
    read_only: ReadOnly,
    /// The pause before a pass after failed ones.
    backoff: Backoff,
}

/// The connection, when there is one, with the state that lives as long as it does.
enum Link<T> {
    /// None: the next pass opens one.
    Closed,
    Open {
        conn: Conn,
        with: T,
    },
}

/// What a failed pass did to the connection (see [`Session::failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The server takes no writes: said once, the connection dropped, and the next pass
    /// waits a growing pause (another connection may reach a writable server).
    ReadOnly,
    /// A lost race or a refused statement: rolled back, and the connection (with its state:
    /// a lock it holds) kept for the next pass.
    Kept,
    /// The connection is in doubt: dropped, and the next pass opens another.
    Dropped,
}

impl<T> Session<T> {
    pub fn new(who: &'static str, db: DatabaseSettings) -> Self {
        Session {
            who,
            db,
            link: Link::Closed,
            read_only: ReadOnly::default(),
            backoff: Backoff::default(),
        }
    }

    pub fn db(&self) -> &DatabaseSettings {
        &self.db
    }

    pub fn is_open(&self) -> bool {
        matches!(self.link, Link::Open { .. })
    }

    /// The connection and its state, when open.
    pub fn get(&mut self) -> Option<(&mut Conn, &mut T)> {
        match &mut self.link {
            Link::Open { conn, with } => Some((conn, with)),
            Link::Closed => None,
        }
    }

    /// The connection, opened when there is none: its session's `wait_timeout` set to
    /// `idle` (a task's passes come more often, so the server never closes a live one, and a
    /// host gone without a FIN does not hold its locks for the server's default of 8 hours),
    /// then its state made by `with`.
    pub async fn open(
        &mut self,
        idle: Duration,
        with: impl AsyncFnOnce(&mut Conn) -> anyhow::Result<T>,
    ) -> anyhow::Result<(&mut Conn, &mut T)> {
        if let Link::Closed = self.link {
            let mut conn = connect(&self.db).await?;
            set_wait_timeout(&mut conn, idle)
                .await
                .context("setting the session's wait_timeout")?;
            let with = with(&mut conn).await?;
            self.link = Link::Open { conn, with };
        }
        match &mut self.link {
            Link::Open { conn, with } => Ok((conn, with)),
            Link::Closed => unreachable!("opened above"),
        }
    }

    /// Forgets the connection without a word to the server, which rolls back what it left
    /// open and releases its locks: for a connection that may not answer.
    pub fn drop_link(&mut self) {
        self.link = Link::Closed;
    }

    /// Closes the connection, telling the server: at the stop, or with nothing to do.
    pub async fn close(&mut self) {
        if let Link::Open { conn, .. } = std::mem::replace(&mut self.link, Link::Closed) {
            let _ = conn.disconnect().await;
        }
    }

    /// A pass succeeded: the backoff starts again.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// A write went through: a read-only server said before is over.
    pub fn wrote(&mut self) {
        self.read_only.wrote(self.who);
    }

    /// Counts a failed pass, and returns the pause before the next: 0.2 s, doubling up to
    /// 10 s.
    pub fn backoff(&mut self) -> Duration {
        self.backoff.count()
    }

    /// A pass failed with `e`: a lost race or a refused statement keeps the connection once a
    /// ROLLBACK ends what the pass left open; a read-only server or anything else drops it.
    /// Says so in one line, naming `next`, when the task tries again (`the next pass`).
    pub async fn failed(&mut self, e: &anyhow::Error, next: &str) -> Failed {
        if self.read_only.failed(self.who, e) {
            self.link = Link::Closed;
            return Failed::ReadOnly;
        }
        let kept = match &mut self.link {
            Link::Open { conn, .. } if classify(e).keeps_connection() => {
                conn.query_drop("ROLLBACK").await.is_ok()
            }
            Link::Open { .. } | Link::Closed => false,
        };
        if kept {
            warn!("{}: {}; trying again at {next}", self.who, chain(&**e));
            Failed::Kept
        } else {
            warn!("{}: {}; reconnecting at {next}", self.who, chain(&**e));
            self.link = Link::Closed;
            Failed::Dropped
        }
    }

    /// A pass failed with `e`, and the connection may be in the middle of anything (a
    /// statement cut off by its time limit): dropped without a ROLLBACK, which could wait
    /// as long. Returns whether the server is read-only (said once; else `e` is said here).
    pub fn gave_up(&mut self, e: &anyhow::Error) -> bool {
        self.link = Link::Closed;
        if self.read_only.failed(self.who, e) {
            return true;
        }
        warn!("{}: {}; trying again", self.who, chain(&**e));
        false
    }
}
