//! What `myjob lock` holds while its command runs: the server's named lock, or on a Galera
//! cluster a lease row of `myjob_locks`.
//!
//! A named lock (`GET_LOCK`) lives and dies with its connection: the server frees it the
//! moment the connection ends, so a lost connection means a lost lock, while the holder
//! learns of it only at its next check and then gives its command `--kill-grace`. So a holder
//! keeps a marker row in `myjob_locks` while it holds the lock and deletes it when it
//! releases the lock itself; a new holder that finds a marker left behind waits out the old
//! holder's check, its answer and its grace before it starts its command (see migration 9).
//! A lock released by its holder passes on at once. Without the table (not migrated, not
//! granted) every new holder waits that long, since it cannot tell. A Galera node keeps
//! named locks to itself, so there the lock is a lease, replicated to every node: renewed
//! every second, and taken over by another only once it has gone unrenewed for the lease's
//! length, 15 s plus `--kill-grace`. The holder stops its command (SIGTERM, then SIGKILL
//! `--kill-grace` later) before that: at the latest 12 s after the last renewal the server
//! confirmed, and at once when a renewal fails. So the command is dead before another node
//! can take the lock, provided the nodes' clocks agree to within the 3 s left (NTP keeps them
//! within milliseconds).

use std::time::Duration;

use anyhow::anyhow;
use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::time::{sleep, timeout, Instant};
use tracing::{info, warn};

use crate::db;
use crate::store::locks;

/// A lease's length beyond `--kill-grace`.
const LEASE_BASE: Duration = Duration::from_secs(15);
/// The part of a lease the holder leaves unused: its command is dead this long before
/// another node may take the lock.
const MARGIN: Duration = Duration::from_secs(3);
/// How long one check may take before the connection counts as lost.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiter tries a lease again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How long after its named lock is lost a holder may take to stop its command: its next
/// check, the check's answer, and the grace.
fn stop_within(kill_grace: Duration) -> Duration {
    super::CHECK_EVERY + CHECK_TIMEOUT + kill_grace
}

/// A lock held.
pub enum Held {
    /// `GET_LOCK` on the connection, and the token of its marker row, if it could write one.
    Named { marker: Option<u64> },
    /// A lease row, with the token that fences its renewals and when the server last
    /// confirmed one (the time the renewal was sent).
    Lease {
        token: u64,
        lease: Duration,
        kill_grace: Duration,
        renewed: Instant,
    },
}

