//! `myjob pause` and `myjob resume`: a queue's claims stop and start again, on every
//! instance, from its next `poll_interval`.

use std::path::Path;

use crate::error::{Error, ExitCode, OrExit};
use crate::store::queues;

pub async fn pause(config: &Path, queue: &str) -> Result<(), Error> {
    let (settings, mut conn) = super::open(config).await?;
    let result = queues::pause(&mut conn, queue).await;
    let _ = conn.disconnect().await;
    match result.or_exit(ExitCode::Unavailable)? {
        true => println!("queue {queue}: paused; running jobs finish, no new ones are claimed"),
        false => println!("queue {queue}: paused already"),
    }
    if settings.queue(queue).is_none() {
        tracing::warn!(
            "queue {queue:?} is not in {}; the pause holds for whichever worker serves it",
            settings.path.display()
        );
    }
    Ok(())
}

pub async fn resume(config: &Path, queue: &str) -> Result<(), Error> {
    let (_, mut conn) = super::open(config).await?;
    let result = queues::resume(&mut conn, queue).await;
    let _ = conn.disconnect().await;
    match result.or_exit(ExitCode::Unavailable)? {
        true => println!("queue {queue}: resumed"),
        false => println!("queue {queue}: not paused"),
    }
    Ok(())
}
