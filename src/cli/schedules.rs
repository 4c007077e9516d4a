//! `myjob schedules`: each `[[schedule]]` of the config, the last tick it enqueued (and that
//! tick's job), and its next tick, by the database's clock.

use std::path::Path;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::cli::table::{self, or_dash};
use crate::error::{Error, ExitCode, OrExit};
use crate::store::schedules;

#[derive(Serialize)]
struct Document {
    schedules: Vec<Row>,
}

/// One schedule as `myjob schedules` shows it; times in UTC ISO 8601.
#[derive(Serialize)]
struct Row {
    name: String,
    queue: String,
    /// `cron "0 2 * * *" in Europe/Berlin`, or `every 5m`.
    when: String,
    catch_up: &'static str,
    last_tick: Option<String>,
    last_job_id: Option<u64>,
    next_tick: Option<String>,
}

pub async fn run(config: &Path, json: bool) -> Result<(), Error> {
    let (settings, mut conn) = super::open(config).await?;
    let names: Vec<&str> = settings.schedules.iter().map(|s| s.name.as_str()).collect();
    let last = schedules::last_ticks(&mut conn, &names)
        .await
        .or_exit(ExitCode::Unavailable)?;
    let now = schedules::now_us(&mut conn)
        .await
        .or_exit(ExitCode::Unavailable)?;
    let _ = conn.disconnect().await;
    let iso = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Micros, true);
    let now = DateTime::from_timestamp_micros(now).unwrap_or_default();
    let rows: Vec<Row> = settings
        .schedules
        .iter()
        .map(|s| {
            let latest = last.iter().find(|l| l.schedule == s.name);
            Row {
                name: s.name.clone(),
                queue: s.queue.clone(),
                when: s.when.to_string(),
                catch_up: s.catch_up.as_str(),
                last_tick: latest
                    .and_then(|l| DateTime::from_timestamp_micros(l.tick_us))
                    .map(iso),
                last_job_id: latest.and_then(|l| l.job_id),
                next_tick: s.when.next_after(now).map(iso),
            }
        })
        .collect();
    if json {
        return table::print_json(&Document { schedules: rows });
    }
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.queue.clone(),
                r.when.clone(),
                r.catch_up.to_owned(),
                or_dash(r.last_tick.as_deref().map(table::time).as_deref()),
                or_dash(r.last_job_id.map(|id| id.to_string()).as_deref()),
                or_dash(r.next_tick.as_deref().map(table::time).as_deref()),
            ]
        })
        .collect();
    table::print(
        &[
            "NAME",
            "QUEUE",
            "WHEN",
            "CATCH UP",
            "LAST TICK",
            "LAST JOB",
            "NEXT TICK",
        ],
        &lines,
    )
}
