//! The reaper's deletion of finished jobs past the config's retention.

use super::*;

/// Deletes finished jobs past their retention, for at most half an interval; on a Galera node,
/// a batch of the slots' anchors not admitted into for a day as well (only admissions there
/// write them).
pub(super) async fn retain(
    conn: &mut Conn,
    server: &ServerId,
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let ages = settings.retention.ages();
    let budget = settings.reaper.interval / 2;
    let purged = purge::purge(conn, &ages, None, Some(budget), shutdown)
        .await
        .context("retention")?;
    if purged.total() > 0 {
        info!(
            done = purged.done,
            failed = purged.failed,
            cancelled = purged.cancelled,
            complete = purged.complete,
            "reaper: deleted finished jobs past their retention"
        );
    }
    if keys::Referee::of(server) == keys::Referee::Certification {
        keys::purge_anchors(conn).await.context("retention")?;
    }
    Ok(())
}
