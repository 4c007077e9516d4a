//! Named locks (`GET_LOCK`): one instance at a time for the reaper's and the stager's work,
//! where the server supports them.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// What [`try_lock`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedLock {
    /// Taken by this connection: held until it is released or the connection ends.
    Held,
    /// Another connection holds it.
    Busy,
    /// The server refuses lock functions: some MariaDB Galera releases do with wsrep on
    /// (MDEV-30473). The caller then acts without it, its writes fenced by what they change.
    Unsupported,
}

/// Tries to take the named lock `prefix.<database>` without waiting. Named after the
/// database, so that separate myjob databases on one server each get their own.
pub async fn try_lock(conn: &mut Conn, prefix: &str) -> anyhow::Result<NamedLock> {
    const ER_NOT_SUPPORTED_YET: u16 = 1235;
    let got: Result<Option<(Option<i64>,)>, _> = conn
        .exec_first(
            "SELECT GET_LOCK(LEFT(CONCAT(?, '.', DATABASE()), 64), 0)",
            (prefix,),
        )
        .await;
    match got {
        Ok(Some((Some(1),))) => Ok(NamedLock::Held),
        Ok(_) => Ok(NamedLock::Busy),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NOT_SUPPORTED_YET => {
            Ok(NamedLock::Unsupported)
        }
        Err(e) => Err(e).with_context(|| format!("taking the lock {prefix}")),
    }
}

/// Releases what [`try_lock`] took.
pub async fn release_lock(conn: &mut Conn, prefix: &str) -> anyhow::Result<()> {
    conn.exec_drop(
        "DO RELEASE_LOCK(LEFT(CONCAT(?, '.', DATABASE()), 64))",
        (prefix,),
    )
    .await
    .with_context(|| format!("releasing the lock {prefix}"))
}
