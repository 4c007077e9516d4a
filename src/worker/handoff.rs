//! The hand-off: a job that held a slot of its concurrency key has ended, and the key's next
//! blocked job takes the slot at once, rather than at the gate's next pass. Made after the
//! outcome is written, on the consumer's connection: the outcome is the release, and the
//! hand-off is an admission like the gate's, which repairs one that is missed (a crash
//! between the two, a race lost on Galera).

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::config::Settings;
use crate::store::jobs::{keys, KeySlot};

/// Hands each of `freed` on, in one transaction when there are several (one commit); a slot
/// above its queue's `key_limit` (lowered by a reload) is not handed on, so that the key
/// drains down to the limit. Returns the queues that got a pending job, which the consumer
/// claims from at once.
pub async fn hand_on(
    conn: &mut Conn,
    settings: &Settings,
    freed: &[KeySlot],
) -> anyhow::Result<Vec<String>> {
    let due: Vec<&KeySlot> = freed
        .iter()
        .filter(|s| {
            settings
                .queue(&s.queue)
                .is_some_and(|q| s.slot <= q.key_limit)
        })
        .collect();
    let several = due.len() > 1;
    if several {
        conn.query_drop("BEGIN")
            .await
            .context("starting the hand-off transaction")?;
    }
    let mut busy: Vec<String> = Vec::new();
    for s in due {
        // A race lost to another admission (or a deadlock that ended the transaction, after
        // which each hand-off commits by itself) admits nothing and goes on.
        match keys::hand_off(conn, &s.queue, &s.key, s.slot).await {
            Ok(true) if !busy.contains(&s.queue) => busy.push(s.queue.clone()),
            Ok(_) => {}
            Err(e) => {
                if several {
                    let _ = conn.query_drop("ROLLBACK").await;
                }
                return Err(e);
            }
        }
    }
    if several {
        conn.query_drop("COMMIT")
            .await
            .context("committing the hand-offs")?;
    }
    Ok(busy)
}
