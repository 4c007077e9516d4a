//! Events straight into the journal, in its native protocol (systemd.journal-fields(7),
//! <https://systemd.io/JOURNAL_NATIVE_PROTOCOL/>): each event one datagram to journald's
//! socket, its fields as journal fields, so that `journalctl MYJOB_JOB_ID=42` finds one job's
//! lines across every instance.
//!
//! `MESSAGE` is the very text a line on stderr would carry (the message and the event's
//! fields as `key=value`), so `journalctl -u myjob@1` reads as before. Beside it: `PRIORITY`
//! from the level, `SYSLOG_IDENTIFIER=myjob`, `MYJOB_INSTANCE` and `MYJOB_DATABASE`, a
//! `MESSAGE_ID` for the kinds of event operators search for (see [`message_id`]), and every
//! field of the event and of the spans it is in (a job's span: its id, queue, attempt and
//! batch) as `MYJOB_<NAME>`, the innermost value of a name winning.
//!
//! Not `tracing-journald`: it writes on a blocking socket and drops an entry silently when
//! the write fails, and its `MESSAGE` is the message alone. Here the socket does not block:
//! an entry journald cannot take now (its queue full, the entry too big, journald away) is
//! handed to a thread of its own that writes it to stderr as the `<N>`-prefixed line it would
//! have been without this layer, which reaches the journal through the unit's stream. No line
//! is lost, and the thread that logs waits only when [`BACKLOG`] lines already wait for
//! stderr; such a line only lacks its fields.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::fields::{escape, CleanFields};
use super::{database, message_id};

/// Where journald takes native entries.
pub const SOCKET: &str = "/run/systemd/journal/socket";

pub struct JournalLayer {
    socket: UnixDatagram,
    path: PathBuf,
    /// `MYJOB_INSTANCE` on every entry, when the process is an instance.
    instance: Option<String>,
    fields: CleanFields,
    /// Where an entry journald cannot take goes, as a `<N>`-prefixed line: to the thread
    /// that writes them to stderr.
    fallback: SyncSender<Fallback>,
}

