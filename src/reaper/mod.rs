//! The reaper: puts back the claims of workers that died. It runs in every instance, but a
//! named lock lets only one act at a time, across all hosts on the same server.
//!
//! A claim is stale when it is older than `stale_after` and its owner's connection is no
//! longer in the processlist, or belongs to an earlier start of the server (connection ids
//! restart at 1). A live claimer's jobs are never touched, however long they run.
//!
//! A claim made through another server, or an earlier start of this one, cannot be judged by
//! this processlist. Every reaper stamps its server in `myjob_servers` at each pass, and every
//! consumer the server it claims through (a load balancer may send the two to different
//! Galera nodes); a claim whose server has had no heartbeat for `stale_after` (plus one
//! `interval`) belongs to connections that are all gone: a primary replaced after a failover,
//! a server restarted (ids start again at 1) or renamed, a Galera node that left the cluster
//! or that no instance uses any more.
//!
//! A stale claim is put back only when two passes in a row (one `interval` apart) find it
//! so, and claims of another server only once the reaper has been connected to this one for
//! `stale_after`: an instance that merely lost its connection, or waited out a restart or a
//! failover, gets that long to reconnect and re-own its claims, rather than see its running
//! jobs handed to another worker and run twice.
//!
//! A restart is the exception: when an instance starts, its reaper puts back at once the
//! claims of the previous run of the same instance on the same machine (see [`WorkerName`])
//! whose connection is gone. That run is over, so nothing will re-own them, and under
//! systemd a `kill -9`'d instance's jobs run again seconds later instead of after
//! `stale_after`. The guard killed that run's handlers as it died (see `worker::guard`).
//!
//! The reaper that holds the lock then deletes finished jobs past their `[retention]`, in the
//! gentle batches of `myjob purge`, for at most half an interval per pass: so one instance
//! purges at a time, and a large backlog of old rows is worked off over several passes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Span};

use crate::config::{DatabaseSettings, Settings};
use crate::db::{self, NamedLock, ServerId, Session};
use crate::error::chain;
use crate::logging::job_span;
use crate::metrics::{Metrics, Op};
use crate::store::jobs::keys;
use crate::store::jobs::{self, BatchId, Held, JobId, OldClaim, Rescued};
use crate::store::servers;
use crate::worker::name::WorkerName;
use crate::worker::session_wait_timeout;

mod judge;
mod privilege;
mod recover;
pub mod retention;

use judge::{judge, Verdict, View};
use privilege::has_process_privilege;
use recover::{log_rescue, processlist, reap, row_refused, span_of, LOCK};
use retention::retain;

/// The most old claims read in one statement: a pass reads every one, a page at a time.
const PAGE: usize = 1000;
/// The most claims of the instance's previous run read at its start.
const MAX_RECOVERED: usize = 1000;

/// At start, how long the reaper keeps looking for claims of the instance's previous run
/// whose connection the server still lists: a server notices a killed client's connection
/// within moments, so a connection listed for longer belongs to a live twin.
const RECOVER_FOR: Duration = Duration::from_secs(10);
/// At start, a claim of the previous run is put back once two looks this far apart find its
/// connection gone. A live twin (started by mistake with the same instance name on a host
/// that looks the same) whose connection dropped reconnects and re-owns its claims within
/// moments, and the put-back, fenced by the owner the first look saw, then changes nothing.
const RECOVER_CONFIRM: Duration = Duration::from_secs(2);

/// The largest `wait_timeout` a server accepts (a year, on Linux).
const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(31_536_000);

/// Servers not heard of for this long are forgotten (they count as gone before that).
const FORGET_SERVERS_AFTER: Duration = Duration::from_secs(24 * 3600);

pub struct Reaper {
    /// Passes timed, rescues counted.
    metrics: Arc<Metrics>,
    settings: watch::Receiver<Arc<Settings>>,
    /// The connection, and the server life it reaches.
    session: Session<Reach>,
    /// The server life the last connection reached: a reconnect to the same life soon after
    /// keeps its time.
    reached: Option<Reached>,
    /// What one pass leaves the next.
    memory: Memory,
    /// This instance, whose previous run's claims the first passes put back.
    me: WorkerName,
}

/// What the reaper's connection reaches: `server`, whose life the reaper has reached since
/// `since` (see [`Reaper::connect`]).
struct Reach {
    server: ServerId,
    since: Instant,
}

