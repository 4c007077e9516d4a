//! Recurring jobs: a `[[schedule]]` of the config, checked into [`ScheduleSettings`], and its
//! ticks. A tick is an instant in UTC; `every` ticks at the multiples of its period since the
//! Unix epoch (so every instance and host agrees on them without asking), `cron` at its
//! expression's times in its time zone, with croner's rule for daylight-saving changes: a
//! fixed time that a spring-forward skips runs at the first time after the gap, once; a
//! fixed time that a fall-back repeats runs once, at its first occurrence; patterns with
//! ranges, steps or lists in the time fields follow the clock (skipped in the gap, twice in
//! the repeated hour).

use std::time::Duration;

use chrono::{DateTime, TimeZone as _, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Deserialize;

/// A `[[schedule]]` as the file spells it.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSchedule {
    name: String,
    queue: String,
    payload: Option<String>,
    priority: Option<i64>,
    cron: Option<String>,
    timezone: Option<String>,
    every: Option<String>,
    catch_up: Option<String>,
}

/// One recurring job.
#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    /// Unique in the config; the ticks table's key.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    pub payload: Vec<u8>,
    pub priority: i16,
    pub when: When,
    pub catch_up: CatchUp,
}

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub enum When {
    /// `cron`, in `timezone` (UTC when not given); `text` as written, for messages.
    Cron {
        cron: Box<Cron>,
        text: String,
        zone: chrono_tz::Tz,
    },
    /// `every`: at each multiple of the period since the Unix epoch.
    Every(Duration),
}

impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            When::Cron { text, zone, .. } => write!(f, "cron {text:?} in {zone}"),
            When::Every(d) => write!(f, "every {}", humantime::format_duration(*d)),
        }
    }
}

/// What a schedule enqueues for the ticks it missed while no instance ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Nothing: the next tick comes as usual.
    None,
    /// One job, for the latest missed tick (the default).
    Latest,
    /// One job per missed tick, the latest [`MAX_CATCH_UP`] of them.
    All,
}

impl CatchUp {
    /// The policy as the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        }
    }
}

/// The most missed ticks `catch_up = "all"` enqueues.
pub const MAX_CATCH_UP: usize = 1000;
/// The longest `cron` expression: with the time zone's name, the definition a tick's row
/// keeps fits in its 255 bytes.
const MAX_CRON_LEN: usize = 160;
/// The most a tick's row keeps of the definition (`definition VARBINARY(255)`).
const MAX_DEFINITION: usize = 255;
/// The most a job's payload holds (`payload MEDIUMBLOB`).
const MAX_PAYLOAD: usize = 16 * 1024 * 1024 - 1;
/// The shortest `every`.
const MIN_EVERY: Duration = Duration::from_secs(1);
/// The longest `every`: a hundred years (of 365.25 days, as humantime counts `"100y"`), far
/// inside the microseconds of an i64.
const MAX_EVERY: Duration = Duration::from_secs(100 * 31_557_600);

/// Checks the `[[schedule]]` entries; an error names the key (`schedule[2].cron`).
pub(crate) fn validate(raw: Vec<RawSchedule>) -> Result<Vec<ScheduleSettings>, (String, String)> {
    let mut out: Vec<ScheduleSettings> = Vec::new();
    for (i, s) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("schedule[{i}].{k}");
        let name_ok = !s.name.is_empty()
            && s.name.len() <= 64
            && s.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if !name_ok {
            return Err((
                key("name"),
                format!("{:?} is not 1 to 64 of A-Z a-z 0-9 - _ . :", s.name),
            ));
        }
        if out.iter().any(|o| o.name == s.name) {
            return Err((
                key("name"),
                format!("schedule {:?} is defined twice", s.name),
            ));
        }
        crate::config::check_queue_name(&s.queue).map_err(|m| (key("queue"), m))?;
        let priority = match s.priority {
            None => 0,
            Some(p) => i16::try_from(p).map_err(|_| {
                (
                    key("priority"),
                    format!("{p} is out of range: -32768 to 32767"),
                )
            })?,
        };
        let when = match (s.cron, s.every) {
            (Some(_), Some(_)) => {
                return Err((key("every"), "give either cron or every, not both".into()))
            }
            (None, None) => return Err((key("cron"), "give cron or every".into())),
            (None, Some(every)) => {
                if s.timezone.is_some() {
                    return Err((key("timezone"), "applies only with cron".into()));
                }
                let d = humantime::parse_duration(every.trim()).map_err(|_| {
                    (
                        key("every"),
                        format!("{every:?} is not a duration like \"5m\""),
                    )
                })?;
                if d < MIN_EVERY {
                    return Err((key("every"), format!("{every:?} is shorter than 1s")));
                }
                if d > MAX_EVERY {
                    return Err((key("every"), format!("{every:?} is longer than 100 years")));
                }
                When::Every(d)
            }
            (Some(written), None) => {
                // Fields apart by any blanks, as croner reads them: a change of blanks is no
                // change of the schedule's definition.
                let text = written.split_whitespace().collect::<Vec<_>>().join(" ");
                // The definition is kept in each tick's row, of 255 bytes.
                if text.len() > MAX_CRON_LEN {
                    return Err((
                        key("cron"),
                        format!("{written:?} is longer than {MAX_CRON_LEN} bytes"),
                    ));
                }
                let cron = parse_cron(&text).map_err(|m| (key("cron"), m))?;
                let zone = match s.timezone.as_deref() {
                    None => chrono_tz::UTC,
                    Some(name) => name.parse::<chrono_tz::Tz>().map_err(|_| {
                        (
                            key("timezone"),
                            format!(
                                "{name:?} is not an IANA time zone name like \"Europe/Berlin\""
                            ),
                        )
                    })?,
                };
                When::Cron {
                    cron: Box::new(cron),
                    text,
                    zone,
                }
            }
        };
        let catch_up = match s.catch_up.as_deref() {
            None | Some("latest") => CatchUp::Latest,
            Some("none") => CatchUp::None,
            Some("all") => CatchUp::All,
            Some(other) => {
                return Err((
                    key("catch_up"),
                    format!("{other:?} is not one of \"none\", \"latest\", \"all\""),
                ))
            }
        };
        let payload = s.payload.unwrap_or_default().into_bytes();
        if payload.len() > MAX_PAYLOAD {
            return Err((
                key("payload"),
                format!("{} bytes, more than a job's {MAX_PAYLOAD}", payload.len()),
            ));
        }
        let schedule = ScheduleSettings {
            name: s.name,
            queue: s.queue,
            payload,
            priority,
            when,
            catch_up,
        };
        if schedule.definition().len() > MAX_DEFINITION {
            return Err((
                key("cron"),
                format!("{:?} is too long to keep", schedule.definition()),
            ));
        }
        out.push(schedule);
    }
    Ok(out)
}

