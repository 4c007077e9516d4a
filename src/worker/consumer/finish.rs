//! How running jobs end: a handler's outcome logged and kept in the outbox, the outbox written
//! and the slots it freed handed on, and the jobs an operator cancelled stopped.

use super::*;

/// While jobs run, how often the consumer asks whether an operator cancelled one. The
/// question stands in for the keepalive's ping, so it costs a query only under load.
pub(super) const CANCEL_CHECK: Duration = Duration::from_secs(1);

impl Consumer {
    /// A handler ended: log its outcome and keep it for the next write.
    pub(super) fn finished(&mut self, f: Finished) {
        self.prefetch.completed();
        // Whatever it ended with, a job stopped at a reconnect is no longer awaited.
        let lost = match self.lost.iter().position(|&id| id == f.completion.job_id) {
            Some(i) => {
                self.lost.swap_remove(i);
                true
            }
            None => false,
        };
        self.counters.running.store(self.slots.len(), Relaxed);
        let (job_id, attempt) = (f.completion.job_id.get(), f.attempt);
        // Counted by outcome once written (see `Outbox`): a fenced write that matches no row
        // is a lost attempt, whatever its handler said.
        let ended = match &f.completion.outcome {
            Outcome::Done => metrics::Outcome::Done,
            Outcome::Retry { .. } => metrics::Outcome::Retried,
            Outcome::Fail { .. } => metrics::Outcome::Failed,
            Outcome::Release => metrics::Outcome::Released,
            Outcome::Cancelled => metrics::Outcome::Cancelled,
        };
        let queue = self.metrics.queue(&f.queue);
        if let Some(ran_for) = f.ran_for {
            queue.ran(ran_for);
        }
        self.metrics.handlers.busy.set(self.slots.len() as i64);
        let _in_job = f.span.enter();
        match &f.completion.outcome {
            _ if lost => info!(
                job_id,
                attempt, "job's handler ended: its claim had been put back"
            ),
            Outcome::Done => {
                self.counters.done.fetch_add(1, Relaxed);
                info!(job_id, attempt, "job done");
            }
            Outcome::Retry { delay, error } => {
                self.counters.retried.fetch_add(1, Relaxed);
                // To the millisecond: "8s 731ms", not "8s 730ms 944us 851ns".
                let retry_in = Duration::from_millis(delay.as_millis() as u64);
                warn!(job_id, attempt, retry_in = %humantime::format_duration(retry_in), "job failed, will retry: {}", jobs::fit_error(error));
            }
            Outcome::Fail { error } => {
                self.counters.failed.fetch_add(1, Relaxed);
                error!(target: "myjob::msg::failed", job_id, attempt, "job failed: {}", jobs::fit_error(error));
            }
            Outcome::Release => info!(
                job_id,
                attempt, "job released: cut short by the shutdown, the attempt does not count"
            ),
            Outcome::Cancelled => info!(job_id, attempt, "job cancelled: its handler was stopped"),
        }
        drop(_in_job);
        self.outbox.push(f.completion, Some((queue, ended)), f.span);
    }

    /// Writes the outbox; on an error the outcomes stay for the next write.
    pub(super) async fn write(&mut self) {
        // Nothing to write is not a statement that succeeded: the keepalive still pings.
        if self.outbox.is_empty() {
            return;
        }
        let limit = self.link.limit();
        let Some(conn) = self.link.conn() else {
            return;
        };
        match self
            .metrics
            .within(Op::Outcomes, limit, self.outbox.write(conn))
            .await
        {
            Ok(()) => self.link.wrote(),
            Err(e) => return self.db_error(e).await,
        }
        self.hand_on().await;
    }

    /// Hands the slots the written outcomes gave up on to their keys' next blocked jobs (see
    /// [`handoff`]), and claims from the queues that got one at the next turn. A hand-off
    /// that fails is left to the gate, which admits the job within a poll.
    pub(super) async fn hand_on(&mut self) {
        let freed = self.outbox.take_freed();
        if freed.is_empty() {
            return;
        }
        let settings = self.settings.borrow().clone();
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return;
        };
        let referee = ServerId::parse(server).map_or(Referee::Index, |s| Referee::of(&s));
        let handed = handoff::hand_on(conn, referee, &settings, &freed);
        match self.metrics.within(Op::HandOff, limit, handed).await {
            Ok(queues) => {
                for queue in queues {
                    let held = self.rate_wait.iter().any(|(q, _)| *q == queue)
                        || self.paused.contains(&queue);
                    if !held && !self.busy.contains(&queue) {
                        self.busy.push(queue);
                    }
                }
            }
            Err(e) => {
                debug!(
                    "consumer: handing slots on: {}; the gate admits their next jobs",
                    chain(&*e)
                );
                if !db::classify(&e).keeps_connection() {
                    self.link.lost(&e);
                }
            }
        }
    }

    /// While jobs run or wait to start: asks which of them an operator cancelled, stops the
    /// handlers of those running, and drops those waiting. It stands in for the keepalive.
    pub(super) async fn check_cancelled(&mut self) {
        if self.slots.is_empty() && self.prefetch.is_empty() {
            return;
        }
        let limit = self.link.limit();
        let Some(conn) = self.link.conn() else {
            return;
        };
        let mut batches: Vec<BatchId> = self
            .slots
            .batches()
            .chain(self.prefetch.batches())
            .collect();
        batches.sort_unstable();
        batches.dedup();
        match self
            .metrics
            .within(Op::Cancelled, limit, jobs::cancelled(conn, &batches))
            .await
        {
            Ok(ids) => {
                self.link.succeeded();
                if ids.is_empty() {
                    return;
                }
                self.slots.cancel(&ids);
                for r in self.prefetch.drop_jobs(&ids) {
                    r.span().in_scope(|| {
                        info!(job_id = r.job.id.get(), "job cancelled before its start")
                    });
                    // Said as for a handler stopped: the row's owner is cleared, which frees
                    // its concurrency-key slot, handed on once written.
                    let seen = Completion {
                        job_id: r.job.id,
                        batch_id: r.batch_id,
                        outcome: Outcome::Cancelled,
                        slot: r.job.slot.clone(),
                    };
                    self.outbox.push(seen, None, r.span());
                }
            }
            Err(e) => self.db_error(e).await,
        }
    }

    /// Writes the outbox, connecting first if the link is down and an attempt is due.
    pub(super) async fn write_or_reconnect(&mut self) {
        self.reconnect_if_due().await;
        self.write().await;
    }
}
