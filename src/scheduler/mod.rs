//! The scheduler: enqueues the jobs of the config's `[[schedule]]`s, each tick once across
//! every instance and host (see `store::schedules`). Every instance runs it, on a connection
//! of its own made only when the config has schedules; whichever instance reaches a tick's
//! row first enqueues it, so a tick is enqueued as long as one instance serving the config is
//! up. It wakes at the next tick of any schedule, by the database's clock (a host whose clock
//! runs ahead does not enqueue early), and at the latest once a minute, or at a reload.
//!
//! Which ticks are due: a tick that came while this instance was running (since its previous
//! pass over the schedule, however late this pass is, by a slow statement, a race lost or a
//! blip of the network) is enqueued whatever the catch-up, late rather than never. A tick
//! that came before this instance's first pass (every instance down across it) is a missed
//! tick, found from the schedule's latest tick row, and enqueued as its `catch_up` says. A
//! schedule with no row yet, or whose latest row another definition made (its `cron` or
//! `every` changed), starts with its current tick (one that came less than a period ago),
//! or else with the next.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::ScheduleSettings;
use crate::config::{DatabaseSettings, Settings};
use crate::db::{self, Failure, Session};
use crate::error::chain;
use crate::store::schedules::{self, Tick, TickJob};

mod due;
mod ticks;

use due::{at, delta, Stale};

/// The longest the scheduler sleeps: a schedule whose next tick is far away is looked at
/// again within this, and a clock stepped since is noticed.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// A pass that comes longer than this after the end of this instance's previous pass (the
/// database was away that long, the process or its host was stopped), by this host's clock
/// or the database's, is as a first pass: the ticks between were missed, and the catch-up
/// says which to enqueue.
const MAX_GAP: Duration = Duration::from_secs(120);
/// Ticks older than this, and enqueued longer ago than this, are deleted (a schedule's
/// latest is always kept).
const KEEP_TICKS: Duration = Duration::from_secs(24 * 3600);
/// Over the lock wait, how long a statement of the scheduler's may take before its
/// connection is given up: a host cut off gets no answer at all.
const STATEMENT_SLACK: Duration = Duration::from_secs(10);
/// How often an instance deletes old ticks: every instance deletes the same rows, and on a
/// Galera cluster those deletions conflict.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// The next pass after a race lost on a tick's row.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub struct Scheduler {
    settings: watch::Receiver<Arc<Settings>>,
    /// Made only when the config has schedules.
    session: Session<()>,
    /// When this instance last deleted old ticks.
    pruned: Option<Instant>,
    /// What this instance knows of each schedule beyond its rows.
    memory: HashMap<String, Known>,
    /// The previous pass that read the database's clock.
    previous: Option<PassClock>,
}

/// A pass that read the database's clock: that time, and when the pass started and ended by
/// this host's monotonic clock. The next pass tells by both clocks whether this instance ran
/// all along between them (see [`MAX_GAP`]).
#[derive(Debug, Clone, Copy)]
struct PassClock {
    db_time: DateTime<Utc>,
    started: Instant,
    ended: Instant,
}

impl PassClock {
    /// Whether this instance ran all along from this pass to one that read `now`, by both
    /// clocks (the monotonic one stops while the host is suspended): else the ticks since
    /// are missed ones.
    fn continued_by(&self, now: DateTime<Utc>) -> bool {
        self.ended.elapsed() <= MAX_GAP
            && now - self.db_time - delta(self.ended - self.started) <= delta(MAX_GAP)
    }
}

/// One schedule as this instance last passed over it.
struct Known {
    /// The schedule's definition then: a changed one starts afresh.
    definition: String,
    /// The database's time at that pass: the ticks since came while this instance ran.
    /// None after a gap (see [`MAX_GAP`]).
    checked: Option<DateTime<Utc>>,
    /// Whether the schedule's statements fail and that was said: said once, until a tick
    /// of it goes in again.
    failing: bool,
    /// Ticks found due and not enqueued yet (a race lost, the connection lost), oldest
    /// first: the next pass enqueues them, whatever the catch-up.
    owed: Vec<DateTime<Utc>>,
}

