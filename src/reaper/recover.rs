//! A pass of the reaper: the claims held, judged, and those of dead owners put back.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

use super::*;
use crate::db::Failure;
use crate::store::jobs::JobId;

/// Dates the claims `ids` (see `store::jobs::undated`) in one statement; when the server
/// refuses it for one of them (a trigger's SIGNAL, a CHECK of the user's), one at a time, the
/// refused ones said once and passed over. Returns how many it dated.
pub(super) async fn date_claims(
    conn: &mut Conn,
    ids: &[JobId],
    said: &mut HashSet<JobId>,
) -> anyhow::Result<u64> {
    match jobs::undated::date(conn, ids).await {
        Err(e) if matches!(db::classify(&e), Failure::Refused(_)) => {}
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
pub(super) fn row_refused<T>(
    job_id: JobId,
    span: Span,
    result: anyhow::Result<T>,
    said: &mut HashSet<JobId>,
) -> anyhow::Result<Option<T>> {
    match result {
        Ok(done) => Ok(Some(done)),
        Err(e) if matches!(db::classify(&e), Failure::Refused(_)) => {
            if !said.contains(&job_id) {
                if said.len() < MAX_REFUSED {
                    said.insert(job_id);
                }
                let _in_job = span.entered();
                error!(
                    job_id = job_id.get(),
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
pub(super) const LOCK: &str = "myjob_reaper";

pub(super) async fn reap(
    conn: &mut Conn,
    server: &ServerId,
    connected_for: Duration,
    // How long a claimer's connection may stay silent: its session's wait_timeout.
    claimer_wait: Duration,
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
    let undated: Vec<JobId> = claimed
        .undated
        .into_iter()
        .chain(cancelled.undated)
        .collect();
    date_undated(conn, &undated, memory).await?;
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
        member_silence: claimer_wait + settings.reaper.interval,
    };
    let max = settings.reaper.max_rescues;
    let foreign = put_back(conn, &old, &view, &last_pass, max, memory, metrics).await?;
    forget_cancels(conn, &cancels, &view, &last_pass, memory).await?;
    if foreign > 0 {
        info!(
            claims = foreign,
            "reaper: old claims made through another live server are left to that server's reapers"
        );
    }
    Ok(())
}

/// Dates the claims a producer wrote without a time, or with one far ahead: judged as any
/// claim once stale_after has passed (see `undated`).
async fn date_undated(
    conn: &mut Conn,
    undated: &[JobId],
    memory: &mut Memory,
) -> anyhow::Result<()> {
    let dated = date_claims(conn, undated, &mut memory.refused).await?;
    if dated > 0 {
        warn!(
            claims = dated,
            "reaper: claims without a time, or with one more than {} ahead of the server's clock, were dated now: they are judged as any claim once reaper.stale_after has passed",
            jobs::undated::AHEAD.to_lowercase()
        );
    }
    Ok(())
}

/// Puts back the claims of `old` that `view` finds dead, and that the pass before found so
/// too (`last_pass`); the others found dead are remembered for the next pass. Returns how
/// many belong to another live server, whose reapers judge them.
async fn put_back(
    conn: &mut Conn,
    old: &[OldClaim],
    view: &View<'_>,
    last_pass: &HashSet<Suspect>,
    max_rescues: u32,
    memory: &mut Memory,
    metrics: &Metrics,
) -> anyhow::Result<usize> {
    let mut foreign = 0;
    for claim in old {
        let reason = match judge(claim, view) {
            Verdict::Alive => continue,
            Verdict::Foreign => {
                foreign += 1;
                continue;
            }
            Verdict::Dead(reason) => reason,
        };
        let suspect = Suspect::of(claim);
        if !last_pass.contains(&suspect) {
            job_span(claim.id, &claim.queue, claim.attempts, claim.batch_id).in_scope(|| {
                debug!(
                    job_id = claim.id.get(),
                    "reaper: stale claim, put back at the next pass if still so: {reason}"
                )
            });
            memory.suspects.insert(suspect);
            continue;
        }
        let why = format!("attempt {} abandoned: {reason}", claim.attempts);
        let rescued = jobs::rescue(conn, claim, &why, max_rescues).await;
        if let Some(rescued) = row_refused(claim.id, span_of(claim), rescued, &mut memory.refused)?
        {
            log_rescue(claim, rescued, &reason, max_rescues, metrics);
        }
    }
    Ok(foreign)
}

/// Says that the handlers of jobs cancelled while they ran have stopped, when `view` finds
/// their worker dead two passes in a row, as for a claim.
async fn forget_cancels(
    conn: &mut Conn,
    cancels: &[OldClaim],
    view: &View<'_>,
    last_pass: &HashSet<Suspect>,
    memory: &mut Memory,
) -> anyhow::Result<()> {
    for claim in cancels {
        let Verdict::Dead(reason) = judge(claim, view) else {
            continue;
        };
        let suspect = Suspect::of(claim);
        if !last_pass.contains(&suspect) {
            memory.suspects.insert(suspect);
            continue;
        }
        let forgot = jobs::forget_cancel(conn, claim).await;
        if row_refused(claim.id, span_of(claim), forgot, &mut memory.refused)? == Some(true) {
            job_span(claim.id, &claim.queue, claim.attempts, claim.batch_id).in_scope(|| {
                info!(
                    job_id = claim.id.get(),
                    "reaper: a job cancelled while it ran lost its worker ({reason}): its handler is gone with it"
                )
            });
        }
    }
    Ok(())
}

/// The span of the lines about `claim`'s job: its fields, as its worker's lines had them.
pub(super) fn span_of(claim: &OldClaim) -> Span {
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
pub(super) async fn processlist(conn: &mut Conn) -> anyhow::Result<HashSet<u64>> {
    Ok(conn
        .query::<mysql_async::Row, _>("SHOW PROCESSLIST")
        .await
        .context("reading the processlist")?
        .into_iter()
        .filter_map(|row| row.get::<u64, _>(0))
        .collect())
}

/// One line per claim put back, or per job failed as a poison pill; and its count.
pub(super) fn log_rescue(
    claim: &OldClaim,
    rescued: Rescued,
    reason: &str,
    max: u32,
    metrics: &Metrics,
) {
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
            job_id = claim.id.get(),
            attempt = claim.attempts,
            "reaper: stale claim put back: {reason}"
        ),
        Rescued::Suspect { charged: false } => warn!(
            target: "myjob::msg::rescued",
            job_id = claim.id.get(),
            attempt = claim.attempts,
            "reaper: stale claim put back as a suspect, its second death: it runs next in a quarantine slot, one suspect per instance: {reason}"
        ),
        Rescued::Suspect { charged: true } => warn!(
            target: "myjob::msg::rescued",
            job_id = claim.id.get(),
            attempt = claim.attempts,
            rescues = claim.rescues.saturating_add(1),
            "reaper: suspect put back: its worker died while running it in quarantine ({} of {max}): {reason}",
            claim.rescues.saturating_add(1)
        ),
        Rescued::Failed => error!(
            target: "myjob::msg::poison_pill",
            job_id = claim.id.get(),
            attempt = claim.attempts,
            rescues = claim.rescues.saturating_add(1),
            "reaper: job failed: its worker died while running it in quarantine {} times (last: {reason})",
            claim.rescues.saturating_add(1)
        ),
        Rescued::Gone => {}
    }
}
