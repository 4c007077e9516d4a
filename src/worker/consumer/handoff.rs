//! The hand-off: a job that held a slot of its concurrency key has ended, and the key's next
//! blocked job takes the slot at once, rather than at the gate's next pass. Made after the
//! outcome is written, on the consumer's connection: the outcome is the release, and the
//! hand-off is an admission like the gate's, which repairs one that is missed (a crash
//! between the two, a race lost on Galera).

use mysql_async::Conn;

use crate::config::Settings;
use crate::store::jobs::keys::{self, Referee};
use crate::store::jobs::KeySlot;

/// Hands the slots `freed` gave up on to their keys' next jobs, while a key holds fewer
/// slots than its queue's `key_limit`: after a reload lowered it, the key drains down to it.
/// Into the lowest free slots, as the gate admits: two admitters that race for a key's last
/// room pick the same slot, and the unique index (on Galera, the slot's anchor) lets one have
/// it. One read of the held slots per queue, then one admission per hand-off, each standing
/// alone: an autocommit statement on one server, a transaction of two on a Galera node (see
/// [`keys::hand_off`]), so a race lost on one (a deadlock, Galera's conflict at the commit)
/// undoes no other. Returns the queues that got a pending job, which the consumer claims
/// from at once.
pub async fn hand_on(
    conn: &mut Conn,
    referee: Referee,
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
        let mut keys: Vec<Vec<u8>> = freed
            .iter()
            .filter(|s| s.queue == queue)
            .map(|s| s.key.clone())
            .collect();
        keys.sort_unstable();
        let held = keys::held_slots(conn, queue, &keys).await?;
        let mut freed_of = keys.clone();
        keys.dedup();
        for key in &keys {
            let given = freed_of.iter().filter(|k| *k == key).count();
            freed_of.retain(|k| k != key);
            let taken: Vec<u16> = held.iter().filter(|h| h.0 == *key).map(|h| h.1).collect();
            let room = usize::from(limit).saturating_sub(taken.len());
            for slot in (1..=limit)
                .filter(|s| !taken.contains(s))
                .take(room.min(given))
            {
                if !keys::hand_off(conn, queue, key, slot, referee).await? {
                    break;
                }
                if !busy.iter().any(|q| q == queue) {
                    busy.push(queue.to_owned());
                }
            }
        }
    }
    Ok(busy)
}