/// A cron expression of 5 fields, or 6 with seconds first, or a name like `@hourly`.
fn parse_cron(text: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(text.trim())
        .map_err(|e| format!("{text:?} is not a cron expression: {e}"))
}

impl ScheduleSettings {
    /// What makes the schedule's ticks, kept in each tick's row: a schedule whose latest
    /// tick has another definition starts afresh rather than catch up.
    pub fn definition(&self) -> String {
        self.when.to_string()
    }
}

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

    fn raw(extra: &str) -> Result<Vec<ScheduleSettings>, (String, String)> {
        #[derive(Deserialize)]
        struct File {
            schedule: Vec<RawSchedule>,
        }
        let text = format!("[[schedule]]\nname = \"s\"\nqueue = \"q\"\n{extra}");
        validate(toml::from_str::<File>(&text).unwrap().schedule)
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn bad_entries_name_their_key() {
        let err = |extra: &str| raw(extra).unwrap_err();
        assert_eq!(err("").0, "schedule[0].cron");
        assert_eq!(err("cron = \"61 * * * *\"\n").0, "schedule[0].cron");
        assert!(err("cron = \"61 * * * *\"\n")
            .1
            .starts_with("\"61 * * * *\" is not a cron expression"));
        assert_eq!(err("cron = \"* * * * * * *\"\n").0, "schedule[0].cron");
        assert_eq!(
            err("cron = \"@daily\"\ntimezone = \"Mars/Olympus\"\n").0,
            "schedule[0].timezone"
        );
        assert_eq!(
            err("every = \"5m\"\ncron = \"@daily\"\n").0,
            "schedule[0].every"
        );
        assert_eq!(err("every = \"500ms\"\n").0, "schedule[0].every");
        // 2^64 and 2^64 - 10^6 microseconds: no period wraps around.
        assert_eq!(
            err("every = \"18446744073709.551616s\"\n").0,
            "schedule[0].every"
        );
        assert_eq!(
            err("every = \"18446744073708.551616s\"\n").0,
            "schedule[0].every"
        );
        assert_eq!(
            err("every = \"5m\"\ntimezone = \"UTC\"\n").0,
            "schedule[0].timezone"
        );
        assert_eq!(
            err("every = \"5m\"\ncatch_up = \"some\"\n").0,
            "schedule[0].catch_up"
        );
        assert!(raw("cron = \"@hourly\"\n").is_ok());
        assert!(raw("cron = \"*/10 * * * * *\"\n").is_ok());
    }

    #[test]
    fn every_ticks_at_multiples_of_its_period() {
        let s = &raw("every = \"5m\"\n").unwrap()[0];
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
        let s = &raw("every = \"1s\"\n").unwrap()[0];
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
        let s = &raw("cron = \"*/10 * * * * *\"\n").unwrap()[0];
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
        let s = &raw("cron = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\n").unwrap()[0];
        assert_eq!(
            s.when.ticks_between(
                utc("2026-03-28T12:00:00Z"),
                utc("2026-03-29T05:00:00Z"),
                100
            ),
            [utc("2026-03-29T01:00:00Z")]
        );
        // Blanks between fields are no part of the definition.
        let s = &raw("cron = \" 0  2 * *\t* \"\n").unwrap()[0];
        assert_eq!(s.definition(), "cron \"0 2 * * *\" in UTC");
        assert_eq!(
            raw("every = \"1s\"\npayload = \"x\"\n").unwrap()[0].definition(),
            "every 1s"
        );
        assert!(raw("every = \"100y\"\n").is_ok());
    }

    /// Europe/Berlin springs forward at 02:00 on 2026-03-29 (02:30 does not exist) and
    /// falls back at 03:00 on 2026-10-25 (02:30 happens twice): a job at 02:30 runs once on
    /// each of those nights, at 03:00 CEST on the first.
    #[test]
    fn a_fixed_local_time_runs_once_across_daylight_saving_changes() {
        let s = &raw("cron = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\n").unwrap()[0];
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
        let s = &raw("cron = \"15 * * * *\"\ntimezone = \"Europe/Berlin\"\n").unwrap()[0];
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
