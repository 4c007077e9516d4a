//! `myjob cancel`: jobs that have not finished end `cancelled`; a running one's worker stops
//! its handler.

use std::path::Path;

use anyhow::anyhow;

use crate::error::{Error, ExitCode, OrExit};
use crate::store::jobs::admin;

pub async fn run(config: &Path, ids: &[u64]) -> Result<(), Error> {
    let (_, mut conn) = super::open(config).await?;
    let result = admin::cancel(&mut conn, &super::job_ids(ids)).await;
    let _ = conn.disconnect().await;
    let cancelled = result
        .or_exit(ExitCode::Unavailable)?
        .map_err(|refused| anyhow!("{refused}; nothing was cancelled"))
        .or_exit(ExitCode::Data)?;
    for c in cancelled {
        match c.was.as_str() {
            "claimed" => println!(
                "job {}: cancelled while running; its worker stops the handler within 2 s",
                c.id
            ),
            was => println!("job {}: cancelled (was {was})", c.id),
        }
    }
    Ok(())
}