thread_local! {
    /// Set on the stderr thread: an event it logged itself (nothing does today) is written
    /// in place, rather than queued behind itself.
    static IN_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Lines that may wait for stderr before a thread that logs one more waits too.
const BACKLOG: usize = 65_536;

/// What the stderr thread is handed.
pub enum Fallback {
    Line(Vec<u8>),
    /// Answer once every line before is written.
    Flush(SyncSender<()>),
}

/// Writes lines to stderr, the unit's stream to journald; an error there has nowhere left to
/// go.
fn to_stderr(line: &[u8]) {
    let _ = std::io::stderr().lock().write_all(line);
}

/// The thread that writes the lines handed to it with `write`, in order.
fn writer(write: impl Fn(&[u8]) + Send + 'static) -> SyncSender<Fallback> {
    let (tx, rx): (SyncSender<Fallback>, Receiver<Fallback>) = sync_channel(BACKLOG);
    let spawned = std::thread::Builder::new()
        .name("myjob-log".into())
        .spawn(move || {
            IN_WRITER.with(|w| w.set(true));
            for item in rx {
                match item {
                    Fallback::Line(line) => write(&line),
                    Fallback::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
    if let Err(e) = spawned {
        // Without the thread, the lines are written by whoever logs them.
        to_stderr(
            format!("<4>log: no thread for lines journald cannot take ({e}): written in place\n")
                .as_bytes(),
        );
    }
    tx
}

/// Waits, at most `limit`, until every line handed to `fallback` so far is written: before
/// the process exits, which would lose them.
pub fn flush(fallback: &SyncSender<Fallback>, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    let (done, wait) = sync_channel(1);
    let mut ask = Fallback::Flush(done);
    // Never a blocking send: a full queue behind a stalled stderr must not hold the exit.
    let asked = loop {
        match fallback.try_send(ask) {
            Ok(()) => break true,
            Err(TrySendError::Disconnected(_)) => return,
            Err(TrySendError::Full(back)) if std::time::Instant::now() < deadline => {
                ask = back;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(TrySendError::Full(_)) => break false,
        }
    };
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if !asked || wait.recv_timeout(left).is_err() {
        to_stderr(b"<4>log: exiting with lines journald could not take still unwritten\n");
    }
}

/// The fields a span was created with, kept in its extensions for the events inside it.
struct SpanFields(Vec<(String, String)>);

impl JournalLayer {
    /// A layer writing to the socket at `path`; `None` when no socket can be made.
    pub fn new(path: &Path, instance: Option<&str>) -> Option<JournalLayer> {
        Self::with_fallback(path, instance, to_stderr)
    }

    fn with_fallback(
        path: &Path,
        instance: Option<&str>,
        write: impl Fn(&[u8]) + Send + 'static,
    ) -> Option<JournalLayer> {
        let socket = UnixDatagram::unbound().ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(JournalLayer {
            socket,
            path: path.to_owned(),
            instance: instance.map(str::to_owned),
            fields: CleanFields::default(),
            fallback: writer(write),
        })
    }

    /// The stderr thread's queue, for [`flush`] at the exit.
    pub fn fallback(&self) -> SyncSender<Fallback> {
        self.fallback.clone()
    }

    fn send(&self, entry: &[u8]) -> std::io::Result<()> {
        self.socket.send_to(entry, &self.path).map(|_| ())
    }
}

impl<S> Layer<S> for JournalLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        attrs.record(&mut Collect(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(SpanFields(fields)) = ext.get_mut::<SpanFields>() {
            let mut new = Vec::new();
            values.record(&mut Collect(&mut new));
            for (name, value) in new {
                match fields.iter_mut().find(|(n, _)| *n == name) {
                    Some(slot) => slot.1 = value,
                    None => fields.push((name, value)),
                }
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let priority = priority(event.metadata().level());
        let mut message = String::new();
        if self
            .fields
            .format_fields(Writer::new(&mut message), event)
            .is_err()
        {
            message.push_str("(a log line that could not be formatted)");
        }
        let mut fields = Vec::new();
        event.record(&mut Collect(&mut fields));
        // The spans from the innermost out: a name the event or an inner span has is skipped.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(SpanFields(own)) = span.extensions().get::<SpanFields>() {
                    for (name, value) in own {
                        if !fields.iter().any(|(n, _)| n == name) {
                            fields.push((name.clone(), value.clone()));
                        }
                    }
                }
            }
        }
        let mut own = Vec::with_capacity(2);
        if let Some(instance) = &self.instance {
            own.push(("MYJOB_INSTANCE", instance.as_str()));
        }
        if let Some(database) = database() {
            own.push(("MYJOB_DATABASE", database));
        }
        let entry = encode(
            priority,
            &message,
            message_id(event.metadata().target()),
            &own,
            &fields,
        );
        if self.send(&entry).is_err() {
            let line = format!("<{priority}>{message}\n").into_bytes();
            if IN_WRITER.with(|w| w.get()) {
                return to_stderr(&line);
            }
            match self.fallback.try_send(Fallback::Line(line)) {
                Ok(()) => {}
                // BACKLOG lines wait already: this thread waits its turn.
                Err(TrySendError::Full(line)) => {
                    let _ = self.fallback.send(line);
                }
                Err(TrySendError::Disconnected(Fallback::Line(line))) => to_stderr(&line),
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }
}

/// The syslog priority of a level (sd-daemon(3)).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One entry in the native protocol: `NAME=value\n` for a one-line value, and for a value
/// with a newline `NAME\n`, its length as 64-bit little-endian, the bytes, `\n`.
pub fn encode(
    priority: u8,
    message: &str,
    message_id: Option<&str>,
    own: &[(&str, &str)],
    fields: &[(String, String)],
) -> Vec<u8> {
    let mut entry = Vec::with_capacity(256 + message.len());
    put(&mut entry, "PRIORITY", &priority.to_string());
    put(&mut entry, "SYSLOG_IDENTIFIER", "myjob");
    put(&mut entry, "MESSAGE", message);
    if let Some(id) = message_id {
        put(&mut entry, "MESSAGE_ID", id);
    }
    for (name, value) in own {
        put(&mut entry, name, value);
    }
    let mut name = String::new();
    for (field, value) in fields {
        name.clear();
        name.push_str("MYJOB_");
        name.extend(field.chars().map(|c| match c {
            'a'..='z' => c.to_ascii_uppercase(),
            'A'..='Z' | '0'..='9' => c,
            _ => '_',
        }));
        // Journal field names are at most 64 characters; a longer one is dropped rather than
        // have journald drop the entry.
        if name.len() <= 64 && !own.iter().any(|(n, _)| *n == name) {
            put(&mut entry, &name, value);
        }
    }
    entry
}

fn put(entry: &mut Vec<u8>, name: &str, value: &str) {
    entry.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        entry.push(b'\n');
        entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        entry.push(b'=');
    }
    entry.extend_from_slice(value.as_bytes());
    entry.push(b'\n');
}

/// Collects fields as text, the message aside: a string as it is, anything else as its
/// `Debug` (a `%value` field's `Display`), each escaped as the message is (see
/// [`escape`]): `journalctl -o verbose` prints them to a terminal.
struct Collect<'a>(&'a mut Vec<(String, String)>);

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() != "message" {
            self.0
                .push((field.name().to_owned(), escape(value).into_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() != "message" {
            let mut text = String::new();
            let _ = write!(text, "{value:?}");
            self.0
                .push((field.name().to_owned(), escape(&text).into_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The fields of one native entry, in order.
    fn decode(mut entry: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while !entry.is_empty() {
            let end = entry.iter().position(|&b| b == b'\n' || b == b'=').unwrap();
            let name = String::from_utf8(entry[..end].to_vec()).unwrap();
            let value;
            if entry[end] == b'=' {
                let nl = entry[end..].iter().position(|&b| b == b'\n').unwrap() + end;
                value = entry[end + 1..nl].to_vec();
                entry = &entry[nl + 1..];
            } else {
                let len = u64::from_le_bytes(entry[end + 1..end + 9].try_into().unwrap()) as usize;
                value = entry[end + 9..end + 9 + len].to_vec();
                assert_eq!(entry[end + 9 + len], b'\n');
                entry = &entry[end + 10 + len..];
            }
            out.push((name, String::from_utf8(value).unwrap()));
        }
        out
    }

    fn field<'a>(entry: &'a [(String, String)], name: &str) -> Option<&'a str> {
        entry
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_multi_line_value_is_length_encoded() {
        let entry = encode(
            3,
            "one\ntwo",
            None,
            &[("MYJOB_INSTANCE", "7")],
            &[("job_id".into(), "42".into())],
        );
        let fields = decode(&entry);
        assert_eq!(field(&fields, "MESSAGE"), Some("one\ntwo"));
        assert_eq!(field(&fields, "PRIORITY"), Some("3"));
        assert_eq!(field(&fields, "MYJOB_INSTANCE"), Some("7"));
        assert_eq!(field(&fields, "MYJOB_JOB_ID"), Some("42"));
    }

    /// A receiving socket standing in for journald's, in a directory of the test's own.
    fn journald() -> (tempfile::TempDir, PathBuf, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (dir, path, rx)
    }

    fn received(rx: &UnixDatagram) -> Vec<(String, String)> {
        let mut buf = vec![0u8; 65536];
        let n = rx.recv(&mut buf).unwrap();
        decode(&buf[..n])
    }

    #[test]
    fn an_events_fields_and_its_spans_become_journal_fields() {
        let (_dir, path, rx) = journald();
        let layer = JournalLayer::new(&path, Some("3")).unwrap();
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let job = tracing::info_span!("job", job_id = 42u64, queue = "sms", attempt = 1u32);
            job.in_scope(|| {
                tracing::warn!(target: "myjob::msg::failed", job_id = 42u64, attempt = 2u32, stream = "stderr", "job failed: {}", "boom")
            });
            tracing::info!("ready");
        });
        let got = received(&rx);
        assert_eq!(
            field(&got, "MESSAGE"),
            Some(r#"job failed: boom job_id=42 attempt=2 stream="stderr""#),
            "{got:?}"
        );
        assert_eq!(field(&got, "PRIORITY"), Some("4"));
        assert_eq!(field(&got, "SYSLOG_IDENTIFIER"), Some("myjob"));
        assert_eq!(field(&got, "MESSAGE_ID"), message_id("myjob::msg::failed"));
        assert_eq!(field(&got, "MYJOB_INSTANCE"), Some("3"));
        assert_eq!(field(&got, "MYJOB_JOB_ID"), Some("42"));
        assert_eq!(field(&got, "MYJOB_QUEUE"), Some("sms"));
        assert_eq!(field(&got, "MYJOB_STREAM"), Some("stderr"));
        // The event's own value wins over its span's, and each name comes once.
        assert_eq!(field(&got, "MYJOB_ATTEMPT"), Some("2"));
        assert_eq!(got.iter().filter(|(n, _)| n == "MYJOB_JOB_ID").count(), 1);
        let ready = received(&rx);
        assert_eq!(field(&ready, "MESSAGE"), Some("ready"));
        assert_eq!(field(&ready, "PRIORITY"), Some("6"));
        assert_eq!(field(&ready, "MESSAGE_ID"), None);
        assert_eq!(field(&ready, "MYJOB_JOB_ID"), None);
    }

    #[test]
    fn an_entry_journald_cannot_take_is_written_as_a_stream_line() {
        let dir = tempfile::tempdir().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = lines.clone();
        let layer = JournalLayer::with_fallback(&dir.path().join("none"), Some("1"), move |l| {
            sink.lock().unwrap().extend_from_slice(l)
        })
        .unwrap();
        let fallback = layer.fallback();
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(job_id = 4u64, "job failed: {}", "no journal")
        });
        flush(&fallback, Duration::from_secs(5));
        assert_eq!(
            String::from_utf8_lossy(&lines.lock().unwrap()),
            "<3>job failed: no journal job_id=4\n"
        );
    }

    #[test]
    fn a_value_with_a_newline_neither_forges_an_entry_nor_a_stream_line() {
        let forged = "db\n<0>FORGED\r\x1b[2J";
        // Natively: MESSAGE and the fields are one line each, the controls escaped.
        let (_dir, path, rx) = journald();
        let layer = JournalLayer::new(&path, None).unwrap();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::warn!(owner = forged, "reaper: its server {forged} is gone")
        });
        let got = received(&rx);
        let message = field(&got, "MESSAGE").unwrap();
        assert_eq!(
            message,
            // tracing-subscriber writes an ESC in the message as `\x1b` itself.
            r#"reaper: its server db\n<0>FORGED\r\x1b[2J is gone owner="db\n<0>FORGED\r\u{1b}[2J""#
        );
        assert!(!field(&got, "MYJOB_OWNER")
            .unwrap()
            .contains(['\n', '\r', '\x1b']));
        // Through the fallback to stderr: one `<4>` line.
        let dir = tempfile::tempdir().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = lines.clone();
        let layer = JournalLayer::with_fallback(&dir.path().join("none"), None, move |l| {
            sink.lock().unwrap().extend_from_slice(l)
        })
        .unwrap();
        let fallback = layer.fallback();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::warn!("reaper: its server {forged} is gone")
        });
        flush(&fallback, Duration::from_secs(5));
        let text = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(
            text.starts_with("<4>") && !text.contains(['\r', '\x1b']),
            "{text:?}"
        );
    }

    #[test]
    fn a_full_journal_does_not_block_the_sender() {
        let (_dir, path, _rx) = journald();
        let layer = JournalLayer::new(&path, None).unwrap();
        let entry = vec![b'x'; 60_000];
        // Nobody reads: the queue fills, and then each send fails at once.
        let began = std::time::Instant::now();
        let failed = (0..10_000).find(|_| layer.send(&entry).is_err());
        assert!(failed.is_some(), "the receiver's queue never filled");
        assert!(began.elapsed() < Duration::from_secs(5));
    }
}
