//! The hand-off: a job that held a slot of its concurrency key has ended, and the key's next
//! blocked job takes the slot at once, rather than at the gate's next pass. Made after the
//! outcome is written, on the consumer's connection: the outcome is the release, and the
//! hand-off is an admission like the gate's, which repairs one that is missed (a crash
//! between the two, a race lost on Galera).

use mysql_async::Conn;

use crate::config::Settings;
use crate::store::jobs::{keys, KeySlot};

/// Hands each of `freed` on, while its key holds fewer slots than its queue's `key_limit`
/// (after a reload lowered it, the slots above it are not handed on, and the key drains down
/// to it). One read of the held slots per queue, then one autocommit statement per hand-off:
/// each stands alone, so a race lost on one (a deadlock, Galera's conflict at the commit)
/// undoes no other, and a duplicate-key check holds no lock past its statement. Returns the
/// queues that got a pending job, which the consumer claims from at once.
pub async fn hand_on(
    conn: &mut Conn,
    settings: &Settings,
    freed: &[KeySlot],
) -> anyhow::Result<Vec<String>> {
    let mut busy: Vec<String> = Vec::new();
    let mut queues: Vec<&str> = freed.iter().map(|s| s.queue.as_str()).collect();
    queues.sort_unstable();
    queues.dedup();
    for queue in queues {
        let Some(limit) = settings.queue(queue).map(|q| q.key_limit) else {
            continue;
        };
        let mine: Vec<&KeySlot> = freed
            .iter()
            .filter(|s| s.queue == queue && s.slot <= limit)
            .collect();
        let mut keys: Vec<Vec<u8>> = mine.iter().map(|s| s.key.clone()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut held = keys::held_slots(conn, queue, &keys).await?;
        for s in mine {
            let holds = held.iter().filter(|h| h.0 == s.key).count();
            if holds >= usize::from(limit) {
                continue;
            }
            if keys::hand_off(conn, queue, &s.key, s.slot).await? {
                held.push((s.key.clone(), s.slot));
                if !busy.iter().any(|q| q == queue) {
                    busy.push(queue.to_owned());
                }
            }
        }
    }
    Ok(busy)
}
