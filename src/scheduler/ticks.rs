//! When a schedule ticks (its `[[schedule]]` is checked in `config::schedule`). A tick is an
//! instant in UTC; `every` ticks at the multiples of its period since the
//! Unix epoch (so every instance and host agrees on them without asking), `cron` at its
//! expression's times in its time zone, with croner's rule for daylight-saving changes: a
//! fixed time that a spring-forward skips runs at the first time after the gap, once; a
//! fixed time that a fall-back repeats runs once, at its first occurrence; patterns with
//! ranges, steps or lists in the time fields follow the clock (skipped in the gap, twice in
//! the repeated hour).

use chrono::{DateTime, TimeZone as _, Utc};

use crate::config::When;

#[cfg(test)]
use crate::config::ScheduleSettings;

impl When {
    /// The first tick strictly after `after`, if any (a cron expression may match no date).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            When::Every(period) => {
                let p = i64::try_from(period.as_micros()).ok().filter(|p| *p > 0)?;
                let t = after.timestamp_micros();
                let next = t.div_euclid(p).checked_add(1)?.checked_mul(p)?;
                DateTime::from_timestamp_micros(next)
            }
            When::Cron { cron, zone, .. } => {
                let local = zone.from_utc_datetime(&after.naive_utc());
                cron.find_next_occurrence(&local, false)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            }
        }
    }

    /// The ticks in `(after, until]`, oldest first: the last `max` of them when there are
    /// more. For `every`, counted rather than walked (a year of 1 s ticks costs nothing);
    /// for `cron`, walked forward (the walk that decides, daylight saving included, which
    /// instants are ticks) from where a walk back from `until` over `max` ticks ended, so
    /// that a gap of years costs `max` steps, not one per tick.
    pub fn ticks_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> Vec<DateTime<Utc>> {
        let (cron, zone) = match self {
            When::Every(period) => {
                let Some(p) = i64::try_from(period.as_micros()).ok().filter(|p| *p > 0) else {
                    return Vec::new();
                };
                let first = after.timestamp_micros().div_euclid(p).saturating_add(1);
                let last = until.timestamp_micros().div_euclid(p);
                let from = first.max(last.saturating_sub(max as i64).saturating_add(1));
                return (from..=last)
                    .filter_map(|k| k.checked_mul(p).and_then(DateTime::from_timestamp_micros))
                    .collect();
            }
            When::Cron { cron, zone, .. } => (cron, zone),
        };
        // Back over max + 2 ticks at most, from a second after `until` (croner compares
        // whole seconds), so that the walk back ends before the window's first tick; a step
        // back is only a guess near a daylight-saving change, and the walk forward starts a
        // microsecond before where it ended.
        // When the walk back reaches `after` first, the walk forward starts there.
        let mut t = until + chrono::Duration::seconds(1);
        for _ in 0..max.saturating_add(2) {
            let local = zone.from_utc_datetime(&t.naive_utc());
            match cron.find_previous_occurrence(&local, false) {
                // Each step must go back, or the walk forward would start too late.
                Ok(back) if back.with_timezone(&Utc) > after && back.with_timezone(&Utc) < t => {
                    t = back.with_timezone(&Utc)
                }
                _ => {
                    t = after;
                    break;
                }
            }
        }
        let mut t = after.max(t - chrono::Duration::microseconds(1));
        let mut ticks = std::collections::VecDeque::new();
        for _ in 0..MAX_WALK {
            let Some(next) = self.next_after(t).filter(|n| *n <= until) else {
                break;
            };
            ticks.push_back(next);
            if ticks.len() > max {
                ticks.pop_front();
            }
            t = next;
        }
        ticks.into()
    }
}