/// A server life the reaper reached.
struct Reached {
    life: ServerId,
    /// Since when, across reconnects to the same life.
    since: Instant,
    /// When a pass last succeeded on it.
    ok: Instant,
}

/// A claim found stale, as a pass remembers it for the next: the same job, batch and
/// connection two passes in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Suspect {
    job: JobId,
    batch: Option<BatchId>,
    conn: Option<u64>,
}

impl Suspect {
    fn of(claim: &OldClaim) -> Suspect {
        Suspect {
            job: claim.id,
            batch: claim.batch_id,
            conn: claim.owner_conn,
        }
    }
}

impl Reaper {
    pub fn new(
        db: DatabaseSettings,
        settings: watch::Receiver<Arc<Settings>>,
        me: WorkerName,
        metrics: Arc<Metrics>,
    ) -> Self {
        Reaper {
            metrics,
            settings,
            session: Session::new("reaper", db),
            reached: None,
            memory: Memory::default(),
            me,
        }
    }

    /// Reaps every `interval` until `shutdown` fires. Errors are logged; a lost race (a
    /// deadlock, a Galera certification conflict, a lock wait) or a refused statement is
    /// tried again at the next pass on the same connection, which keeps the time it has been
    /// connected (see `settled`); anything else starts the next pass on a fresh connection.
    pub async fn run(mut self, shutdown: CancellationToken) {
        self.recover(&shutdown).await;
        loop {
            let interval = self.settings.borrow().reaper.interval;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(interval) => {}
            }
            let t = Instant::now();
            let pass = self.pass(&shutdown).await;
            self.metrics
                .statement(Op::Reap, t.elapsed(), pass.as_ref().err());
            let Err(e) = pass else {
                self.pass_succeeded();
                continue;
            };
            // The pass's first statement is a write (the heartbeat): a read-only server is
            // said once.
            self.session.failed(&e, "the next pass").await;
        }
        self.session.close().await;
    }

    /// Connects if there is no connection. The session's `wait_timeout` outlasts a few
    /// intervals, so that a server whose own is shorter does not close it between passes.
    /// When something else does (a proxy's idle timeout) and the new connection reaches the
    /// same start of the same server within an interval or two, the time the reaper has
    /// reached it counts on: that server did not restart or fail over, so nothing its
    /// claimers must reconnect after happened (see `settled` in [`Reaper::pass`]).
    async fn connect(&mut self) -> anyhow::Result<()> {
        if let Some((conn, _)) = self.session.get() {
            if conn.ping().await.is_ok() {
                return Ok(());
            }
            // Closed while it waited for the pass: a new one, without a failed pass.
            self.session.drop_link();
        }
        let (interval, stale_after) = {
            let settings = self.settings.borrow();
            (settings.reaper.interval, settings.reaper.stale_after)
        };
        let idle = (interval * 3).max(Duration::from_secs(60));
        let reached = &mut self.reached;
        self.session
            .open(idle.min(MAX_WAIT_TIMEOUT), async |conn| {
                let server = ServerId::of(conn).await?;
                let now = Instant::now();
                let since = match reached {
                    Some(r)
                        if r.life.same_life(&server)
                            && r.ok.elapsed() <= interval * 2 + stale_after =>
                    {
                        r.since
                    }
                    _ => now,
                };
                *reached = Some(Reached {
                    life: server.clone(),
                    since,
                    ok: now,
                });
                Ok(Reach { server, since })
            })
            .await?;
        Ok(())
    }

    /// A pass succeeded on the connection: see `reached`.
    fn pass_succeeded(&mut self) {
        self.session.wrote();
        if let Some(r) = self.reached.as_mut() {
            r.ok = Instant::now();
        }
    }

    /// Puts back the claims of this instance's previous run whose connection is gone, once a
    /// second for [`RECOVER_FOR`] while some are still listed as alive.
    async fn recover(&mut self, shutdown: &CancellationToken) {
        let until = Instant::now() + RECOVER_FOR;
        // The claims a look found with their connection gone, and when it first did.
        let mut gone_since = HashMap::new();
        loop {
            let waiting = match self.recover_pass(&mut gone_since).await {
                Ok(waiting) => waiting,
                Err(e) => {
                    warn!(
                        "reaper: putting back the claims of this instance's previous run: {}",
                        chain(&*e)
                    );
                    self.session.drop_link();
                    true
                }
            };
            if !waiting || Instant::now() >= until {
                break;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// One look at the previous run's claims: those whose connection two looks
    /// [`RECOVER_CONFIRM`] apart found gone are put back. Returns whether some remain, alive
    /// or waiting for their second look. A claim made through another server is left to the
    /// passes after: its processlist is not ours to read.
    async fn recover_pass(
        &mut self,
        gone_since: &mut HashMap<Suspect, Instant>,
    ) -> anyhow::Result<bool> {
        self.connect().await?;
        let max = self.settings.borrow().reaper.max_rescues;
        let Some((conn, Reach { server, .. })) = self.session.get() else {
            return Ok(false);
        };
        // Without PROCESS every connection looks gone: the passes after say why they refuse.
        if !has_process_privilege(conn).await? {
            return Ok(false);
        }
        let me = &self.me;
        let claims: Vec<OldClaim> = jobs::claims_of(conn, &me.host, &me.instance, MAX_RECOVERED)
            .await?
            .into_iter()
            .filter(|c| {
                c.worker
                    .as_deref()
                    .and_then(WorkerName::parse)
                    .is_some_and(|w| w.came_before(me))
            })
            .collect();
        if claims.is_empty() {
            return Ok(false);
        }
        let live = processlist(conn).await?;
        let mut waiting = false;
        for claim in &claims {
            let Some(owner) = claim.owner_server.as_deref().and_then(ServerId::parse) else {
                continue;
            };
            let gone = if owner.same_life(server) {
                match claim.owner_conn {
                    Some(id) if live.contains(&id) => {
                        waiting = true;
                        continue;
                    }
                    Some(id) => format!("its instance restarted, and its connection {id} is gone"),
                    None => "its instance restarted".to_owned(),
                }
            } else if owner.host_port == server.host_port && owner.started < server.started {
                format!("its instance restarted, and its server {owner} restarted since")
            } else {
                continue;
            };
            let suspect = Suspect::of(claim);
            let since = *gone_since.entry(suspect).or_insert_with(Instant::now);
            if since.elapsed() < RECOVER_CONFIRM {
                waiting = true;
                continue;
            }
            let why = format!("attempt {} abandoned: {gone}", claim.attempts);
            let rescued = jobs::rescue(conn, claim, &why, max).await;
            if let Some(rescued) =
                row_refused(claim.id, span_of(claim), rescued, &mut self.memory.refused)?
            {
                log_rescue(claim, rescued, &gone, max, &self.metrics);
            }
        }
        Ok(waiting)
    }

    async fn pass(&mut self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        self.connect().await?;
        let settings = self.settings.borrow().clone();
        let claimer_wait = session_wait_timeout(self.session.db(), settings.reaper.stale_after);
        let Some((conn, Reach { server, since })) = self.session.get() else {
            return Ok(());
        };
        // Every reaper, lock or not: the claimers on this server are vouched for.
        servers::stamp(conn, server).await?;
        let lock = db::try_lock(conn, LOCK).await?;
        if lock == NamedLock::Busy {
            debug!("reaper: another instance holds the reaper lock");
            return Ok(());
        }
        // A server restart or a failover always breaks this connection, so a recent connection
        // is how the reaper knows the owners of claims made elsewhere may still be reconnecting.
        let connected_for = since.elapsed();
        let mut result = reap(
            conn,
            server,
            connected_for,
            claimer_wait,
            &settings,
            &mut self.memory,
            &self.metrics,
        )
        .await;
        if result.is_ok() {
            result = retain(conn, server, &settings, shutdown).await;
        }
        if lock == NamedLock::Held {
            db::release_lock(conn, LOCK).await?;
        }
        result
    }
}

/// What one reaper pass leaves the next.
#[derive(Default)]
struct Memory {
    /// The missing-PROCESS error is logged once, not every interval.
    no_process: bool,
    /// Claims found stale by the last pass.
    suspects: HashSet<Suspect>,
    /// The jobs whose write the server refused (see [`row_refused`]), said once each.
    refused: HashSet<JobId>,
}

/// The most refused jobs remembered; past it, a new one is said again at every pass.
const MAX_REFUSED: usize = 10_000;
