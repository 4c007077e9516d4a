//! The quarantine slot and the claim of a suspect into it.

use super::*;
use crate::store::jobs::BatchId;

/// The quarantine slot: at most one suspect runs in an instance at a time (a suspect is a job
/// that was held at two deaths of its workers), so that if this instance dies, the reaper
/// knows which job to charge (see [`jobs::claim_suspect`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Quarantine {
    /// No suspect held, and none known of.
    #[default]
    Empty,
    /// The slot is free, and the last probe found a suspect in `queue`: claimed from whenever
    /// a handler slot is free too, until a claim there comes back empty, so that suspects
    /// follow each other without waiting for a poll.
    Found { queue: String },
    /// The suspect of `batch` is held (prefetched, running, or its outcome not yet written:
    /// until then the row still says claimed, and a death would charge it). `then`: the
    /// queue to claim the next suspect from once it is released.
    Holding {
        batch: BatchId,
        then: Option<String>,
    },
}

impl Quarantine {
    /// What the probe saw: a suspect in `queue`, or none. Asked only while the slot is free;
    /// while it holds one, the probe asks for none, and the queue to go on with is forgotten.
    pub(super) fn seen(&mut self, queue: Option<String>) {
        match self {
            Quarantine::Holding { then, .. } => *then = queue,
            _ => *self = queue.map_or(Quarantine::Empty, |queue| Quarantine::Found { queue }),
        }
    }

    /// The suspect's batch is no longer held: the slot is free, for the queue it came from.
    pub(super) fn released(&mut self) {
        if let Quarantine::Holding { then, .. } = self {
            *self = then
                .take()
                .map_or(Quarantine::Empty, |queue| Quarantine::Found { queue });
        }
    }

    /// The queue to claim from has no suspect left, or its claim failed: the next probe looks
    /// again.
    pub(super) fn forget_queue(&mut self) {
        match self {
            Quarantine::Holding { then, .. } => *then = None,
            _ => *self = Quarantine::Empty,
        }
    }

    /// Whether `batch` is the suspect's.
    pub(super) fn holds(&self, batch: BatchId) -> bool {
        matches!(self, Quarantine::Holding { batch: b, .. } if *b == batch)
    }

    /// Whether there is a queue to claim a suspect from now.
    pub(super) fn is_found(&self) -> bool {
        matches!(self, Quarantine::Found { .. })
    }
}

impl Consumer {
    /// Whether the quarantine slot is free: its suspect, if any, is no longer running, waiting
    /// or waiting for its outcome to be written. Until the outcome is written the row still
    /// says claimed, and a death would charge it.
    pub(super) fn quarantine_free(&mut self) -> bool {
        let Quarantine::Holding { batch, .. } = self.quarantine else {
            return true;
        };
        let held = self
            .slots
            .batches()
            .chain(self.prefetch.batches())
            .chain(self.outbox.batches())
            .chain(self.unread.iter().copied())
            .any(|b| b == batch);
        if !held {
            self.quarantine.released();
        }
        !held
    }

    /// Claims one suspect of the queue the probe found one in, under a batch of its own, into
    /// the quarantine slot; with none left there, that queue is done with until the next
    /// probe finds another.
    pub(super) async fn claim_suspect(&mut self, settings: &Settings) -> anyhow::Result<()> {
        let Quarantine::Found { queue } = &self.quarantine else {
            return Ok(());
        };
        let queue = queue.clone();
        let limit = self.link.limit();
        let Some((conn, server)) = self.link.claimer() else {
            return Ok(());
        };
        if settings.queue(&queue).is_none() {
            self.quarantine.forget_queue();
            return Ok(());
        }
        let batch_id = jobs::BatchId::random();
        let who = Claimer {
            owner_server: server,
            worker: &self.worker,
        };
        if !self
            .metrics
            .within(
                Op::Claim,
                limit,
                jobs::claim_suspect(conn, batch_id, &queue, &who),
            )
            .await?
        {
            self.link.used();
            self.quarantine.forget_queue();
            return Ok(());
        }
        // Claimed: the quarantine slot is its from now, read back or not.
        self.quarantine = Quarantine::Holding {
            batch: batch_id,
            then: Some(queue),
        };
        let max = settings.worker.max_payload_bytes;
        let read = read_back(&self.metrics, conn, limit, batch_id, max, &mut self.unread);
        let claimed = read.await?;
        self.link.succeeded();
        self.take(settings, batch_id, claimed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Quarantine;
    use crate::store::jobs::BatchId;

    fn found(queue: &str) -> Quarantine {
        Quarantine::Found {
            queue: queue.into(),
        }
    }

    #[test]
    fn a_suspect_found_is_claimed_then_held_until_released() {
        let mut q = Quarantine::default();
        q.seen(None);
        assert_eq!(q, Quarantine::Empty);
        q.seen(Some("mail".into()));
        assert!(q.is_found());
        q = Quarantine::Holding {
            batch: BatchId::new(7),
            then: Some("mail".into()),
        };
        assert!(q.holds(BatchId::new(7)) && !q.holds(BatchId::new(8)) && !q.is_found());
        // Released: the queue it came from is claimed from again at once.
        q.released();
        assert_eq!(q, found("mail"));
    }

    #[test]
    fn a_probe_while_holding_forgets_the_queue_to_go_on_with() {
        let mut q = Quarantine::Holding {
            batch: BatchId::new(7),
            then: Some("mail".into()),
        };
        q.seen(None);
        assert!(q.holds(BatchId::new(7)));
        q.released();
        assert_eq!(q, Quarantine::Empty);
    }

    #[test]
    fn an_empty_or_failed_claim_leaves_it_to_the_next_probe() {
        let mut q = found("mail");
        q.forget_queue();
        assert_eq!(q, Quarantine::Empty);
        let mut q = Quarantine::Holding {
            batch: BatchId::new(7),
            then: Some("mail".into()),
        };
        q.forget_queue();
        assert!(q.holds(BatchId::new(7)));
        q.released();
        assert_eq!(q, Quarantine::Empty);
        // Released twice, or with nothing held: nothing changes.
        q.released();
        assert_eq!(q, Quarantine::Empty);
    }
}
