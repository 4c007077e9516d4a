//! The stop path: no new claims, running handlers given `shutdown_timeout`, every outcome
//! written (see `daemon` for the stop order).

use super::*;

/// After a shutdown, how long myjob keeps trying to write the last outcomes.
const FINAL_WRITE: Duration = Duration::from_secs(10);

impl Consumer {
    /// The stop path: no new claims; running handlers get `timeout` to finish, then are
    /// killed and their jobs released without using up an attempt; persistent processes get
    /// EOF on stdin once their job is answered, and the same `timeout` to exit; every outcome
    /// is written, with a few more seconds of reconnecting if the database is away.
    pub(super) async fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.slots.stop_processes();
        if !self.slots.is_empty() {
            info!(
                running = self.slots.len(),
                "draining: waiting up to {} for running handlers",
                humantime::format_duration(timeout)
            );
        }
        let mut aborted = false;
        while !self.slots.is_empty() || self.slots.processes_leaving() {
            self.counters.beat();
            // The link is tended as in the main loop, a drop noticed within a second and the
            // claims re-owned on a new connection: a deploy is when a server or a proxy is
            // also restarted, and a claim whose connection is gone would be put back by
            // another instance's reaper and run again beside the handler still running here.
            let wake = self.link.deadline().min(self.next_cancel_check);
            tokio::select! {
                f = self.slots.next_in_drain() => if let Some(f) = f { self.finished(f) },
                _ = sleep_until(deadline), if !aborted => {
                    warn!(running = self.slots.len(), "shutdown_timeout passed: killing the handlers still running");
                    self.slots.abort();
                    aborted = true;
                }
                _ = sleep_until(wake) => {}
            }
            if Instant::now() >= self.next_cancel_check {
                self.next_cancel_check = Instant::now() + CANCEL_CHECK;
                self.check_cancelled().await;
            }
            self.link.keepalive().await;
            self.write_or_reconnect().await;
            self.fence_if_silent();
        }
        let give_up = Instant::now() + FINAL_WRITE;
        self.release_unread().await;
        while !(self.outbox.is_empty() && self.unread.is_empty()) && Instant::now() < give_up {
            // The reconnect when the link is down; the pause after a lost race when it is up.
            let next = match self.link.is_up() {
                true => self.outbox.deadline(),
                false => Some(self.link.deadline()),
            };
            if let Some(t) = next {
                sleep_until(t.min(give_up)).await;
            }
            self.write_or_reconnect().await;
            self.release_unread().await;
        }
        if !(self.outbox.is_empty() && self.unread.is_empty()) {
            error!(
                jobs = self.outbox.len(),
                unread_batches = self.unread.len(),
                "cannot write the last outcomes; the reaper will put these jobs back"
            );
        }
        self.link.close().await;
    }

    /// The stop path's part of [`Consumer::read_unread`]: batches claimed whose read-back
    /// failed are read once the link is back, and their jobs released at once, rather than
    /// left claimed for the reaper (which would count them as a dead worker's).
    pub(super) async fn release_unread(&mut self) {
        if self.unread.is_empty() {
            return;
        }
        let settings = self.settings.borrow().clone();
        self.read_unread(&settings).await;
        self.release_prefetched(
            "job released: claimed before the connection broke, and the shutdown came first",
        );
    }

    /// Every prefetched job back to pending at the shutdown, its attempt given back, each
    /// logged with `why`.
    pub(super) fn release_prefetched(&mut self, why: &str) {
        for r in self.prefetch.take_all() {
            let span = r.span();
            span.in_scope(|| info!(job_id = r.job.id.get(), "{why}"));
            self.outbox.release(r.job.id, r.batch_id, span);
        }
    }
}
