//! The gate: admits blocked jobs into the free slots of their concurrency keys (see
//! `store::jobs::keys`). A job that ends hands its slot on itself (`worker::consumer::handoff`); the
//! gate admits the rest: jobs that arrive blocked (a producer's INSERT, a retry come due,
//! `myjob retry`), slots freed by the reaper or a cancel, and any hand-off that was missed.
//! It reads the rows, not a counter, so a pass repairs whatever the last one left.
//!
//! Every instance gates the queues it serves, with their `key_limit`, on the stager's
//! connection: at once when its consumer's probe saw blocked jobs, and every 4 polls besides
//! (see `stager`). No lock picks one instance, because an admission is a race the slot index
//! referees (two gates that pick one slot change one row). When no queue has a blocked job, a
//! pass is one statement that reads an entry per served queue.

use std::collections::HashMap;

use mysql_async::Conn;

use crate::config::Settings;
use crate::store::jobs::keys::{self, Referee};

/// The most entries of the blocked index one read takes: a read covers this many keys with
/// one job waiting each.
const MAX_ENTRIES: usize = 256;
/// How many reads one queue gets in a full pass; the next pass goes on where this one stopped.
pub const READS_PER_PASS: usize = 64;
/// How the gate and its instance's consumer wake each other.
#[derive(Debug, Default)]
pub struct Wakes {
    /// The gate admitted jobs: the consumer probes at once rather than at its next poll.
    pub admitted: tokio::sync::Notify,
    /// The consumer's probe saw blocked jobs in its queues: the gate runs at once.
    pub blocked: tokio::sync::Notify,
}

#[derive(Debug, Default)]
pub struct Gate {
    /// Per queue, the last key the previous pass looked at when it stopped at its bound: the
    /// next pass starts after it, so that every key gets its turn however many there are.
    resume: HashMap<String, Vec<u8>>,
    /// What referees admissions on the server of the connection passes run on.
    referee: Referee,
}

impl Gate {
    /// Passes now run on a connection to a server refereed by `referee` (see
    /// [`keys::Referee`]): a Galera node, or one server.
    pub fn connected(&mut self, referee: Referee) {
        self.referee = referee;
    }

    /// One pass over the served queues, at most `reads` reads of the blocked index a queue;
    /// returns how many jobs it admitted.
    pub async fn pass(
        &mut self,
        conn: &mut Conn,
        settings: &Settings,
        reads: usize,
    ) -> anyhow::Result<u64> {
        let names: Vec<&str> = settings.queues.iter().map(|q| q.name.as_str()).collect();
        let blocked = keys::blocked_queues(conn, &names).await?;
        self.resume.retain(|q, _| blocked.contains(q));
        let mut admitted = 0;
        for queue in blocked {
            let Some(limit) = settings.queue(&queue).map(|q| q.key_limit) else {
                continue;
            };
            admitted += self.queue(conn, &queue, limit, reads).await?;
        }
        Ok(admitted)
    }

    /// Admits blocked jobs of `queue` into the free slots `1..=limit` of their keys, while a
    /// key holds fewer than `limit` (after a reload lowered it, a key may hold more until they
    /// end), a bounded number of reads per pass. A read's size adapts to the lines: behind
    /// keys with long lines it reads little more than one entry a key (the next read starts
    /// after the last key seen), behind keys of one job each it reads many keys at once.
    async fn queue(
        &mut self,
        conn: &mut Conn,
        queue: &str,
        limit: u16,
        reads: usize,
    ) -> anyhow::Result<u64> {
        let mut admitted = 0;
        let mut entries = MAX_ENTRIES;
        for _ in 0..reads {
            let after = self.resume.get(queue).cloned();
            let (found, full) = keys::blocked_keys(conn, queue, after.as_deref(), entries).await?;
            let held = keys::held_slots(conn, queue, &found).await?;
            for key in &found {
                let taken: Vec<u16> = held.iter().filter(|h| h.0 == *key).map(|h| h.1).collect();
                let room = usize::from(limit).saturating_sub(taken.len());
                for slot in (1..=limit).filter(|s| !taken.contains(s)).take(room) {
                    // None moved: the key has no blocked job left, or another admission
                    // took the slot; either way the next pass looks again.
                    if !keys::hand_off(conn, queue, key, slot, self.referee).await? {
                        break;
                    }
                    admitted += 1;
                }
            }
            match (full, found.last()) {
                (true, Some(last)) => {
                    self.resume.insert(queue.to_owned(), last.clone());
                }
                // The end of the queue's keys: the next pass starts from the first.
                _ => {
                    self.resume.remove(queue);
                    break;
                }
            }
            // Twice as many entries as keys found: one key a read when lines are long.
            entries = (found.len() * 2).clamp(2, MAX_ENTRIES);
        }
        Ok(admitted)
    }
}
