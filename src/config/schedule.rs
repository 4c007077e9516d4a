//! `[[schedule]]`: a recurring job, checked into [`ScheduleSettings`]. When its ticks fall is
//! the scheduler's (`scheduler::ticks`).

use std::time::Duration;

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Deserialize;

use super::queue::check_queue_name;
use super::KeyError;

/// A `[[schedule]]` as the file spells it.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchedule {
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
pub(super) fn validate(raw: Vec<RawSchedule>) -> Result<Vec<ScheduleSettings>, KeyError> {
    let mut out: Vec<ScheduleSettings> = Vec::new();
    for (i, s) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("schedule[{i}].{k}");
        check_name(&s.name).map_err(KeyError::at(key("name")))?;
        if out.iter().any(|o| o.name == s.name) {
            return Err(KeyError::new(
                key("name"),
                format!("schedule {:?} is defined twice", s.name),
            ));
        }
        out.push(entry(s, key)?);
    }
    Ok(out)
}

/// One `[[schedule]]` whose name was checked: the rest of its keys.
fn entry(s: RawSchedule, key: impl Fn(&str) -> String) -> Result<ScheduleSettings, KeyError> {
    check_queue_name(&s.queue).map_err(KeyError::at(key("queue")))?;
    let priority = match s.priority {
        None => 0,
        Some(p) => i16::try_from(p).map_err(|_| {
            KeyError::new(
                key("priority"),
                format!("{p} is out of range: -32768 to 32767"),
            )
        })?,
    };
    let when = match (s.cron, s.every) {
        (Some(_), Some(_)) => {
            return Err(KeyError::new(
                key("every"),
                "give either cron or every, not both".into(),
            ))
        }
        (None, None) => return Err(KeyError::new(key("cron"), "give cron or every".into())),
        (None, Some(every)) => {
            if s.timezone.is_some() {
                return Err(KeyError::new(
                    key("timezone"),
                    "applies only with cron".into(),
                ));
            }
            When::Every(check_every(&every).map_err(KeyError::at(key("every")))?)
        }
        (Some(written), None) => cron(&written, s.timezone.as_deref(), &key)?,
    };
    let catch_up = match s.catch_up.as_deref() {
        None | Some("latest") => CatchUp::Latest,
        Some("none") => CatchUp::None,
        Some("all") => CatchUp::All,
        Some(other) => {
            return Err(KeyError::new(
                key("catch_up"),
                format!("{other:?} is not one of \"none\", \"latest\", \"all\""),
            ))
        }
    };
    let payload = s.payload.unwrap_or_default().into_bytes();
    if payload.len() > MAX_PAYLOAD {
        return Err(KeyError::new(
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
        return Err(KeyError::new(
            key("cron"),
            format!("{:?} is too long to keep", schedule.definition()),
        ));
    }
    Ok(schedule)
}

/// A schedule's name: the ticks table's key, and a log field.
fn check_name(name: &str) -> Result<(), String> {
    match super::queue::is_plain_name(name) {
        true => Ok(()),
        false => Err(format!("{name:?} is not 1 to 64 of A-Z a-z 0-9 - _ . :")),
    }
}

/// `every`: from [`MIN_EVERY`] to [`MAX_EVERY`].
fn check_every(every: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(every.trim())
        .map_err(|_| format!("{every:?} is not a duration like \"5m\""))?;
    if d < MIN_EVERY {
        return Err(format!("{every:?} is shorter than 1s"));
    }
    if d > MAX_EVERY {
        return Err(format!("{every:?} is longer than 100 years"));
    }
    Ok(d)
}

/// `cron` as written, in `timezone` (UTC when not given).
fn cron(
    written: &str,
    timezone: Option<&str>,
    key: &impl Fn(&str) -> String,
) -> Result<When, KeyError> {
    // Fields apart by any blanks, as croner reads them: a change of blanks is no change of
    // the schedule's definition.
    let text = written.split_whitespace().collect::<Vec<_>>().join(" ");
    // The definition is kept in each tick's row, of 255 bytes.
    if text.len() > MAX_CRON_LEN {
        return Err(KeyError::new(
            key("cron"),
            format!("{written:?} is longer than {MAX_CRON_LEN} bytes"),
        ));
    }
    let cron = parse_cron(&text).map_err(KeyError::at(key("cron")))?;
    let zone = match timezone {
        None => chrono_tz::UTC,
        Some(name) => name.parse::<chrono_tz::Tz>().map_err(|_| {
            KeyError::new(
                key("timezone"),
                format!("{name:?} is not an IANA time zone name like \"Europe/Berlin\""),
            )
        })?,
    };
    Ok(When::Cron {
        cron: Box::new(cron),
        text,
        zone,
    })
}

impl ScheduleSettings {
    /// What makes the schedule's ticks, kept in each tick's row: a schedule whose latest
    /// tick has another definition starts afresh rather than catch up.
    pub fn definition(&self) -> String {
        self.when.to_string()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(extra: &str) -> Result<Vec<ScheduleSettings>, KeyError> {
        #[derive(Deserialize)]
        struct File {
            schedule: Vec<RawSchedule>,
        }
        let text = format!("[[schedule]]\nname = \"s\"\nqueue = \"q\"\n{extra}");
        validate(toml::from_str::<File>(&text).unwrap().schedule)
    }

    #[test]
    fn bad_entries_name_their_key() {
        let err = |extra: &str| raw(extra).unwrap_err();
        assert_eq!(err("").key, "schedule[0].cron");
        assert_eq!(err("cron = \"61 * * * *\"\n").key, "schedule[0].cron");
        assert!(err("cron = \"61 * * * *\"\n")
            .message
            .starts_with("\"61 * * * *\" is not a cron expression"));
        assert_eq!(err("cron = \"* * * * * * *\"\n").key, "schedule[0].cron");
        assert_eq!(
            err("cron = \"@daily\"\ntimezone = \"Mars/Olympus\"\n").key,
            "schedule[0].timezone"
        );
        assert_eq!(
            err("every = \"5m\"\ncron = \"@daily\"\n").key,
            "schedule[0].every"
        );
        assert_eq!(err("every = \"500ms\"\n").key, "schedule[0].every");
        // 2^64 and 2^64 - 10^6 microseconds: no period wraps around.
        assert_eq!(
            err("every = \"18446744073709.551616s\"\n").key,
            "schedule[0].every"
        );
        assert_eq!(
            err("every = \"18446744073708.551616s\"\n").key,
            "schedule[0].every"
        );
        assert_eq!(
            err("every = \"5m\"\ntimezone = \"UTC\"\n").key,
            "schedule[0].timezone"
        );
        assert_eq!(
            err("every = \"5m\"\ncatch_up = \"some\"\n").key,
            "schedule[0].catch_up"
        );
        assert!(raw("cron = \"@hourly\"\n").is_ok());
        assert!(raw("cron = \"*/10 * * * * *\"\n").is_ok());
    }
}
