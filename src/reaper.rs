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

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Span};

use crate::config::{DatabaseSettings, Settings};
use crate::db::{self, Failure, NamedLock, ServerId};
use crate::error::chain;
use crate::logging::job_span;
use crate::metrics::{Metrics, Op};
use crate::purge;
use crate::store::jobs::keys;
use crate::store::jobs::{self, Held, OldClaim, Rescued};
use crate::store::servers;
use crate::worker::name::WorkerName;
use crate::worker::session_wait_timeout;

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
    db: DatabaseSettings,
    /// Passes timed, rescues counted.
    metrics: Arc<Metrics>,
    settings: watch::Receiver<Arc<Settings>>,
    /// The connection, the server it reaches, and since when the reaper has reached that
    /// server's life (see [`Reaper::connect`]).
    conn: Option<(Conn, ServerId, Instant)>,
    /// The server life the last connection reached, since when, and when a pass last
    /// succeeded on it: a reconnect to the same life soon after keeps the time.
    reached: Option<(ServerId, Instant, Instant)>,
    /// The server refused the heartbeat as read-only: said once.
    read_only: db::ReadOnly,
    /// What one pass leaves the next.
    memory: Memory,
    /// This instance, whose previous run's claims the first passes put back.
    me: WorkerName,
}

type Suspect = (u64, Option<u64>, Option<u64>);

