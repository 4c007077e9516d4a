//! Every statement myjob sends about `myjob_jobs`, and nothing else, a file per caller: the
//! consumer's claim in `claim` (and a Galera lane's in `head`), its outcomes in `outcome`, the
//! reaper's and a reconnected worker's in `rescue`, the stager's in `stage`, a producer's in
//! `enqueue`, concurrency keys' in [`keys`], the operator commands' in [`admin`], the deletion
//! of finished jobs in [`purge`]. Values are always bound as parameters; only the number of
//! `?` in an `IN (…)` list varies.
//!
//! Every write about a claimed job is fenced by its `batch_id`: the reaper clears `batch_id`
//! when it puts a job back, and a new claim stamps a new one, so a late write from the old
//! owner matches no row and changes nothing.

use mysql_async::Value;

pub use claim::{claim, claim_suspect, probe, read_batch, Probe, CLAIM};
pub use enqueue::{enqueue, Enqueued, NewJob};
pub use head::{Lane, HELP_AFTER, STEAL_AFTER};
pub use ids::{BatchId, JobId};
pub use keys::KeySlot;
pub use outcome::{
    cancelled, fit_error, still_claimed, write_outcomes, Claim, Completion, Outcome, Unwritten,
};
pub use rescue::{
    adopt, claims_of, forget_cancel, held, rescue, ClaimCursor, Held, HeldPage, OldClaim, Rescued,
};
pub use stage::{stage, Staged};

pub mod admin;
mod claim;
mod enqueue;
mod head;
mod ids;
pub mod keys;
mod outcome;
pub mod purge;
mod rescue;
mod stage;
pub mod undated;

/// A claimed job's payload, as the read-back left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Loaded(Vec<u8>),
    /// Larger than the worker's `max_payload_bytes`: its length, its bytes left unread.
    TooBig(u64),
}

/// A job as the claim hands it out.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: JobId,
    pub queue: String,
    pub payload: Payload,
    /// This attempt's number, counting from 1 (the claim adds one to `attempts`).
    pub attempt: u32,
    /// The job's own limit; NULL means the queue's.
    pub max_attempts: Option<u32>,
    /// From due (run_at) to the claim, by the database's clock: the metrics' wait.
    pub due_to_claim: std::time::Duration,
    /// When the batch was read back, by this host's clock: the rest of the wait is from here.
    pub read_at: tokio::time::Instant,
    /// The slot of its concurrency key it holds, if it has a key.
    pub slot: Option<KeySlot>,
}

/// Who claims: written into the claimed rows for the reaper and for people reading the table.
pub struct Claimer<'a> {
    pub owner_server: &'a str,
    pub worker: &'a str,
}

/// `?, ?, …` for `n` values, with `n` rounded up to a power of two (the list is padded by
/// repeating its last value, which changes nothing in an `IN`). A few sizes of statement stay
/// in the driver's prepared-statement cache instead of one per batch length.
pub(crate) fn in_list<T: Clone + Into<Value>>(values: &[T]) -> (String, Vec<Value>) {
    let n = values.len().max(1).next_power_of_two();
    let mut bound: Vec<Value> = values.iter().cloned().map(Into::into).collect();
    while bound.len() < n {
        bound.push(bound.last().cloned().unwrap_or(Value::NULL));
    }
    (vec!["?"; n].join(", "), bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_lists_come_in_few_sizes() {
        let (sql, v) = in_list(&[1u64, 2, 3]);
        assert_eq!(sql, "?, ?, ?, ?");
        assert_eq!(v.len(), 4);
        assert_eq!(v[3], Value::from(3u64));
        assert_eq!(in_list(&[7u64]).0, "?");
    }
}
