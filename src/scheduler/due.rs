//! Which ticks of a schedule are due at a pass, and which are too old to enqueue: pure, so
//! their tests need no database.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use super::Known;
use crate::config::{CatchUp, ScheduleSettings, MAX_CATCH_UP};
use crate::store::schedules::LastTick;

/// A tick this recent is the schedule's current one, however it was missed: a first pass
/// that comes a little late (a slow start, a reconnect) still enqueues it, whatever the
/// catch-up.
const GRACE: Duration = Duration::from_secs(10);

/// An owed tick older than this, before the schedule's latest row, is given up (and said):
/// its row, had another instance enqueued it, may be deleted soon, and a tick enqueued twice
/// is worse than one lost (see [`Stale`]).
const KEEP_OWED: Duration = Duration::from_secs(23 * 3600);

/// What a pass owes schedule `s` at `now`: the ticks due since what this instance knew of it
/// (`known`, while its definition is the same) and its latest row (`last`), less those too
/// old to enqueue, each given up or caught up said; and which ticks would be too old.
pub(super) fn owed(
    s: &ScheduleSettings,
    known: Option<Known>,
    last: &[LastTick],
    now: DateTime<Utc>,
    started: Instant,
) -> (Known, Stale) {
    let definition = s.definition();
    let memory = known.filter(|m| m.definition == definition);
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
    let known = Known {
        definition,
        checked: Some(now),
        failing,
        owed: ticks,
    };
    (known, stale)
}

/// Which of a schedule's ticks are too old to enqueue. A tick's row lives a day after its
/// tick and a day after it went in (see [`prune`]); a tick before the schedule's latest
/// row, read at the pass's start, may have had one, which may be gone once the tick is 24
/// hours old: such a tick is given up (and said) at 23 hours, rather than risk a second
/// job. A tick after that row had none then, and one written since lives a day: whatever
/// its age, it is enqueued.
pub(super) struct Stale {
    /// The schedule's latest row, whatever its definition (prune keeps it alone).
    head: Option<DateTime<Utc>>,
    /// The database's time at the pass's start, and that start on this host's clock.
    now: DateTime<Utc>,
    started: Instant,
}

impl Stale {
    pub(super) fn is(&self, tick: DateTime<Utc>) -> bool {
        let now = self.now + delta(self.started.elapsed());
        self.head.is_some_and(|h| tick < h) && now - tick >= delta(KEEP_OWED)
    }

    pub(super) fn say(&self, schedule: &str, count: usize, oldest: DateTime<Utc>) {
        warn!(schedule = %schedule, "scheduler: schedule {}: {} ticks 23 hours old or more given up, the oldest {}", schedule, count, oldest.to_rfc3339());
    }
}

pub(super) fn at(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

pub(super) fn delta(d: Duration) -> chrono::Duration {
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