/// What the reaper makes of one old claim.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Alive,
    /// Claimed through another server that is alive: its processlist is not ours to read.
    Foreign,
    /// The owner is gone; the text says why.
    Dead(String),
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
            db,
            settings,
            conn: None,
            reached: None,
            read_only: db::ReadOnly::default(),
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
            // The pass's first statement is a write (the heartbeat): said once.
            if self.read_only.failed("reaper", &e) {
                self.conn = None;
                continue;
            }
            let kept = match (db::classify(&e), self.conn.as_mut()) {
                (Failure::Connection, _) | (_, None) => false,
                (_, Some((conn, ..))) => conn.query_drop("ROLLBACK").await.is_ok(),
            };
            if kept {
                warn!("reaper: {}; trying again at the next pass", chain(&*e));
            } else {
                warn!("reaper: {}; reconnecting at the next pass", chain(&*e));
                self.conn = None;
            }
        }
        if let Some((conn, ..)) = self.conn.take() {
            let _ = conn.disconnect().await;
        }
    }

    /// Connects if there is no connection. The session's `wait_timeout` outlasts a few
    /// intervals, so that a server whose own is shorter does not close it between passes.
    /// When something else does (a proxy's idle timeout) and the new connection reaches the
    /// same start of the same server within an interval or two, the time the reaper has
    /// reached it counts on: that server did not restart or fail over, so nothing its
    /// claimers must reconnect after happened (see `settled` in [`Reaper::pass`]).
    async fn connect(&mut self) -> anyhow::Result<()> {
        if let Some((conn, ..)) = self.conn.as_mut() {
            if conn.ping().await.is_ok() {
                return Ok(());
            }
            // Closed while it waited for the pass: a new one, without a failed pass.
            self.conn = None;
        }
        let (interval, stale_after) = {
            let settings = self.settings.borrow();
            (settings.reaper.interval, settings.reaper.stale_after)
        };
        let mut conn = db::connect(&self.db).await?;
        let server = ServerId::of(&mut conn).await?;
        let wait = (interval * 3).max(Duration::from_secs(60));
        db::set_wait_timeout(&mut conn, wait.min(MAX_WAIT_TIMEOUT))
            .await
            .context("setting the session's wait_timeout")?;
        let now = Instant::now();
        let since = match &self.reached {
            Some((life, since, ok))
                if life.same_life(&server) && ok.elapsed() <= interval * 2 + stale_after =>
            {
                *since
            }
            _ => now,
        };
        self.reached = Some((server.clone(), since, now));
        self.conn = Some((conn, server, since));
        Ok(())
    }

    /// A pass succeeded on the connection: see `reached`.
    fn pass_succeeded(&mut self) {
        self.read_only.wrote("reaper");
        if let Some((_, _, ok)) = self.reached.as_mut() {
            *ok = Instant::now();
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
                    self.conn = None;
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
        let Some((conn, server, _)) = self.conn.as_mut() else {
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
            let suspect = (claim.id, claim.batch_id, claim.owner_conn);
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
        let Some((conn, server, since)) = self.conn.as_mut() else {
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
            &self.db,
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
    /// Claims found stale by the last pass: (job id, batch_id, owner_conn).
    suspects: HashSet<Suspect>,
    /// The jobs whose write the server refused (see [`row_refused`]), said once each.
    refused: HashSet<u64>,
}

/// The most refused jobs remembered; past it, a new one is said again at every pass.
const MAX_REFUSED: usize = 10_000;

/// Dates the claims `ids` (see `store::jobs::undated`) in one statement; when the server
/// refuses it for one of them (a trigger's SIGNAL, a CHECK of the user's), one at a time, the
/// refused ones said once and passed over. Returns how many it dated.
async fn date_claims(conn: &mut Conn, ids: &[u64], said: &mut HashSet<u64>) -> anyhow::Result<u64> {
    match jobs::undated::date(conn, ids).await {
        Err(e) if db::classify(&e) == Failure::Refused => {}
        dated => return dated,
    }
    let mut dated = 0;
    for &id in ids {
        let one = jobs::undated::date(conn, &[id]).await;
        dated += row_refused(id, Span::none(), one, said)?.unwrap_or(0);
    }
    Ok(dated)
}

/// The result of a write about one claim, with a refusal of the server about that row alone
/// (a value out of range, a constraint, a trigger's SIGNAL) said once for the job and passed
/// over as `None`: a row is anyone's to write, and one the server will not take must not stop
/// the pass for every claim behind it. Any other error ends the pass.
fn row_refused<T>(
    job_id: u64,
    span: Span,
    result: anyhow::Result<T>,
    said: &mut HashSet<u64>,
) -> anyhow::Result<Option<T>> {
    match result {
        Ok(done) => Ok(Some(done)),
        Err(e) if db::classify(&e) == Failure::Refused => {
            if !said.contains(&job_id) {
                if said.len() < MAX_REFUSED {
                    said.insert(job_id);
                }
                let _in_job = span.entered();
                error!(
                    job_id,
                    "reaper: job {job_id}: the server refused a write about its claim ({}); it stays as it is, and the pass goes on",
                    chain(&*e)
                );
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The reaper lock: one reaper acts at a time across all instances on the server.
const LOCK: &str = "myjob_reaper";

async fn reap(
    conn: &mut Conn,
    server: &ServerId,
    connected_for: Duration,
    db: &DatabaseSettings,
    settings: &Settings,
    memory: &mut Memory,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    // Without PROCESS, the processlist shows only this account's own connections, and every
    // other worker would look dead: refuse rather than reset live claims.
    if !has_process_privilege(conn).await? {
        if !memory.no_process {
            error!("reaper: the database account lacks the PROCESS privilege, so it cannot see other workers' connections; refusing to reap (GRANT PROCESS ON *.* TO the account, or to a role that is its default role)");
            memory.no_process = true;
        }
        return Ok(());
    }
    memory.no_process = false;

    // Old claims first, then the live connections: an owner seen alive in the claim and gone
    // from the later list is dead; one that reconnected and adopted its claims in between has
    // a new owner_conn, and the reset below, fenced by the old one, leaves it alone.
    let stale_after = settings.reaper.stale_after;
    servers::prune(conn, FORGET_SERVERS_AFTER.max(stale_after * 2)).await?;
    // Every claim, a page at a time: however many long jobs run, a dead claim behind them is
    // judged. Jobs cancelled while they ran, whose worker has not said the handler stopped,
    // likewise.
    let claimed = all_held(conn, Held::Claimed, stale_after).await?;
    let cancelled = all_held(conn, Held::Cancelled, stale_after).await?;
    let (old, cancels) = (claimed.old, cancelled.old);
    // Claims a producer wrote without a time, or with one far ahead: dated now, judged as
    // any claim once stale_after has passed (see `undated`).
    let undated: Vec<u64> = claimed
        .undated
        .into_iter()
        .chain(cancelled.undated)
        .collect();
    let dated = date_claims(conn, &undated, &mut memory.refused).await?;
    if dated > 0 {
        warn!(
            claims = dated,
            "reaper: claims without a time, or with one more than {} ahead of the server's clock, were dated now: they are judged as any claim once reaper.stale_after has passed",
            jobs::undated::AHEAD.to_lowercase()
        );
    }
    let last_pass = std::mem::take(&mut memory.suspects);
    if old.is_empty() && cancels.is_empty() {
        return Ok(());
    }
    let live = processlist(conn).await?;
    let members = match server.galera {
        Some(_) => servers::galera_members(conn).await,
        None => None,
    };
    let view = View {
        me: server,
        live,
        heartbeats: servers::heartbeats(conn).await?,
        members,
        // One pass of slack: a live server is stamped once per interval.
        stale: stale_after + settings.reaper.interval,
        settled: connected_for >= stale_after,
        connected_for,
        member_silence: session_wait_timeout(db, stale_after) + settings.reaper.interval,
    };
    let mut foreign = 0;
    for claim in &old {
        let reason = match judge(claim, &view) {
            Verdict::Alive => continue,
            Verdict::Foreign => {
                foreign += 1;
                continue;
            }
            Verdict::Dead(reason) => reason,
        };
        let suspect = (claim.id, claim.batch_id, claim.owner_conn);
        if !last_pass.contains(&suspect) {
            job_span(claim.id, &claim.queue, claim.attempts, claim.batch_id).in_scope(|| {
                debug!(
                    job_id = claim.id,
                    "reaper: stale claim, put back at the next pass if still so: {reason}"
                )
            });
            memory.suspects.insert(suspect);
            continue;
        }
        let why = format!("attempt {} abandoned: {reason}", claim.attempts);
        let max = settings.reaper.max_rescues;
        let rescued = jobs::rescue(conn, claim, &why, max).await;
        if let Some(rescued) = row_refused(claim.id, span_of(claim), rescued, &mut memory.refused)?
        {
            log_rescue(claim, rescued, &reason, max, metrics);
        }
    }
    for claim in &cancels {
        let Verdict::Dead(reason) = judge(claim, &view) else {
            continue;
        };
        // Two passes in a row, as for a claim.
        let suspect = (claim.id, claim.batch_id, claim.owner_conn);
        if !last_pass.contains(&suspect) {
            memory.suspects.insert(suspect);
            continue;
        }
        let forgot = jobs::forget_cancel(conn, claim).await;
        if row_refused(claim.id, span_of(claim), forgot, &mut memory.refused)? == Some(true) {
            job_span(claim.id, &claim.queue, claim.attempts, claim.batch_id).in_scope(|| {
                info!(
                    job_id = claim.id,
                    "reaper: a job cancelled while it ran lost its worker ({reason}): its handler is gone with it"
                )
            });
        }
    }
    if foreign > 0 {
        info!(
            claims = foreign,
            "reaper: old claims made through another live server are left to that server's reapers"
        );
    }
    Ok(())
}

/// The span of the lines about `claim`'s job: its fields, as its worker's lines had them.
fn span_of(claim: &OldClaim) -> Span {
    job_span(claim.id, &claim.queue, claim.attempts, claim.batch_id)
}

/// Every claim of kind `of`, a page at a time: the old ones and the undated ones.
async fn all_held(
    conn: &mut Conn,
    of: Held,
    stale_after: Duration,
) -> anyhow::Result<jobs::HeldPage> {
    let mut all = jobs::HeldPage::default();
    let mut cursor = None;
    loop {
        let page = jobs::held(conn, of, stale_after, cursor.as_ref(), PAGE).await?;
        all.old.extend(page.old);
        all.undated.extend(page.undated);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(all),
        }
    }
}

/// The ids of the connections the server lists. SHOW PROCESSLIST rather than
/// information_schema.PROCESSLIST, which MySQL deprecates (8.0.35+); the statement stays on
/// both servers, and its first column is the id.
async fn processlist(conn: &mut Conn) -> anyhow::Result<HashSet<u64>> {
    Ok(conn
        .query::<mysql_async::Row, _>("SHOW PROCESSLIST")
        .await
        .context("reading the processlist")?
        .into_iter()
        .filter_map(|row| row.get::<u64, _>(0))
        .collect())
}

/// One line per claim put back, or per job failed as a poison pill; and its count.
fn log_rescue(claim: &OldClaim, rescued: Rescued, reason: &str, max: u32, metrics: &Metrics) {
    match rescued {
        Rescued::Gone => {}
        Rescued::Failed => metrics.rescued(true),
        _ => metrics.rescued(false),
    }
    // The job's span: the lines about it carry its fields, as its worker's did.
    let _in_job = job_span(claim.id, &claim.queue, claim.attempts, claim.batch_id).entered();
    match rescued {
        Rescued::Pending => warn!(
            target: "myjob::msg::rescued",
            job_id = claim.id,
            attempt = claim.attempts,
            "reaper: stale claim put back: {reason}"
        ),
        Rescued::Suspect { charged: false } => warn!(
            target: "myjob::msg::rescued",
            job_id = claim.id,
            attempt = claim.attempts,
            "reaper: stale claim put back as a suspect, its second death: it runs next in a quarantine slot, one suspect per instance: {reason}"
        ),
        Rescued::Suspect { charged: true } => warn!(
            target: "myjob::msg::rescued",
            job_id = claim.id,
            attempt = claim.attempts,
            rescues = claim.rescues.saturating_add(1),
            "reaper: suspect put back: its worker died while running it in quarantine ({} of {max}): {reason}",
            claim.rescues.saturating_add(1)
        ),
        Rescued::Failed => error!(
            target: "myjob::msg::poison_pill",
            job_id = claim.id,
            attempt = claim.attempts,
            rescues = claim.rescues.saturating_add(1),
            "reaper: job failed: its worker died while running it in quarantine {} times (last: {reason})",
            claim.rescues.saturating_add(1)
        ),
        Rescued::Gone => {}
    }
}

/// Deletes finished jobs past their retention, for at most half an interval; on a Galera node,
/// a batch of the slots' anchors not admitted into for a day as well (only admissions there
/// write them).
async fn retain(
    conn: &mut Conn,
    server: &ServerId,
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let ages = settings.retention.ages();
    let budget = settings.reaper.interval / 2;
    let purged = purge::purge(conn, &ages, None, Some(budget), shutdown)
        .await
        .context("retention")?;
    if purged.total() > 0 {
        info!(
            done = purged.done,
            failed = purged.failed,
            cancelled = purged.cancelled,
            complete = purged.complete,
            "reaper: deleted finished jobs past their retention"
        );
    }
    if keys::Referee::of(server) == keys::Referee::Certification {
        keys::purge_anchors(conn).await.context("retention")?;
    }
    Ok(())
}

/// What one pass knows to judge claims by.
struct View<'a> {
    /// The server this reaper is connected to.
    me: &'a ServerId,
    /// Its processlist.
    live: HashSet<u64>,
    /// Every server's last stamp, and its age.
    heartbeats: Vec<(ServerId, Duration)>,
    /// On a Galera node: the member ids of its cluster.
    members: Option<HashSet<String>>,
    /// A server without a stamp for this long is gone.
    stale: Duration,
    /// The reaper has been connected for `stale_after`: owners of claims made elsewhere have
    /// had that long to reconnect and re-own them.
    settled: bool,
    /// How long the reaper has reached this server's life.
    connected_for: Duration,
    /// A Galera member nobody stamps is gone only after this long: see [`judge`].
    member_silence: Duration,
}

fn judge(claim: &OldClaim, view: &View) -> Verdict {
    let me = view.me;
    let Some(owner) = claim.owner_server.as_deref().and_then(ServerId::parse) else {
        return Verdict::Dead("its claim names no owner".into());
    };
    if owner.same_life(me) {
        return match claim.owner_conn {
            Some(id) if view.live.contains(&id) => Verdict::Alive,
            Some(id) => Verdict::Dead(format!("its claimer's connection {id} is gone")),
            None => Verdict::Dead("its claim names no connection".into()),
        };
    }
    // Made through another server, or an earlier start of this one: alive while it stamps its
    // heartbeat. Every instance's reaper stamps the server it reaches, and its consumer the
    // one it claims through. A Galera node that has left gets the same grace as any server,
    // so that instances may reconnect when it comes back quickly. A member nobody stamps may
    // hold an instance that is only stalled (stopped, swapping), whose connection, listed
    // there and invisible from here, keeps its claims alive: it is gone once the member has
    // been silent for longer than a consumer's session wait_timeout, after which the member
    // itself has dropped every silent consumer's connection.
    let age = view
        .heartbeats
        .iter()
        .filter(|(s, _)| s.same_life(&owner))
        .map(|(_, age)| *age)
        .min();
    let member = match (&owner.galera, &view.members) {
        (Some(uuid), Some(members)) => members.contains(uuid),
        _ => false,
    };
    let alive = match (member, age) {
        (false, Some(age)) => age < view.stale,
        (false, None) => false,
        (true, Some(age)) => age < view.member_silence,
        (true, None) => view.connected_for < view.member_silence,
    };
    let left = match (&owner.galera, &view.members) {
        (Some(_), Some(_)) if !member => "its Galera node has left the cluster and ",
        _ => "",
    };
    let silence = if member {
        view.member_silence
    } else {
        view.stale
    };
    let gone = format!(
        "{left}its server {owner} has had no heartbeat for {} ({me} now)",
        humantime::format_duration(silence)
    );
    if alive {
        Verdict::Foreign
    } else if !view.settled {
        Verdict::Alive
    } else {
        Verdict::Dead(gone)
    }
}

/// Whether the current account holds PROCESS globally, directly or through an active role.
/// `SHOW GRANTS` for the session lists both on MySQL and MariaDB alike, where
/// information_schema.USER_PRIVILEGES shows only what was granted to the account itself.
async fn has_process_privilege(conn: &mut Conn) -> anyhow::Result<bool> {
    let grants: Vec<String> = conn
        .query("SHOW GRANTS")
        .await
        .context("checking the PROCESS privilege")?;
    Ok(grants_process(&grants))
}

/// Whether one of `SHOW GRANTS`' lines gives PROCESS on `*.*`.
fn grants_process(grants: &[String]) -> bool {
    grants.iter().any(|line| {
        let Some(rest) = line.strip_prefix("GRANT ") else {
            return false;
        };
        let Some((privileges, on)) = rest.split_once(" ON ") else {
            return false;
        };
        on.starts_with("*.* ")
            && privileges
                .split(',')
                .map(str::trim)
                .any(|p| p == "PROCESS" || p == "ALL PRIVILEGES" || p == "ALL")
    })
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
            rescues: 0,
            suspicion: 0,
            worker: None,
            queue: "q".into(),
        }
    }

    fn server(s: &str) -> ServerId {
        ServerId::parse(s).unwrap()
    }

    fn view<'a>(me: &'a ServerId, settled: bool) -> View<'a> {
        View {
            me,
            live: [5].into(),
            heartbeats: vec![
                (server("other:3306/1000"), Duration::from_secs(1)),
                (server("old:3306/1000"), Duration::from_secs(60)),
            ],
            members: None,
            stale: Duration::from_secs(6),
            settled,
            connected_for: Duration::from_secs(if settled { 600 } else { 1 }),
            member_silence: Duration::from_secs(120),
        }
    }

    #[test]
    fn judges_owners_by_server_life_and_processlist() {
        let me = server("db:3306/1000");
        let v = view(&me, true);
        let judge_it =
            |owner: Option<&str>, conn: Option<u64>, v: &View| judge(&claim(owner, conn), v);
        assert_eq!(judge_it(Some("db:3306/1000"), Some(5), &v), Verdict::Alive);
        assert!(matches!(
            judge_it(Some("db:3306/1001"), Some(6), &v),
            Verdict::Dead(_)
        ));
        // An id that is live now but was issued by the server's previous life.
        assert!(matches!(
            judge_it(Some("db:3306/400"), Some(5), &v),
            Verdict::Dead(_)
        ));
        // Before the reaper has been connected for stale_after, owners of claims made
        // elsewhere may still be reconnecting.
        let fresh = view(&me, false);
        assert_eq!(
            judge_it(Some("db:3306/400"), Some(5), &fresh),
            Verdict::Alive
        );
        assert_eq!(
            judge_it(Some("gone:3306/1000"), Some(5), &fresh),
            Verdict::Alive
        );
        // Another server: alive while it has a recent heartbeat, gone after.
        assert_eq!(
            judge_it(Some("other:3306/1000"), Some(6), &v),
            Verdict::Foreign
        );
        assert!(matches!(
            judge_it(Some("old:3306/1000"), Some(6), &v),
            Verdict::Dead(_)
        ));
        assert!(matches!(
            judge_it(Some("gone:3306/1000"), Some(6), &v),
            Verdict::Dead(_)
        ));
        assert!(matches!(judge_it(None, None, &v), Verdict::Dead(_)));
    }

    #[test]
    fn galera_nodes_are_judged_by_the_member_list() {
        let me = server("db:3311/1000/galera:aaa");
        let mut v = view(&me, true);
        v.members = Some(["aaa".to_owned(), "bbb".to_owned()].into());
        let c = |owner: &str| claim(Some(owner), Some(9));
        // A node that left is gone once its heartbeat is stale (6 s here).
        let Verdict::Dead(why) = judge(&c("db:3313/1000/galera:ccc"), &v) else {
            panic!("a node that left the cluster holds its claims")
        };
        assert!(why.contains("left the cluster"), "{why}");
        // A member nobody stamps may hold a stalled instance: alive until it has been silent
        // for longer than a consumer's session wait_timeout (120 s here), then gone.
        v.heartbeats
            .push((server("db:3312/1000/galera:bbb"), Duration::from_secs(60)));
        assert_eq!(judge(&c("db:3312/1000/galera:bbb"), &v), Verdict::Foreign);
        v.heartbeats[2].1 = Duration::from_secs(121);
        let Verdict::Dead(why) = judge(&c("db:3312/1000/galera:bbb"), &v) else {
            panic!("a member nobody stamps holds its claims")
        };
        assert!(
            !why.contains("left the cluster") && why.contains("2m"),
            "{why}"
        );
        // Never stamped: judged by how long this reaper has been there to see it.
        let never = c("db:3312/1000/galera:ddd");
        v.members = Some(["aaa".to_owned(), "ddd".to_owned()].into());
        assert!(matches!(judge(&never, &v), Verdict::Dead(_)));
        v.connected_for = Duration::from_secs(30);
        assert_eq!(judge(&never, &v), Verdict::Foreign);
        // Stamped lately, a node that left is alive too; without the member list (no SELECT
        // on it), the heartbeats decide as for any server.
        v.heartbeats
            .push((server("db:3313/1000/galera:ccc"), Duration::from_secs(2)));
        assert_eq!(judge(&c("db:3313/1000/galera:ccc"), &v), Verdict::Foreign);
        v.members = None;
        assert!(matches!(
            judge(&c("db:3312/1000/galera:bbb"), &v),
            Verdict::Dead(_)
        ));
    }

    #[test]
    fn process_comes_directly_or_through_a_role() {
        let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // MySQL expands an active role into the account's own line.
        assert!(grants_process(&lines(&[
            "GRANT PROCESS ON *.* TO `r1`@`%`"
        ])));
        // MariaDB lists the active role's grants on their own line.
        assert!(grants_process(&lines(&[
            "GRANT `myjob_reaper` TO `r1`@`127.0.0.1`",
            "GRANT USAGE ON *.* TO `r1`@`127.0.0.1` IDENTIFIED BY PASSWORD '*D82'",
            "GRANT PROCESS ON *.* TO `myjob_reaper`",
        ])));
        assert!(grants_process(&lines(&[
            "GRANT SELECT, PROCESS, RELOAD ON *.* TO `a`@`%`"
        ])));
        assert!(grants_process(&lines(&[
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"
        ])));
        assert!(!grants_process(&lines(&[
            "GRANT USAGE ON *.* TO `w`@`%`",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `app`.`myjob_jobs` TO `w`@`%`",
            "GRANT ALL PRIVILEGES ON `app`.* TO `w`@`%`",
            "GRANT PROXY ON ''@'%' TO `w`@`%`",
            "GRANT `myjob_reaper`@`%` TO `w`@`%`",
        ])));
    }
}
