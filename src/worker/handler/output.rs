//! A handler's output in the log: read line by line, each line tagged with the job it belongs
//! to, at most [`MAX_LINES`] per stream per job, and the last bytes kept for `last_error`.
//!
//! A per-job handler's stream belongs to one job for its whole life. A persistent process's
//! stderr belongs to whichever job is in progress, or to none between jobs: the [`Tag`] is
//! what the reader asks for each line, and what a job's start and end move on.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::{info, Span};

use crate::store::jobs::JobId;

/// The most bytes of one output line that are logged; a longer line is split.
const MAX_LINE: usize = 4096;
/// The most lines of one stream of one job that are logged; the rest is read and counted, so
/// a handler that writes without end cannot flood the journal or block on a full pipe.
const MAX_LINES: u64 = 1000;
/// How much of the end of a stream is kept for `last_error`.
const TAIL: usize = 2000;

/// Whose lines a stream carries now, how many of them were logged, and their last bytes.
pub struct Tag {
    /// The handler process, for lines that belong to no job.
    pid: u32,
    stream: &'static str,
    state: Mutex<TagState>,
}

/// The job in progress and what its lines left; one lock, so that a line is never logged
/// with one job's id and another's span.
struct TagState {
    /// The job in progress; none between the jobs of a persistent process.
    job_id: Option<JobId>,
    /// Its span (its fields in the journal); none between jobs.
    span: Span,
    lines: u64,
    tail: Vec<u8>,
}

impl TagState {
    fn new(job_id: Option<JobId>, span: Span) -> TagState {
        TagState {
            job_id,
            span,
            lines: 0,
            tail: Vec::new(),
        }
    }
}

impl Tag {
    pub fn new(job_id: Option<JobId>, span: Span, pid: u32, stream: &'static str) -> Arc<Tag> {
        Arc::new(Tag {
            pid,
            stream,
            state: Mutex::new(TagState::new(job_id, span)),
        })
    }

    /// From now on, lines belong to `job_id`, counted and kept afresh. Until then they
    /// belonged to the job before: a line a process writes just before its answer may be read
    /// just after it.
    pub fn start(&self, job_id: JobId, span: Span) {
        self.take(Some(job_id), span);
    }

    /// The job's lines are over: logs how many were not logged, and returns the stream's last
    /// bytes as one line (for `last_error`). Later lines belong to no job.
    pub fn finish(&self) -> String {
        let mut tail = self.take(None, Span::none());
        if tail.len() > TAIL {
            tail.drain(..tail.len() - TAIL);
        }
        // Its lines joined with " | ": last_error is also logged, and must stay one line.
        String::from_utf8_lossy(&tail)
            .lines()
            .map(|l| clean(l.trim().as_bytes()))
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// Hands the stream over to `next`; returns what the job before kept.
    fn take(&self, next: Option<JobId>, span: Span) -> Vec<u8> {
        let state = std::mem::replace(&mut *self.lock(), TagState::new(next, span));
        if state.lines > MAX_LINES {
            state.span.in_scope(|| {
                info!(
                    job_id = state.job_id.map(JobId::get),
                    stream = self.stream,
                    "{} more lines not logged",
                    state.lines - MAX_LINES
                )
            });
        }
        state.tail
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TagState> {
        // A poisoned lock only means a logging call panicked; the counts are still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, bytes: &[u8]) {
        let mut state = self.lock();
        state.tail.extend_from_slice(bytes);
        if state.tail.len() > 2 * TAIL {
            let cut = state.tail.len() - TAIL;
            state.tail.drain(..cut);
        }
    }

    fn emit(&self, line: &[u8]) {
        let (job_id, span) = {
            let mut state = self.lock();
            state.lines += 1;
            if state.lines > MAX_LINES {
                return;
            }
            (state.job_id, state.span.clone())
        };
        let stream = self.stream;
        span.in_scope(|| match job_id {
            None => info!(pid = self.pid, stream, "{}", clean(line)),
            Some(job_id) => info!(job_id = job_id.get(), stream, "{}", clean(line)),
        });
    }
}

/// Logs `stream` line by line under `tag` until it ends.
pub async fn pump(mut stream: impl AsyncRead + Unpin, tag: Arc<Tag>) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tag.keep(&chunk[..n]);
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        while let Some(pos) = buf[start..].iter().position(|&b| b == b'\n') {
            tag.emit(&buf[start..start + pos]);
            start += pos + 1;
        }
        buf.drain(..start);
        while buf.len() >= MAX_LINE {
            let rest = buf.split_off(MAX_LINE);
            tag.emit(&buf);
            buf = rest;
        }
    }
    if !buf.is_empty() {
        tag.emit(&buf);
    }
}

/// Text safe for a log line: invalid UTF-8 and control characters (a NUL, an escape sequence,
/// a carriage return) become U+FFFD.
pub fn clean(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_keeps_text_and_replaces_what_would_break_a_log_line() {
        assert_eq!(clean(b"ok\ttab"), "ok\ttab");
        assert_eq!(clean(b"a\0b\x1b[31m\r"), "a\u{FFFD}b\u{FFFD}[31m\u{FFFD}");
        assert_eq!(clean(&[0x66, 0xff, 0x6f]), "f\u{FFFD}o");
    }

    #[tokio::test]
    async fn a_tag_keeps_each_jobs_tail_apart() {
        let tag = Tag::new(None, Span::none(), 1, "stderr");
        tag.start(JobId::new(7), Span::none());
        pump(&b"first\nsecond\n"[..], tag.clone()).await;
        assert_eq!(tag.finish(), "first | second");
        tag.start(JobId::new(8), Span::none());
        pump(&b"third"[..], tag.clone()).await;
        assert_eq!(tag.finish(), "third", "job 8 sees none of job 7's lines");
        assert_eq!(tag.finish(), "", "nothing since");
    }
}
