//! The reaper: puts back the claims of workers that died. It runs in every instance, but a
//! named lock lets only one act at a time, across all hosts on the same server.
//!
//! A claim is stale when it is older than `stale_after` and its owner's connection is no
//! longer in the processlist, or belongs to an earlier start of the server (connection ids
//! restart at 1). A live claimer's jobs are never touched, however long they run.
//!
//! A stale claim is put back only when two passes in a row (one `interval` apart) find it
//! so, and claims of an earlier start of the server only once the reaper has been connected
//! to the new one for `stale_after`: an instance that merely lost its connection, or waited
//! out a restart of the server, gets that long to reconnect and re-own its claims, rather
//! than see its running jobs handed to another worker and run twice.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::Settings;
use crate::db::{self, ServerId};
use crate::jobs::{self, OldClaim};

/// The most stale claims handled in one pass; the rest wait for the next.
const MAX_PER_PASS: usize = 1000;

pub struct Reaper {
    opts: Opts,
    settings: watch::Receiver<Arc<Settings>>,
    /// The connection, the server it reaches, and since when.
    conn: Option<(Conn, ServerId, Instant)>,
    /// The missing-PROCESS error is logged once, not every interval.
    refused: bool,
    /// Claims found stale by the last pass: (job id, batch_id, owner_conn).
    suspects: HashSet<Suspect>,
}

type Suspect = (u64, Option<u64>, Option<u64>);

/// What the reaper makes of one old claim.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Alive,
    /// Claimed through another server: its processlist is not ours to read.
    Foreign,
    /// The owner is gone; the text says why.
    Dead(String),
}

impl Reaper {
    pub fn new(opts: Opts, settings: watch::Receiver<Arc<Settings>>) -> Self {
        Reaper {
            opts,
            settings,
            conn: None,
            refused: false,
            suspects: HashSet::new(),
        }
    }

    /// Reaps every `interval` until `shutdown` fires. Errors are logged and the next pass
    /// starts on a fresh connection.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let interval = self.settings.borrow().reaper.interval;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(interval) => {}
            }
            if let Err(e) = self.pass().await {
                warn!("reaper: {e:#}");
                self.conn = None;
            }
        }
        if let Some((conn, ..)) = self.conn.take() {
            let _ = conn.disconnect().await;
        }
    }

    async fn pass(&mut self) -> anyhow::Result<()> {
        if self.conn.is_none() {
            let mut conn = db::connect(&self.opts)
                .await
                .context("cannot connect to the database")?;
            let server = ServerId::of(&mut conn).await?;
            self.conn = Some((conn, server, Instant::now()));
        }
        let settings = self.settings.borrow().clone();
        let Some((conn, server, since)) = self.conn.as_mut() else {
            return Ok(());
        };
        // The lock is named after the database, so that separate myjob databases on one
        // server each get a reaper.
        let locked: Option<i64> = conn
            .query_first("SELECT GET_LOCK(LEFT(CONCAT('myjob_reaper.', DATABASE()), 64), 0)")
            .await
            .context("taking the reaper lock")?;
        if locked != Some(1) {
            debug!("reaper: another instance holds the reaper lock");
            return Ok(());
        }
        // A server restart always breaks this connection, so a recent connection is how the
        // reaper knows the owners of claims from before a restart may still be reconnecting.
        let just_connected = since.elapsed() < settings.reaper.stale_after;
        let result = reap(
            conn,
            server,
            just_connected,
            &settings,
            &mut self.refused,
            &mut self.suspects,
        )
        .await;
        conn.query_drop("DO RELEASE_LOCK(LEFT(CONCAT('myjob_reaper.', DATABASE()), 64))")
            .await
            .context("releasing the reaper lock")?;
        result
    }
}