impl Scheduler {
    pub fn new(db: DatabaseSettings, settings: watch::Receiver<Arc<Settings>>) -> Self {
        Scheduler {
            settings,
            session: Session::new("scheduler", db),
            pruned: None,
            memory: HashMap::new(),
            previous: None,
        }
    }

    /// Enqueues ticks until `shutdown` fires. An error is logged, the connection dropped,
    /// and the next pass comes after a growing pause.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut wait = Duration::ZERO;
        // The settings are new at the start and after a reload.
        let mut changed = true;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
                _ = self.settings.changed() => changed = true,
            }
            let settings = self.settings.borrow_and_update().clone();
            if std::mem::take(&mut changed) {
                warn_unserved(&settings);
            }
            if settings.schedules.is_empty() {
                // Nothing to do until a reload brings a schedule.
                self.session.close().await;
                self.memory.clear();
                wait = MAX_SLEEP;
                continue;
            }
            let begun = Instant::now();
            let pass = tokio::select! {
                // Statements are bounded, but a pass of many ticks is not: a stop does not
                // wait for it. The connection goes, and the server rolls back what was open.
                _ = shutdown.cancelled() => {
                    self.session.drop_link();
                    break;
                }
                pass = self.pass(&settings) => pass,
            };
            // A pass that read the clock and then failed still ran until now.
            if let Some(p) = self.previous.as_mut().filter(|p| p.started >= begun) {
                p.ended = Instant::now().max(p.started);
            }
            wait = match pass {
                Ok(next) => {
                    self.session.succeeded();
                    self.session.wrote();
                    next.clamp(Duration::from_millis(1), MAX_SLEEP)
                }
                // A statement cut off by its bound leaves the connection in doubt.
                Err(e) => {
                    self.session.gave_up(&e);
                    self.session.backoff()
                }
            };
        }
        self.session.close().await;
    }

    /// Enqueues what is due of every schedule; returns how long until the next tick. A
    /// schedule whose statement the server refuses is said once and passed over, not the
    /// others (its due ticks dropped when refused for good, else kept); a race lost brings
    /// the next pass in a second; a connection in doubt, or a read-only server, ends the
    /// pass, the ticks kept.
    async fn pass(&mut self, settings: &Settings) -> anyhow::Result<Duration> {
        let lock_wait = Duration::from_secs(self.session.db().lock_wait_timeout);
        let limit = lock_wait + STATEMENT_SLACK;
        // A tick's transaction left open by a host cut off mid-way holds the tick's row lock
        // until the server drops its connection: after this, not the default 8 hours. A pass
        // comes at least every MAX_SLEEP, so this never closes a live one.
        let idle = 2 * MAX_SLEEP + lock_wait;
        let (conn, ()) = self.session.open(idle, async |_| Ok(())).await?;
        let started = Instant::now();
        let now = at(db::within(limit, schedules::now_us(conn)).await?);
        let continuous = self.previous.is_some_and(|p| p.continued_by(now));
        self.previous = Some(PassClock {
            db_time: now,
            started,
            ended: started,
        });
        if !continuous {
            for m in self.memory.values_mut() {
                m.checked = None;
            }
        }
        let names: Vec<&str> = settings.schedules.iter().map(|s| s.name.as_str()).collect();
        let last = db::within(limit, schedules::last_ticks(conn, &names)).await?;
        self.memory.retain(|name, _| names.contains(&name.as_str()));
        let mut next = MAX_SLEEP;
        for s in &settings.schedules {
            let known = self.memory.remove(&s.name);
            let (mut memory, stale) = due::owed(s, known, &last, now, started);
            let result = enqueue_due(conn, s, &mut memory, &stale, limit).await;
            let failed = match result {
                Ok(true) => None,
                Ok(false) => {
                    next = next.min(RETRY_AFTER);
                    None
                }
                // Refused for good (a constraint, a value, a trigger's SIGNAL 45000): its
                // ticks are passed over.
                Err(e) if matches!(db::classify(&e), Failure::Refused(_)) => {
                    memory.owed.clear();
                    Some(e)
                }
                // A read-only server (a demoted primary): another connection may reach the
                // new one, and the ticks stay owed.
                Err(e) if db::is_read_only(&e) => {
                    self.memory.insert(s.name.clone(), memory);
                    return Err(e);
                }
                // An error of no known class, from a server that answered and still answers:
                // this schedule's, not the others'. Its ticks stay owed.
                Err(e) if db::classify(&e) != Failure::Lost && ping(conn, limit).await => Some(e),
                Err(e) => {
                    self.memory.insert(s.name.clone(), memory);
                    return Err(e);
                }
            };
            if let Some(e) = failed {
                if !std::mem::replace(&mut memory.failing, true) {
                    warn!(schedule = %s.name, "scheduler: schedule {}: {}; its due ticks wait", s.name, chain(&*e));
                }
            }
            self.memory.insert(s.name.clone(), memory);
            if let Some(t) = s.when.next_after(now) {
                next = next.min((t - now).to_std().unwrap_or_default());
            }
        }
        if self.pruned.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            self.pruned = Some(Instant::now());
            prune(conn, now, limit).await?;
        }
        Ok(next)
    }
}

