//! `myjob show ID`: every column of one job, or its payload's raw bytes.

use std::io::Write as _;
use std::path::Path;

use anyhow::anyhow;
use serde_json::{Map, Value};

use crate::cli::table;
use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::{admin, JobId};

/// The columns that are numbers in JSON.
const NUMBERS: &[&str] = &[
    "id",
    "priority",
    "attempts",
    "max_attempts",
    "rescues",
    "suspicion",
    "batch_id",
    "owner_conn",
];

pub async fn run(config: &Path, id: u64, json: bool, payload: bool) -> Result<(), Error> {
    let (_, mut conn) = super::open(config).await?;
    let shown = admin::show(&mut conn, JobId::new(id))
        .await
        .or_exit(ExitCode::Unavailable)?;
    let _ = conn.disconnect().await;
    let Some(shown) = shown else {
        return Err(Error::new(ExitCode::Data, anyhow!("job {id}: no such job")));
    };
    if payload {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(&shown.payload)
            .and_then(|()| out.flush())
            .or_exit(ExitCode::Software);
    }
    let size = shown.payload.len();
    if json {
        let mut doc = Map::new();
        for (name, value) in shown.columns {
            let v = match value {
                None => Value::Null,
                Some(text) if NUMBERS.contains(&name) => text
                    .parse::<i64>()
                    .map(Value::from)
                    .or_else(|_| text.parse::<u64>().map(Value::from))
                    .unwrap_or(Value::String(text)),
                Some(text) => Value::String(text),
            };
            doc.insert(name.to_owned(), v);
        }
        doc.insert("payload_bytes".into(), size.into());
        // Text when it is UTF-8; `--payload` gives the raw bytes of any payload.
        let text = String::from_utf8(shown.payload).ok();
        doc.insert("payload".into(), text.map_or(Value::Null, Value::String));
        return table::print_json(&doc);
    }
    let mut rows: Vec<Vec<String>> = shown
        .columns
        .into_iter()
        .map(|(name, value)| vec![format!("{name}:"), table::or_dash(value.as_deref())])
        .collect();
    rows.push(vec!["payload:".into(), format!("{size} bytes")]);
    table::print(&[], &rows)
}