async fn reap(
    conn: &mut Conn,
    server: &ServerId,
    just_connected: bool,
    settings: &Settings,
    refused: &mut bool,
    suspects: &mut HashSet<Suspect>,
) -> anyhow::Result<()> {
    // Without PROCESS, the processlist shows only this account's own connections, and every
    // other worker would look dead: refuse rather than reset live claims.
    if !has_process_privilege(conn).await? {
        if !*refused {
            error!("reaper: the database account lacks the PROCESS privilege, so it cannot see other workers' connections; refusing to reap (GRANT PROCESS ON *.* TO the account)");
            *refused = true;
        }
        return Ok(());
    }
    *refused = false;

    // Old claims first, then the live connections: an owner seen alive in the claim and gone
    // from the later list is dead; one that reconnected and adopted its claims in between has
    // a new owner_conn, and the reset below, fenced by the old one, leaves it alone.
    let old = jobs::old_claims(conn, settings.reaper.stale_after, MAX_PER_PASS).await?;
    let last_pass = std::mem::take(suspects);
    if old.is_empty() {
        return Ok(());
    }
    let live: HashSet<u64> = conn
        .query::<u64, _>("SELECT ID FROM information_schema.PROCESSLIST")
        .await
        .context("reading the processlist")?
        .into_iter()
        .collect();
    let mut foreign = 0;
    for claim in &old {
        let reason = match judge(claim, server, &live, just_connected) {
            Verdict::Alive => continue,
            Verdict::Foreign => {
                foreign += 1;
                continue;
            }
            Verdict::Dead(reason) => reason,
        };
        let suspect = (claim.id, claim.batch_id, claim.owner_conn);
        if !last_pass.contains(&suspect) {
            debug!(
                job_id = claim.id,
                "reaper: stale claim, put back at the next pass if still so: {reason}"
            );
            suspects.insert(suspect);
            continue;
        }
        let error = format!("attempt {} abandoned: {reason}", claim.attempts);
        if jobs::reset_claim(conn, claim, &error).await? {
            warn!(
                job_id = claim.id,
                attempt = claim.attempts,
                "reaper: stale claim put back: {reason}"
            );
        }
    }
    if foreign > 0 {
        info!(
            claims = foreign,
            "reaper: old claims made through another server are left to that server's reaper"
        );
    }
    Ok(())
}

/// `just_connected`: the reaper has been connected for less than `stale_after`, so the owners
/// of claims made before a restart of the server may still be reconnecting.
fn judge(claim: &OldClaim, me: &ServerId, live: &HashSet<u64>, just_connected: bool) -> Verdict {
    let Some(owner) = claim.owner_server.as_deref().and_then(ServerId::parse) else {
        return Verdict::Dead("its claim names no owner".into());
    };
    if owner.host_port != me.host_port {
        return Verdict::Foreign;
    }
    if !owner.same_life(me) {
        if just_connected {
            return Verdict::Alive;
        }
        return Verdict::Dead(format!(
            "the server has restarted since ({owner} then, {me} now)"
        ));
    }
    match claim.owner_conn {
        Some(id) if live.contains(&id) => Verdict::Alive,
        Some(id) => Verdict::Dead(format!("its claimer's connection {id} is gone")),
        None => Verdict::Dead("its claim names no connection".into()),
    }
}

/// Whether the current account holds PROCESS globally.
async fn has_process_privilege(conn: &mut Conn) -> anyhow::Result<bool> {
    let user: Option<String> = conn.query_first("SELECT CURRENT_USER()").await?;
    let user = user.unwrap_or_default();
    let (name, host) = user.rsplit_once('@').unwrap_or((&user, "%"));
    let grantee = format!(
        "'{}'@'{}'",
        name.replace('\'', "''"),
        host.replace('\'', "''")
    );
    let n: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES \
             WHERE PRIVILEGE_TYPE = 'PROCESS' AND GRANTEE = ?",
            (grantee,),
        )
        .await
        .context("checking the PROCESS privilege")?;
    Ok(n.unwrap_or(0) > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(owner_server: Option<&str>, owner_conn: Option<u64>) -> OldClaim {
        OldClaim {
            id: 1,
            batch_id: Some(9),
            owner_conn,
            owner_server: owner_server.map(str::to_owned),
            attempts: 1,
        }
    }

    #[test]
    fn judges_owners_by_server_life_and_processlist() {
        let me = ServerId {
            host_port: "db:3306".into(),
            started: 1000,
        };
        let live: HashSet<u64> = [5].into();
        assert_eq!(
            judge(&claim(Some("db:3306/1000"), Some(5)), &me, &live, false),
            Verdict::Alive
        );
        assert!(matches!(
            judge(&claim(Some("db:3306/1001"), Some(6)), &me, &live, false),
            Verdict::Dead(_)
        ));
        // Before the server has been up for stale_after, its previous life's owners may still
        // be reconnecting.
        assert_eq!(
            judge(&claim(Some("db:3306/400"), Some(5)), &me, &live, true),
            Verdict::Alive
        );
        // An id that is live now but was issued by the server's previous life.
        assert!(matches!(
            judge(&claim(Some("db:3306/400"), Some(5)), &me, &live, false),
            Verdict::Dead(_)
        ));
        assert_eq!(
            judge(&claim(Some("other:3306/1000"), Some(6)), &me, &live, false),
            Verdict::Foreign
        );
        assert!(matches!(
            judge(&claim(None, None), &me, &live, false),
            Verdict::Dead(_)
        ));
    }
}