/// Says which schedules put their jobs into a queue this instance does not serve: another
/// instance may serve it; if none does, the jobs wait.
fn warn_unserved(settings: &Settings) {
    for s in &settings.schedules {
        if !settings.queues.iter().any(|q| q.name == s.queue) {
            warn!(
                schedule = %s.name,
                queue = %s.queue,
                "scheduler: schedule {} enqueues into queue {}, which this instance does not serve",
                s.name,
                s.queue
            );
        }
    }
}

/// Deletes the ticks older than [`KEEP_TICKS`], and enqueued longer ago, of every schedule
/// that has any, in the config or not, but for each one's latest. Every instance prunes the
/// same rows: a race lost is left to the next time.
async fn prune(conn: &mut Conn, now: DateTime<Utc>, limit: Duration) -> anyhow::Result<()> {
    let cutoff = (now - delta(KEEP_TICKS)).timestamp_micros();
    for (schedule, latest) in db::within(limit, schedules::heads(conn)).await? {
        let pruned = schedules::prune(conn, &schedule, cutoff.min(latest), cutoff);
        let pruned = db::within(limit, pruned).await;
        if let Err(e) = pruned {
            if !db::classify(&e).keeps_connection() {
                return Err(e);
            }
            debug!("scheduler: {}", chain(&*e));
        }
    }
    Ok(())
}

/// Enqueues the ticks `memory` owes, oldest first, taking each off once enqueued (or found
/// enqueued by another instance); returns false when a race was lost and the rest waits
/// for the next pass (the tick's row is not there: it is tried again then).
async fn enqueue_due(
    conn: &mut Conn,
    s: &ScheduleSettings,
    memory: &mut Known,
    stale: &Stale,
    limit: Duration,
) -> anyhow::Result<bool> {
    while let Some(&tick) = memory.owed.first() {
        // Judged again as each goes in: a pass may take a while.
        if stale.is(tick) {
            stale.say(&s.name, 1, tick);
            memory.owed.remove(0);
            continue;
        }
        let job = TickJob {
            schedule: &s.name,
            definition: &memory.definition,
            tick_us: tick.timestamp_micros(),
            queue: &s.queue,
            payload: &s.payload,
            priority: s.priority,
        };
        match db::within(limit, schedules::enqueue_tick(conn, &job)).await? {
            Tick::Enqueued(job_id) => info!(
                job_id = job_id.get(),
                schedule = %s.name,
                tick = %tick.to_rfc3339(),
                "schedule: tick enqueued"
            ),
            Tick::Taken => {}
            Tick::Retry => return Ok(false),
        }
        // A tick went in: a failure said before is over.
        memory.failing = false;
        memory.owed.remove(0);
    }
    Ok(true)
}

/// Whether the server still answers on `conn`.
async fn ping(conn: &mut Conn, limit: Duration) -> bool {
    tokio::time::timeout(limit, conn.ping())
        .await
        .is_ok_and(|r| r.is_ok())
}
