//! The values a key may hold, read from their text: numbers in a range, durations with a
//! floor, ages, rates. Each error names the key it was read for.
//!
//! The shortest value of each duration key (the `MIN_*` of each section's file) is where a
//! loop would spin (a poll, a reaper pass) or the value would make no sense (a handler killed
//! before it could start, a persistent process stopped between two jobs). Zero is allowed only
//! where it means something.

use std::time::Duration;

use super::KeyError;
pub(super) fn int_in(
    value: Option<i64>,
    default: i64,
    min: i64,
    max: i64,
    key: &str,
) -> Result<i64, KeyError> {
    let v = value.unwrap_or(default);
    if v < min || v > max {
        return Err(KeyError::new(
            key,
            format!("{v} is out of range: {min} to {max}"),
        ));
    }
    Ok(v)
}

pub(super) fn duration(
    value: Option<String>,
    default: &str,
    key: &str,
) -> Result<Duration, KeyError> {
    let text = value.as_deref().unwrap_or(default);
    parse_duration(text).map_err(KeyError::at(key))
}

/// A duration of at least `min`, zero only when `min` is: below it, the message names the
/// floor (`"1us" is shorter than the minimum of 10ms`).
pub(super) fn duration_min(
    value: Option<String>,
    default: &str,
    min: Duration,
    key: &str,
) -> Result<Duration, KeyError> {
    let text = value.as_deref().unwrap_or(default);
    let min_text = humantime::format_duration(min);
    let zero = humantime::parse_duration(text.trim()).is_ok_and(|d| d.is_zero());
    let d = match (zero, min.is_zero()) {
        (true, true) => Duration::ZERO,
        (true, false) => {
            return Err(KeyError::new(
                key,
                format!("{text:?} must be longer than zero (the minimum is {min_text})"),
            ))
        }
        (false, _) => parse_duration(text).map_err(KeyError::at(key))?,
    };
    if d < min {
        return Err(KeyError::new(
            key,
            format!("{text:?} is shorter than the minimum of {min_text}"),
        ));
    }
    Ok(d)
}

/// `"N/PERIOD"` (`"10/1s"`, `"600/1m"`): N from 1 to 1,000,000 starts per PERIOD of at
/// least 1ms. Returns N and PERIOD / N in microseconds.
pub fn parse_rate(text: &str) -> Result<(u32, i64), String> {
    let form = || format!("{text:?} is not N/PERIOD, such as \"10/1s\" or \"600/1m\"");
    let (count, period) = text.split_once('/').ok_or_else(form)?;
    let count: u32 = count.trim().parse().map_err(|_| form())?;
    if !(1..=1_000_000).contains(&count) {
        return Err(format!("{text:?}: N must be 1 to 1000000"));
    }
    let period = parse_duration(period.trim()).map_err(|_| form())?;
    if period < Duration::from_millis(1) {
        return Err(format!("{text:?}: PERIOD must be at least 1ms"));
    }
    // Rounded up: "3/1s" must not fit a fourth start into a second.
    let interval_us = period.as_micros().div_ceil(u128::from(count)).max(1);
    // PERIOD is at most ten years (parse_duration): the interval fits.
    Ok((count, i64::try_from(interval_us).unwrap_or(i64::MAX)))
}

pub(super) fn age(
    value: Option<String>,
    default: &str,
    key: &str,
) -> Result<Option<Duration>, KeyError> {
    parse_age(value.as_deref().unwrap_or(default)).map_err(KeyError::at(key))
}

/// Parses how long finished jobs are kept: a duration such as `"7d"` (zero too: deleted as
/// soon as they finish), or `"forever"`, which is None.
pub fn parse_age(text: &str) -> Result<Option<Duration>, String> {
    if text.trim() == "forever" {
        return Ok(None);
    }
    if humantime::parse_duration(text.trim()).is_ok_and(|d| d.is_zero()) {
        return Ok(Some(Duration::ZERO));
    }
    parse_duration(text)
        .map(Some)
        .map_err(|_| format!("{text:?} is not an age like \"12h\", \"7d\" or \"forever\""))
}

/// Parses a positive duration such as `"500ms"`, `"30s"` or `"5m"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|_| format!("{text:?} is not a duration like \"500ms\", \"30s\" or \"5m\""))?;
    if d.is_zero() {
        return Err(format!("{text:?} must be longer than zero"));
    }
    // Durations end up as microseconds in SQL and as tokio timers: keep them sane.
    if d > Duration::from_secs(10 * 365 * 24 * 3600) {
        return Err(format!("{text:?} is longer than ten years"));
    }
    Ok(d)
}
