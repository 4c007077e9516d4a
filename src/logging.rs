//! Log output. Under systemd (stderr is the journal stream) each line starts with a `<N>`
//! syslog priority and carries no timestamp of its own, so `journalctl -p warning` works;
//! on a terminal lines are human-readable with timestamps. `MYJOB_LOG` sets the filter
//! (`info` by default; e.g. `MYJOB_LOG=debug`).

use std::fmt;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Call once, first thing.
pub fn init() {
    let filter = EnvFilter::try_from_env("MYJOB_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    if stderr_is_journal() {
        builder
            .with_ansi(false)
            .event_format(Journal(
                Format::default()
                    .without_time()
                    .with_target(false)
                    .with_level(false),
            ))
            .init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
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

/// The default format behind a `<N>` priority prefix (sd-daemon(3)).
struct Journal<F>(F);

impl<S, N, F> FormatEvent<S, N> for Journal<F>
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
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}