impl Held {
    /// Takes lock `name`, waiting up to `wait`; None when another holds it still. A Galera
    /// node takes a lease.
    pub async fn take(
        conn: &mut Conn,
        name: &str,
        galera: bool,
        wait: Duration,
        kill_grace: Duration,
    ) -> anyhow::Result<Option<Held>> {
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        let held_by = format!("{host}:{}", std::process::id());
        let holder = locks::Holder {
            // Never 0, which would read as no token.
            token: rand::random::<std::num::NonZeroU64>().get(),
            held_by: &held_by,
        };
        if !galera {
            let got: Option<Option<i64>> = conn
                .exec_first("SELECT GET_LOCK(?, ?)", (name, wait.as_secs_f64()))
                .await
                .map_err(|e| anyhow!("cannot take it: {}", db::describe(&e)))?;
            if got.flatten() != Some(1) {
                return Ok(None);
            }
            return Self::named(conn, name, &holder, kill_grace).await.map(Some);
        }
        let lease = LEASE_BASE + kill_grace;
        let deadline = Instant::now() + wait;
        loop {
            let sent = Instant::now();
            match locks::take(conn, name, &holder, lease).await {
                Ok(true) => {
                    return Ok(Some(Held::Lease {
                        token: holder.token,
                        lease,
                        kill_grace,
                        renewed: sent,
                    }))
                }
                Ok(false) => {}
                // Another node took it in the same moment: certification let its commit win.
                Err(e) if matches!(db::classify(&e), db::Failure::Conflict(_)) => {}
                Err(e) => return Err(anyhow!("cannot take it: {}", crate::error::chain(&*e))),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            sleep(RETRY_EVERY.min(deadline - now)).await;
        }
    }

    /// Just after `GET_LOCK`: writes the marker, and waits out the last holder's command if
    /// it left its marker behind, or if there is no telling.
    async fn named(
        conn: &mut Conn,
        name: &str,
        holder: &locks::Holder<'_>,
        kill_grace: Duration,
    ) -> anyhow::Result<Held> {
        let own = stop_within(kill_grace);
        let (marker, wait) = match locks::mark(conn, name, holder, own).await {
            Ok(None) => (Some(holder.token), None),
            Ok(Some(left)) => {
                info!(
                    lock = %name,
                    "its last holder lost it without releasing it: waiting {} for that holder to stop its command",
                    humantime::format_duration(left)
                );
                (Some(holder.token), Some(left))
            }
            Err(e) if db::classify(&e).keeps_connection() || is_missing(&e) => {
                warn!(
                    lock = %name,
                    "cannot keep its marker ({}), so whether its last holder released it cannot be told: waiting {} for that holder to stop its command (run myjob migrate, and grant the account myjob_locks)",
                    crate::error::chain(&*e),
                    humantime::format_duration(own)
                );
                (None, Some(own))
            }
            Err(e) => return Err(anyhow!("cannot take it: {}", crate::error::chain(&*e))),
        };
        if let Some(wait) = wait {
            sleep(wait).await;
        }
        Ok(Held::Named { marker })
    }

    /// When the command must be stopped at the latest, if the lock is not confirmed again
    /// before: a lease's last confirmed renewal, plus the lease, less the grace the command
    /// gets after SIGTERM and the margin. None for a named lock.
    pub fn stop_by(&self) -> Option<Instant> {
        match self {
            Held::Named { .. } => None,
            Held::Lease {
                lease,
                kill_grace,
                renewed,
                ..
            } => Some(*renewed + *lease - *kill_grace - MARGIN),
        }
    }

    /// Checks that the lock is still held (and renews a lease); the error says why not, as
    /// the end of "lock NAME: …, so the command was stopped".
    pub async fn check(&mut self, conn: &mut Conn, name: &str) -> Result<(), String> {
        let limit = match self.stop_by() {
            Some(by) => CHECK_TIMEOUT.min(by.saturating_duration_since(Instant::now())),
            None => CHECK_TIMEOUT,
        };
        let sent = Instant::now();
        match self {
            Held::Named { .. } => {
                let asked = conn.exec_first::<Option<u64>, _, _>(
                    "SELECT IS_USED_LOCK(?) = CONNECTION_ID()",
                    (name,),
                );
                match timeout(limit, asked).await {
                    Ok(Ok(Some(Some(1)))) => Ok(()),
                    Ok(Ok(_)) => Err(lost("the server no longer holds it for this connection")),
                    Ok(Err(e)) => Err(lost(&db::describe(&e))),
                    Err(_) => Err(lost(&format!("no answer within {}s", limit.as_secs()))),
                }
            }
            Held::Lease { token, renewed, .. } => {
                match timeout(limit, locks::renew(conn, name, *token)).await {
                    Ok(Ok(true)) => {
                        *renewed = sent;
                        Ok(())
                    }
                    Ok(Ok(false)) => Err("its lease was taken over or deleted".into()),
                    Ok(Err(e)) => Err(format!(
                        "its lease could not be renewed ({})",
                        crate::error::chain(&*e)
                    )),
                    Err(_) => Err(format!(
                        "its lease could not be renewed (no answer within {:.1}s)",
                        limit.as_secs_f64()
                    )),
                }
            }
        }
    }

    /// Gives the lock up and closes the connection; closing alone frees a named lock, and a
    /// lease left behind expires.
    /// Each step has [`CHECK_TIMEOUT`]: after a lost connection (a partition) there may be
    /// no answer at all, and myjob must still exit.
    pub async fn release(self, mut conn: Conn, name: &str) {
        let steps = async {
            match self {
                Held::Named { marker } => {
                    // The marker first: a lock released is one whose command has ended.
                    if let Some(token) = marker {
                        locks::release(&mut conn, name, token).await?;
                    }
                    conn.exec_drop("DO RELEASE_LOCK(?)", (name,)).await?;
                }
                Held::Lease { token, .. } => locks::release(&mut conn, name, token).await?,
            }
            anyhow::Ok(conn)
        };
        if let Ok(Ok(conn)) = timeout(CHECK_TIMEOUT, steps).await {
            let _ = timeout(CHECK_TIMEOUT, conn.disconnect()).await;
        }
    }
}

/// Whether the marker's table or column is missing (not migrated) or not granted.
fn is_missing(e: &anyhow::Error) -> bool {
    matches!(db::classify(e), db::Failure::Missing | db::Failure::Denied)
}

fn lost(why: &str) -> String {
    format!("the connection that held it was lost ({why})")
}