/// The most ticks a walk forward takes (a guard: it starts at most `max` + 2 ticks before
/// its end).
const MAX_WALK: usize = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The one schedule of a config that has it and a url.
    fn schedule(entry: &str) -> Result<ScheduleSettings, String> {
        let text = format!(
            "[database]\nurl = \"mysql://u@127.0.0.1:3306/d\"\n\n\
             [[schedule]]\nname = \"s\"\nqueue = \"q\"\n{entry}"
        );
        let settings = crate::config::from_text(&text)?;
        Ok(ScheduleSettings::clone(&settings.schedules[0]))
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }
    #[test]
    fn every_ticks_at_multiples_of_its_period() {
        let s = &schedule("every = \"5m\"\n").unwrap();
        let ticks = s.when.ticks_between(
            utc("2026-01-01T00:03:00Z"),
            utc("2026-01-01T00:20:00Z"),
            100,
        );
        assert_eq!(
            ticks,
            [
                utc("2026-01-01T00:05:00Z"),
                utc("2026-01-01T00:10:00Z"),
                utc("2026-01-01T00:15:00Z"),
                utc("2026-01-01T00:20:00Z")
            ]
        );
        // The last `max` when there are more.
        let last =
            s.when
                .ticks_between(utc("2026-01-01T00:03:00Z"), utc("2026-01-01T00:20:00Z"), 2);
        assert_eq!(
            last,
            [utc("2026-01-01T00:15:00Z"), utc("2026-01-01T00:20:00Z")]
        );
        // A year of 1 s ticks is counted, not walked.
        let s = &schedule("every = \"1s\"\n").unwrap();
        let year =
            s.when
                .ticks_between(utc("2025-01-01T00:00:00Z"), utc("2026-01-01T00:00:00Z"), 3);
        assert_eq!(
            year,
            [
                utc("2025-12-31T23:59:58Z"),
                utc("2025-12-31T23:59:59Z"),
                utc("2026-01-01T00:00:00Z")
            ]
        );
    }

    /// A cron schedule back after 130 days of 10 s ticks: the last ticks before now, found in
    /// `max` steps back, not a walk over a million ticks.
    #[test]
    fn cron_ticks_after_a_long_gap_are_the_latest() {
        let s = &schedule("cron = \"*/10 * * * * *\"\n").unwrap();
        let started = std::time::Instant::now();
        let ticks =
            s.when
                .ticks_between(utc("2026-01-01T00:00:00Z"), utc("2026-05-11T12:00:05Z"), 3);
        assert_eq!(
            ticks,
            [
                utc("2026-05-11T11:59:40Z"),
                utc("2026-05-11T11:59:50Z"),
                utc("2026-05-11T12:00:00Z")
            ]
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // Across the spring-forward night, from a day before: the tick after the gap.
        let s = &schedule("cron = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\n").unwrap();
        assert_eq!(
            s.when.ticks_between(
                utc("2026-03-28T12:00:00Z"),
                utc("2026-03-29T05:00:00Z"),
                100
            ),
            [utc("2026-03-29T01:00:00Z")]
        );
        // Blanks between fields are no part of the definition.
        let s = &schedule("cron = \" 0  2 * *\t* \"\n").unwrap();
        assert_eq!(s.definition(), "cron \"0 2 * * *\" in UTC");
        assert_eq!(
            schedule("every = \"1s\"\npayload = \"x\"\n")
                .unwrap()
                .definition(),
            "every 1s"
        );
        assert!(schedule("every = \"100y\"\n").is_ok());
    }

    /// Europe/Berlin springs forward at 02:00 on 2026-03-29 (02:30 does not exist) and
    /// falls back at 03:00 on 2026-10-25 (02:30 happens twice): a job at 02:30 runs once on
    /// each of those nights, at 03:00 CEST on the first.
    #[test]
    fn a_fixed_local_time_runs_once_across_daylight_saving_changes() {
        let s = &schedule("cron = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\n").unwrap();
        let spring = s.when.ticks_between(
            utc("2026-03-27T12:00:00Z"),
            utc("2026-03-30T12:00:00Z"),
            100,
        );
        assert_eq!(
            spring,
            [
                utc("2026-03-28T01:30:00Z"), // 02:30 CET
                utc("2026-03-29T01:00:00Z"), // 03:00 CEST, right after the gap
                utc("2026-03-30T00:30:00Z"), // 02:30 CEST
            ]
        );
        let autumn = s.when.ticks_between(
            utc("2026-10-23T12:00:00Z"),
            utc("2026-10-26T12:00:00Z"),
            100,
        );
        assert_eq!(
            autumn,
            [
                utc("2026-10-24T00:30:00Z"), // 02:30 CEST
                utc("2026-10-25T00:30:00Z"), // the first 02:30, CEST; not the second, CET
                utc("2026-10-26T01:30:00Z"), // 02:30 CET
            ]
        );
    }

    /// An hourly pattern follows the clock: no 02:xx on the spring-forward night, and both
    /// 02:15s on the fall-back night.
    #[test]
    fn a_pattern_over_hours_follows_the_clock() {
        let s = &schedule("cron = \"15 * * * *\"\ntimezone = \"Europe/Berlin\"\n").unwrap();
        let spring = s.when.ticks_between(
            utc("2026-03-29T00:00:00Z"),
            utc("2026-03-29T01:30:00Z"),
            100,
        );
        // 01:15 CET = 00:15Z; then 03:15 CEST = 01:15Z.
        assert_eq!(
            spring,
            [utc("2026-03-29T00:15:00Z"), utc("2026-03-29T01:15:00Z")]
        );
        let autumn = s.when.ticks_between(
            utc("2026-10-24T23:30:00Z"),
            utc("2026-10-25T02:30:00Z"),
            100,
        );
        assert_eq!(
            autumn,
            [
                utc("2026-10-25T00:15:00Z"), // 02:15 CEST
                utc("2026-10-25T01:15:00Z"), // 02:15 CET
                utc("2026-10-25T02:15:00Z"), // 03:15 CET
            ]
        );
    }
}
