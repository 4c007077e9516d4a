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

use crate::config::{CatchUp, ScheduleSettings, MAX_CATCH_UP};
use crate::config::{DatabaseSettings, Settings};
use crate::db::{self, Failure};
use crate::error::chain;
use crate::store::schedules::{self, Tick, TickJob};

mod ticks;

/// A tick this recent is the schedule's current one, however it was missed: a first pass
/// that comes a little late (a slow start, a reconnect) still enqueues it, whatever the
/// catch-up.
const GRACE: Duration = Duration::from_secs(10);
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
/// An owed tick older than this, before the schedule's latest row, is given up (and said):
/// its row, had another instance enqueued it, may be deleted soon, and a tick enqueued twice
/// is worse than one lost (see [`Stale`]).
const KEEP_OWED: Duration = Duration::from_secs(23 * 3600);
/// Over the lock wait, how long a statement of the scheduler's may take before its
/// connection is given up: a host cut off gets no answer at all.
const STATEMENT_SLACK: Duration = Duration::from_secs(10);
/// How often an instance deletes old ticks: every instance deletes the same rows, and on a
/// Galera cluster those deletions conflict.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// The next pass after a race lost on a tick's row.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub struct Scheduler {
    db: DatabaseSettings,
    settings: watch::Receiver<Arc<Settings>>,
    conn: Option<Conn>,
    backoff: db::Backoff,
    /// When this instance last deleted old ticks.
    pruned: Option<Instant>,
    /// What this instance knows of each schedule beyond its rows.
    memory: HashMap<String, Known>,
    /// The previous pass that read the database's clock.
    previous: Option<PassClock>,
    read_only: db::ReadOnly,
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
            db,
            settings,
            conn: None,
            backoff: db::Backoff::default(),
            pruned: None,
            memory: HashMap::new(),
            previous: None,
            read_only: db::ReadOnly::default(),
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
                if let Some(conn) = self.conn.take() {
                    let _ = conn.disconnect().await;
                }
                self.memory.clear();
                wait = MAX_SLEEP;
                continue;
            }
            let begun = Instant::now();
            let pass = tokio::select! {
                // Statements are bounded, but a pass of many ticks is not: a stop does not
                // wait for it. The connection goes, and the server rolls back what was open.
                _ = shutdown.cancelled() => {
                    self.conn = None;
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
                    self.backoff.reset();
                    self.read_only.wrote("scheduler");
                    next.clamp(Duration::from_millis(1), MAX_SLEEP)
                }
                Err(e) => {
                    if !self.read_only.failed("scheduler", &e) {
                        warn!("scheduler: {}; trying again", chain(&*e));
                    }
                    self.conn = None;
                    self.backoff.count()
                }
            };
        }
        if let Some(conn) = self.conn.take() {
            let _ = conn.disconnect().await;
        }
    }

    /// Enqueues what is due of every schedule; returns how long until the next tick. A
    /// schedule whose statement the server refuses is said once and passed over, not the
    /// others (its due ticks dropped when refused for good, else kept); a race lost brings
    /// the next pass in a second; a connection in doubt, or a read-only server, ends the
    /// pass, the ticks kept.
    async fn pass(&mut self, settings: &Settings) -> anyhow::Result<Duration> {
        let limit = Duration::from_secs(self.db.lock_wait_timeout) + STATEMENT_SLACK;
        if self.conn.is_none() {
            let mut conn = db::connect(&self.db).await?;
            // A tick's transaction left open by a host cut off mid-way holds the tick's row
            // lock until the server drops its connection: after this, not the default 8
            // hours. A pass comes at least every MAX_SLEEP, so this never closes a live one.
            let wait = 2 * MAX_SLEEP + Duration::from_secs(self.db.lock_wait_timeout);
            db::set_wait_timeout(&mut conn, wait).await?;
            self.conn = Some(conn);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(MAX_SLEEP);
        };
        let started = Instant::now();
        let now = at(db::within(limit, schedules::now_us(conn)).await?);
        // Ran all along since the previous pass, by both clocks (the monotonic one stops
        // while the host is suspended)? Else the ticks since are missed ones.
        let gap = delta(MAX_GAP);
        let continuous = self.previous.is_some_and(|p| {
            p.ended.elapsed() <= MAX_GAP && now - p.db_time - delta(p.ended - p.started) <= gap
        });
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
            let definition = s.definition();
            let memory = self
                .memory
                .remove(&s.name)
                .filter(|m| m.definition == definition);
            // A latest tick ahead of the clock (a clock that stepped back) says nothing of
            // what was missed: the schedule goes on from its current tick. One that another
            // definition made says nothing of this one's ticks.
            let latest = last
                .iter()
                .find(|l| l.schedule == s.name && l.definition == definition)
                .map(|l| at(l.tick_us))
                .filter(|t| *t <= now);
            // However long ago (passes that ended before this schedule, on a read-only
            // server, say), a pass over it since which every pass was continuous: this
            // instance ran all along.
            let checked = memory
                .as_ref()
                .and_then(|m| m.checked)
                .filter(|c| *c <= now);
            let failing = memory.as_ref().is_some_and(|m| m.failing);
            let mut ticks = memory.map(|m| m.owed).unwrap_or_default();
            let (found, catch_up) = due(s, latest, checked, now);
            ticks.extend(found);
            ticks.sort_unstable();
            ticks.dedup();
            let stale = Stale {
                head: last
                    .iter()
                    .find(|l| l.schedule == s.name)
                    .map(|l| at(l.tick_us)),
                now,
                started,
            };
            let given_up = ticks.iter().take_while(|t| stale.is(**t)).count();
            if given_up > 0 {
                stale.say(&s.name, given_up, ticks[0]);
                ticks.drain(..given_up);
            }
            // As many as a catch-up enqueues at most: the latest.
            let over = ticks.len().saturating_sub(MAX_CATCH_UP + 1);
            if over > 0 {
                warn!(schedule = %s.name, "scheduler: schedule {}: {} owed ticks given up, the oldest {}; the latest {} are kept", s.name, over, ticks[0].to_rfc3339(), MAX_CATCH_UP + 1);
                ticks.drain(..over);
            }
            if let Some(c) = catch_up.filter(|c| c.missed > 0) {
                let enqueues = c.enqueued.iter().filter(|t| ticks.contains(t)).count();
                let more = if c.capped { " or more" } else { "" };
                info!(schedule = %s.name, missed = c.missed, enqueues, "scheduler: schedule {}: {}{} ticks missed while no instance ran; the catch-up enqueues {}", s.name, c.missed, more, enqueues);
            }
            let mut memory = Known {
                definition,
                checked: Some(now),
                failing,
                owed: ticks,
            };
            let result = enqueue_due(conn, s, &mut memory, &stale, limit).await;
            let failed = match result {
                Ok(true) => None,
                Ok(false) => {
                    next = next.min(RETRY_AFTER);
                    None
                }
                // Refused for good (a constraint, a value, a trigger's SIGNAL 45000): its
                // ticks are passed over.
                Err(e) if db::classify(&e) == Failure::Refused => {
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
                Err(e) if db::server_code(&e).is_some() && ping(conn, limit).await => Some(e),
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
            if db::classify(&e) == Failure::Connection {
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
                job_id,
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

/// Which of a schedule's ticks are too old to enqueue. A tick's row lives a day after its
/// tick and a day after it went in (see [`prune`]); a tick before the schedule's latest
/// row, read at the pass's start, may have had one, which may be gone once the tick is 24
/// hours old: such a tick is given up (and said) at 23 hours, rather than risk a second
/// job. A tick after that row had none then, and one written since lives a day: whatever
/// its age, it is enqueued.
struct Stale {
    /// The schedule's latest row, whatever its definition (prune keeps it alone).
    head: Option<DateTime<Utc>>,
    /// The database's time at the pass's start, and that start on this host's clock.
    now: DateTime<Utc>,
    started: Instant,
}

impl Stale {
    fn is(&self, tick: DateTime<Utc>) -> bool {
        let now = self.now + delta(self.started.elapsed());
        self.head.is_some_and(|h| tick < h) && now - tick >= delta(KEEP_OWED)
    }

    fn say(&self, schedule: &str, count: usize, oldest: DateTime<Utc>) {
        warn!(schedule = %schedule, "scheduler: schedule {}: {} ticks 23 hours old or more given up, the oldest {}", schedule, count, oldest.to_rfc3339());
    }
}

/// Whether the server still answers on `conn`.
async fn ping(conn: &mut Conn, limit: Duration) -> bool {
    tokio::time::timeout(limit, conn.ping())
        .await
        .is_ok_and(|r| r.is_ok())
}

fn at(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

fn delta(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The ticks of `s` to enqueue at `now`, oldest first, given its latest enqueued tick and
/// this instance's previous pass over it (`checked`, when recent). Every tick since that
/// pass came while this instance ran: all are due (those another instance enqueued meanwhile
/// are found taken). Else see [`CatchUpOf`], whose count of missed ticks comes second.
fn due(
    s: &ScheduleSettings,
    latest: Option<DateTime<Utc>>,
    checked: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> (Vec<DateTime<Utc>>, Option<CatchUpOf>) {
    match checked {
        // From the previous pass, not from a later tick another instance enqueued: that one
        // may have come back from a stop, and passed over the ticks it took for missed.
        Some(checked) => (s.when.ticks_between(checked, now, MAX_CATCH_UP + 1), None),
        None => {
            let c = CatchUpOf::new(s, latest, now);
            (c.due(), Some(c))
        }
    }
}

/// A schedule at a first pass (this instance's first, or the first after a gap): its
/// current tick, the latest one if it came less than a period ago (at most [`GRACE`]), is
/// due whatever the catch-up, as it is on time; the ticks between the latest enqueued and
/// it were missed, and the catch-up says which of them to enqueue. A schedule with no
/// latest tick (new, or changed) has its current tick alone.
struct CatchUpOf {
    /// How many ticks were missed: the latest `MAX_CATCH_UP + 1` ticks are counted, and
    /// `capped` says there may be more.
    missed: usize,
    capped: bool,
    /// Those of them the catch-up enqueues, oldest first.
    enqueued: Vec<DateTime<Utc>>,
    current: Option<DateTime<Utc>>,
}

impl CatchUpOf {
    fn new(s: &ScheduleSettings, latest: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Self {
        let grace = delta(GRACE);
        let on_time = |t: &DateTime<Utc>| {
            let period = s.when.next_after(*t).map_or(grace, |n| n - *t);
            now - *t < period.min(grace)
        };
        let mut missed = match latest {
            Some(latest) => s.when.ticks_between(latest, now, MAX_CATCH_UP + 1),
            None => s.when.ticks_between(now - grace, now, 1),
        };
        let capped = latest.is_some() && missed.len() > MAX_CATCH_UP;
        let current = match missed.last() {
            Some(t) if on_time(t) => missed.pop(),
            _ => None,
        };
        if latest.is_none() {
            missed.clear();
        }
        let count = missed.len();
        let enqueued = match s.catch_up {
            CatchUp::All => missed.split_off(count.saturating_sub(MAX_CATCH_UP)),
            CatchUp::Latest => missed.pop().into_iter().collect(),
            CatchUp::None => Vec::new(),
        };
        CatchUpOf {
            missed: count,
            capped,
            enqueued,
            current,
        }
    }

    fn due(&self) -> Vec<DateTime<Utc>> {
        let mut due = self.enqueued.clone();
        due.extend(self.current);
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(catch_up: &str) -> ScheduleSettings {
        let text = format!(
            "[database]\nurl = \"mysql://u@h/d\"\n[[schedule]]\nname = \"s\"\nqueue = \"q\"\nevery = \"1m\"\ncatch_up = \"{catch_up}\"\n"
        );
        let settings = crate::config::from_text(&text).unwrap();
        settings.schedules[0].as_ref().clone()
    }

    fn due_after_start(
        s: &ScheduleSettings,
        latest: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Vec<DateTime<Utc>> {
        due(s, latest, None, now).0
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn missed_ticks_follow_the_catch_up() {
        let t = |s: &str| utc(&format!("2026-01-01T00:{s}Z"));
        // Down from after 00:05 to 00:10:02: 00:06 to 00:09 missed, 00:10 on time.
        let (last, now) = (Some(t("05:00")), t("10:02"));
        assert_eq!(due_after_start(&schedule("none"), last, now), [t("10:00")]);
        assert_eq!(
            due_after_start(&schedule("latest"), last, now),
            [t("09:00"), t("10:00")]
        );
        assert_eq!(
            due_after_start(&schedule("all"), last, now),
            [t("06:00"), t("07:00"), t("08:00"), t("09:00"), t("10:00")]
        );
        // Back 30 s after a tick (more than the 10 s grace): that tick was missed too.
        let now = t("10:30");
        assert!(due_after_start(&schedule("none"), last, now).is_empty());
        assert_eq!(
            due_after_start(&schedule("latest"), last, now),
            [t("10:00")]
        );
        assert_eq!(due_after_start(&schedule("all"), last, now).len(), 5);
        // The usual pass, right after a tick: that tick, whatever the catch-up.
        let soon = utc("2026-01-01T00:10:00.002Z");
        for policy in ["none", "latest", "all"] {
            assert_eq!(
                due_after_start(&schedule(policy), Some(t("09:00")), soon),
                [t("10:00")]
            );
        }
        // How many were missed, whatever the catch-up enqueues.
        for policy in ["none", "latest", "all"] {
            let c = CatchUpOf::new(&schedule(policy), last, t("10:02"));
            assert_eq!(c.missed, 4, "{policy}");
        }
        // A new schedule: its current tick only.
        assert_eq!(
            due_after_start(&schedule("all"), None, t("10:05")),
            [t("10:00")]
        );
        assert!(due_after_start(&schedule("all"), None, now).is_empty());
    }

    #[test]
    fn ticks_since_this_instances_last_pass_are_due_whatever_the_catch_up() {
        let t = |s: &str| utc(&format!("2026-01-01T00:{s}Z"));
        // A pass at 05:00.5 enqueued 05:00; the next came late, at 08:30 (a statement that
        // waited, a blip): 06:00 to 08:00 came while this instance ran.
        let (last, checked, now) = (Some(t("05:00")), Some(t("05:00.5")), t("08:30"));
        for policy in ["none", "latest", "all"] {
            assert_eq!(
                due(&schedule(policy), last, checked, now).0,
                [t("06:00"), t("07:00"), t("08:00")]
            );
        }
        // Another instance, back from a stop, enqueued 08:00 alone (catch-up "none"): 06:00
        // and 07:00 came while this one ran, and are due still.
        assert_eq!(
            due(&schedule("none"), Some(t("08:00")), checked, now).0,
            [t("06:00"), t("07:00"), t("08:00")]
        );
        // No row of this definition: from the previous pass on.
        assert_eq!(due(&schedule("none"), None, checked, now).0.len(), 3);
    }

    #[test]
    fn only_ticks_before_the_latest_row_go_stale() {
        let now = utc("2026-01-03T00:00:00Z");
        let day_old = utc("2026-01-02T00:00:00Z");
        let stale = |head: Option<&str>| Stale {
            head: head.map(utc),
            now,
            started: Instant::now(),
        };
        // Before the latest row, a day old: its row may be gone.
        assert!(stale(Some("2026-01-02T12:00:00Z")).is(day_old));
        assert!(!stale(Some("2026-01-02T12:00:00Z")).is(utc("2026-01-02T01:00:01Z")));
        // After it, or with no row at all: never had one, and one written now lives a day.
        assert!(!stale(Some("2026-01-01T00:00:00Z")).is(day_old));
        assert!(!stale(Some("2026-01-02T00:00:00Z")).is(day_old));
        assert!(!stale(None).is(day_old));
    }

    /// The scheduler's passes through both daylight-saving nights of 2026 in Europe/Berlin,
    /// each at its next tick (as `run` sleeps), the clock given, not the machine's: a job at
    /// 02:30 is enqueued once each night, at 03:00 CEST when 02:30 does not exist.
    #[test]
    fn passes_through_daylight_saving_nights_enqueue_each_night_once() {
        let text =
            "[database]\nurl = \"mysql://u@h/d\"\n[[schedule]]\nname = \"s\"\nqueue = \"q\"\n\
                    cron = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\n";
        let s = crate::config::from_text(text).unwrap().schedules[0]
            .as_ref()
            .clone();
        for (from, until, expected) in [
            (
                "2026-03-27T12:00:00Z",
                "2026-03-30T12:00:00Z",
                [
                    "2026-03-28T01:30:00Z",
                    "2026-03-29T01:00:00Z",
                    "2026-03-30T00:30:00Z",
                ],
            ),
            (
                "2026-10-23T12:00:00Z",
                "2026-10-26T12:00:00Z",
                [
                    "2026-10-24T00:30:00Z",
                    "2026-10-25T00:30:00Z",
                    "2026-10-26T01:30:00Z",
                ],
            ),
        ] {
            let (mut now, until) = (utc(from), utc(until));
            let (mut latest, mut checked) = (None, None);
            let mut enqueued = Vec::new();
            while now < until {
                let (ticks, _) = due(&s, latest, checked, now);
                latest = ticks.last().copied().or(latest);
                enqueued.extend(ticks);
                checked = Some(now);
                // Woken 3 ms after the next tick, as a pass takes a moment.
                now = s.when.next_after(now).unwrap() + chrono::Duration::milliseconds(3);
            }
            let expected: Vec<_> = expected.iter().map(|t| utc(t)).collect();
            assert_eq!(enqueued, expected);
        }
    }
}
