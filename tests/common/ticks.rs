//! The rows of recurring jobs (`myjob_schedule_ticks`) as the schedule tests check them.

use mysql_async::prelude::*;
use mysql_async::Conn;

use super::TestDb;

/// The ticks of `schedule` recorded, in seconds since the Unix epoch, oldest first, and the
/// jobs they name.
pub async fn rows(db: &TestDb, schedule: &str) -> Vec<(i64, Option<u64>)> {
    read_rows(&mut db.conn().await, schedule).await
}

async fn read_rows(conn: &mut Conn, schedule: &str) -> Vec<(i64, Option<u64>)> {
    // Seconds since the epoch in UTC, as the scheduler's sessions write them.
    conn.query_drop("SET time_zone = '+00:00'").await.unwrap();
    conn.exec(
        "SELECT TIMESTAMPDIFF(SECOND, '1970-01-01', tick), job_id FROM myjob_schedule_ticks \
         WHERE schedule = ? ORDER BY tick",
        (schedule,),
    )
    .await
    .unwrap()
}

/// Each tick of `schedule` once: its ticks are `step` seconds apart with no gap, each names
/// a job of its own, and `queue` holds exactly those jobs. Returns the ticks' seconds.
pub async fn assert_each_once(db: &TestDb, schedule: &str, step: i64, queue: &str) -> Vec<i64> {
    // The ticks and the queue read from one snapshot: an instance still running commits a
    // tick with its job between two reads of their own.
    let mut conn = db.conn().await;
    conn.query_drop("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .await
        .unwrap();
    let ticks = read_rows(&mut conn, schedule).await;
    let queued: u64 = conn
        .exec_first("SELECT COUNT(*) FROM myjob_jobs WHERE queue = ?", (queue,))
        .await
        .unwrap()
        .unwrap();
    conn.query_drop("COMMIT").await.unwrap();
    let seconds: Vec<i64> = ticks.iter().map(|t| t.0).collect();
    for pair in seconds.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            step,
            "{schedule}: a tick missed or twice: {seconds:?}"
        );
    }
    let mut jobs: Vec<u64> = ticks.iter().filter_map(|t| t.1).collect();
    assert_eq!(
        jobs.len(),
        ticks.len(),
        "{schedule}: a tick without its job"
    );
    jobs.sort_unstable();
    jobs.dedup();
    assert_eq!(
        jobs.len(),
        ticks.len(),
        "{schedule}: two ticks name one job"
    );
    assert_eq!(
        queued,
        ticks.len() as u64,
        "{schedule}: the queue holds other jobs than its ticks'"
    );
    seconds
}
