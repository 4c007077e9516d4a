//! Log output. Under systemd (stderr is the journal stream and journald's socket is there)
//! events go to the journal natively with their fields (see [`journal`]); on a terminal, a
//! file or a container's stdout, lines are human-readable with timestamps. `MYJOB_LOG` sets
//! the filter (`info` by default; e.g. `MYJOB_LOG=debug`).
//!
//! A job's lines are logged inside its span ([`job_span`]), which carries its id, queue,
//! attempt and batch into the journal's fields; the text output does not show spans, so a
//! line reads the same either way.

mod fields;
mod journal;

pub use fields::escape;

use std::fmt;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::mpsc::SyncSender;
use std::sync::OnceLock;
use std::time::Duration;

use tracing::{Event, Span, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::store::jobs::{BatchId, JobId};

/// The `MESSAGE_ID`s of the events operators search for, by the event's target: fixed
/// 128-bit ids, as systemd's catalog uses (`journalctl MESSAGE_ID=…`). Never change one: it
/// is what saved searches and alerts match.
pub const MESSAGE_IDS: &[(&str, &str, &str)] = &[
    (
        "myjob::msg::started",
        "d5945a1ca14e48ba895170f6719f7be4",
        "instance started (ready)",
    ),
    (
        "myjob::msg::stopped",
        "d7ced96f15f642dcaab49f1329ffd533",
        "instance stopped",
    ),
    (
        "myjob::msg::reloaded",
        "2a315390d72d463f9d1faabed40a4677",
        "configuration reloaded",
    ),
    (
        "myjob::msg::reload_refused",
        "c317c0e4b26448b8803df24fdda171ef",
        "configuration reload refused, the old one kept",
    ),
    (
        "myjob::msg::failed",
        "78241644850349e583bc19149a28a631",
        "job failed for good",
    ),
    (
        "myjob::msg::rescued",
        "5ac7ca9c4efb4b4eaa7471d7d46c3192",
        "job rescued: a dead worker's claim put back by the reaper",
    ),
    (
        "myjob::msg::poison_pill",
        "fa58a5b6afee479e9e23c610222a9d77",
        "job failed as a poison pill: its workers died running it in quarantine",
    ),
];

/// The `MESSAGE_ID` of events of `target`, if they have one.
pub fn message_id(target: &str) -> Option<&'static str> {
    MESSAGE_IDS
        .iter()
        .find(|(t, _, _)| *t == target)
        .map(|(_, id, _)| *id)
}

/// The span a job's lines are logged in: its fields go to the journal with every line. At
/// the level ERROR so that it exists whatever the filter lets through (`MYJOB_LOG=warn` keeps
/// a failure's fields); the text output shows no span, so it is not made there at all.
pub fn job_span(job_id: JobId, queue: &str, attempt: u32, batch_id: Option<BatchId>) -> Span {
    tracing::span!(
        tracing::Level::ERROR,
        "job",
        job_id = job_id.get(),
        queue,
        attempt,
        batch_id = batch_id.map(BatchId::get)
    )
}

/// The database this instance serves, once its config is read (see [`set_database`]).
static DATABASE: OnceLock<String> = OnceLock::new();

/// From now on every journal entry carries `MYJOB_DATABASE=name`, which `myjob show --log`
/// matches beside the job's id: two databases served from one host have jobs of the same ids.
/// Set once; a reload does not change the database.
pub fn set_database(name: &str) {
    let _ = DATABASE.set(name.to_owned());
}

fn database() -> Option<&'static str> {
    DATABASE.get().map(String::as_str)
}

/// The journal layer's stderr thread, when the journal is in use (see [`flush`]).
static FALLBACK: OnceLock<SyncSender<journal::Fallback>> = OnceLock::new();

/// Before the process exits: waits (5 s at most) for the lines journald could not take to be
/// written to stderr.
pub fn flush() {
    if let Some(fallback) = FALLBACK.get() {
        journal::flush(fallback, Duration::from_secs(5));
    }
}

/// Installs the global subscriber. Call once, first thing; `instance` is the instance this
/// process runs as, if it is one.
pub fn init(instance: Option<&str>) {
    let filter = EnvFilter::try_from_env("MYJOB_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let journal = Path::new(journal::SOCKET);
    let native =
        stderr_is_journal() && std::fs::metadata(journal).is_ok_and(|m| m.file_type().is_socket());
    let registry = tracing_subscriber::registry().with(filter);
    if native {
        if let Some(layer) = journal::JournalLayer::new(journal, instance) {
            let _ = FALLBACK.set(layer.fallback());
            registry.with(layer).init();
            return;
        }
    }
    // Spans only feed the journal's fields: the text shows the events alone.
    let events = filter_fn(|m| m.is_event());
    let text = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .fmt_fields(fields::CleanFields::default());
    if stderr_is_journal() {
        let text = text.with_ansi(false).event_format(Stream(
            Format::default()
                .without_time()
                .with_target(false)
                .with_level(false),
        ));
        registry.with(text.with_filter(events)).init();
    } else {
        let text = text.with_ansi(std::io::stderr().is_terminal());
        registry.with(text.with_filter(events)).init();
    }
}

/// True when stderr is the stream systemd set up for this unit: JOURNAL_STREAM holds the
/// device and inode of that stream, and a redirect elsewhere no longer matches.
fn stderr_is_journal() -> bool {
    let Ok(expected) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(m) => expected == format!("{}:{}", m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// The default format behind a `<N>` priority prefix (sd-daemon(3)): the journal's stream
/// when its socket is not there.
struct Stream<F>(F);

impl<S, N, F> FormatEvent<S, N> for Stream<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", journal::priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_distinct_128_bit_ids() {
        let mut ids: Vec<&str> = MESSAGE_IDS.iter().map(|m| m.1).collect();
        for id in &ids {
            assert!(
                id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{id}"
            );
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), MESSAGE_IDS.len());
    }

    #[test]
    fn the_journal_page_lists_every_message_id() {
        let page = include_str!("../../docs/journal.md");
        for (_, id, what) in MESSAGE_IDS {
            assert!(
                page.contains(&format!("| `{id}` | {what} |")),
                "docs/journal.md lacks the row for {id} ({what})"
            );
        }
        let rows = page
            .lines()
            .filter(|l| l.starts_with("| `") && l.len() > 36);
        let ids: Vec<&str> = rows
            .filter_map(|l| l.get(3..35))
            .filter(|id| id.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect();
        assert_eq!(
            ids.len(),
            MESSAGE_IDS.len(),
            "rows for ids the code lacks: {ids:?}"
        );
    }
}
