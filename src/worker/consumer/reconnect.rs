//! The consumer's side of a lost connection: the fence that stops its handlers when the
//! database is silent too long, the reconnect that adopts its claims first, and the read-back
//! of batches whose claim committed as the connection broke.

use super::*;

impl Consumer {
    /// The database has not answered for the link's fence (a partition, a host cut off, a
    /// server down for long): every running handler is killed at once and its job released,
    /// as are the jobs claimed ahead. The server drops a connection it has not heard from
    /// for the session's `wait_timeout`, longer than this, and the reaper then puts the
    /// claims back for another worker: a handler still running here would run beside its
    /// job's next run. When the server is up and turns the reconnects down, the fence is
    /// shorter (see [`Link::refused_fence`]). The releases wait for the connection; fenced by
    /// batch_id, they change nothing once the reaper was first.
    pub(super) fn fence_if_silent(&mut self) {
        if self.slots.is_empty() && self.prefetch.is_empty() {
            return;
        }
        let interval = self.settings.borrow().reaper.interval;
        let fence = self
            .link
            .refused_fence(interval)
            .unwrap_or(self.link.fence());
        let silent = self.link.silent_for();
        if silent < fence {
            return;
        }
        let ahead = self.prefetch.take_all();
        error!(
            running = self.slots.len(),
            claimed_ahead = ahead.len(),
            "consumer: no answer from the database for {}s: killing the running handlers and releasing their jobs, which the server will soon hand to another worker",
            silent.as_secs()
        );
        self.slots.fence();
        for r in ahead {
            self.outbox.release(r.job.id, r.batch_id, r.span());
        }
    }

    /// When the link is down and its backoff has passed, one attempt to connect. A new
    /// connection first adopts the claims this instance still holds, so the reaper does not
    /// take them from running handlers.
    pub(super) async fn reconnect_if_due(&mut self) {
        if self.link.is_up() {
            return;
        }
        self.counters.beat();
        let stale_after = self.settings.borrow().reaper.stale_after;
        let Some(mut fresh) = self.link.connect_if_due(stale_after).await else {
            return;
        };
        let limit = self.link.limit();
        let metrics = self.metrics.clone();
        match metrics
            .within(Op::Adopt, limit, self.adopt(&mut fresh))
            .await
        {
            Ok(adopted) => self.link.install(fresh, adopted),
            Err(e) => self.link.failed(&e.context("setting up the connection")),
        }
    }

    /// Re-owns this instance's claims on a new connection, and lets go of those the reaper
    /// took while the connection was away: they are someone else's now. A prefetched job is
    /// dropped; a running one has its handler's process group killed at once (the job may
    /// already run elsewhere: no grace), so that it does not run beside the job's next run. (Its outcome is still written, fenced by batch_id: it
    /// changes nothing of a claim that is gone.) On a Galera node these statements wait for
    /// the cluster, so that a put-back committed through another node is seen.
    pub(super) async fn adopt(&mut self, fresh: &mut Fresh) -> anyhow::Result<u64> {
        let mut batches: Vec<BatchId> = self
            .slots
            .batches()
            .chain(self.prefetch.batches())
            .chain(self.outbox.batches())
            .chain(self.unread.iter().copied())
            .collect();
        batches.sort_unstable();
        batches.dedup();
        let galera = db::causal(&mut fresh.conn, db::Causal::Everything).await?;
        let adopted = jobs::adopt(&mut fresh.conn, &batches, &fresh.server).await?;
        let running = self.slots.claims();
        let mut claims = self.prefetch.claims();
        claims.extend_from_slice(&running);
        let held = jobs::still_claimed(&mut fresh.conn, &claims).await?;
        if galera {
            db::causal_off(&mut fresh.conn).await?;
        }
        for r in self.prefetch.keep_only(&held) {
            r.span().in_scope(|| {
                warn!(
                    job_id = r.job.id.get(),
                    "job dropped before its start: its claim was put back while the connection was away"
                )
            });
        }
        let gone: Vec<JobId> = running
            .iter()
            .map(|c| c.job_id)
            .filter(|id| !held.contains(id))
            .collect();
        for &job_id in &gone {
            self.slots.span_of(job_id).in_scope(|| {
                warn!(
                    job_id = job_id.get(),
                    "job's handler stopped: its claim was put back while the connection was away, for another worker to run"
                )
            });
        }
        self.slots.kill(&gone);
        self.lost.extend(gone);
        Ok(adopted)
    }

    /// Reads back the batches whose read-back failed (see `unread`), once the link is up
    /// again and has re-owned them: their jobs run as if the claim had just been made.
    pub(super) async fn read_unread(&mut self, settings: &Settings) {
        while let Some(&batch_id) = self.unread.first() {
            let limit = self.link.limit();
            let Some(conn) = self.link.conn() else {
                return;
            };
            match self
                .metrics
                .within(
                    Op::ReadBatch,
                    limit,
                    jobs::read_batch(conn, batch_id, settings.worker.max_payload_bytes),
                )
                .await
            {
                Ok(claimed) => {
                    self.link.succeeded();
                    self.unread.remove(0);
                    // A claim that broke before it committed reads back empty.
                    if !claimed.is_empty() {
                        info!(
                            batch_id = batch_id.get(),
                            jobs = claimed.len(),
                            "consumer: read back the batch claimed before the connection broke"
                        );
                    }
                    self.take(settings, batch_id, claimed);
                }
                Err(e) => return self.db_error(e).await,
            }
        }
    }

    /// A statement failed: what comes next depends on what the error says of the connection.
    /// A lost race (a deadlock, a Galera certification conflict, a lock wait timeout) or a
    /// statement the server refuses keeps the connection: the loop goes on, and the outbox
    /// writes again after a short random pause (a claim is tried again at its next turn).
    /// Anything else drops the connection.
    pub(super) async fn db_error(&mut self, e: anyhow::Error) {
        if !db::classify(&e).keeps_connection() {
            self.link.lost(&e);
            return;
        }
        warn!(
            "consumer: {}; trying again on the same connection",
            chain(&*e)
        );
        // A deadlock has rolled the transaction back, a lock wait timeout only the statement.
        let limit = self.link.limit();
        if let Some(conn) = self.link.conn() {
            let rollback = async {
                conn.query_drop("ROLLBACK")
                    .await
                    .map_err(|e| anyhow::anyhow!(db::describe(&e)))
            };
            if let Err(e) = self.metrics.within(Op::Rollback, limit, rollback).await {
                self.link.lost(&e);
                return;
            }
        }
        self.outbox.lost_race();
    }
}
