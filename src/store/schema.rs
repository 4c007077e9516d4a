//! The schema: the migrations compiled into the binary, `myjob migrate` applying them, and
//! the check that `myjob run` makes before it touches a job.

use anyhow::Context as _;
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::config::DatabaseSettings;
use crate::db;
use crate::error::{Error, ExitCode, OrExit};

/// Every migration, in order. Each is applied once and recorded in `myjob_schema_migrations`.
const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "create_jobs",
        include_str!("../../migrations/0001_create_jobs.sql"),
    ),
    (
        2,
        "create_servers",
        include_str!("../../migrations/0002_create_servers.sql"),
    ),
    (
        3,
        "claim_per_queue",
        include_str!("../../migrations/0003_claim_per_queue.sql"),
    ),
    (
        4,
        "operations",
        include_str!("../../migrations/0004_operations.sql"),
    ),
    (5, "locks", include_str!("../../migrations/0005_locks.sql")),
    (
        6,
        "due_index_covers_queue",
        include_str!("../../migrations/0006_due_index_covers_queue.sql"),
    ),
    (
        7,
        "status_at_insert",
        include_str!("../../migrations/0007_status_at_insert.sql"),
    ),
    (
        8,
        "suspects",
        include_str!("../../migrations/0008_suspects.sql"),
    ),
    (
        9,
        "lock_markers",
        include_str!("../../migrations/0009_lock_markers.sql"),
    ),
    (
        10,
        "rate_limits",
        include_str!("../../migrations/0010_rate_limits.sql"),
    ),
    (
        11,
        "concurrency_keys",
        include_str!("../../migrations/0011_concurrency_keys.sql"),
    ),
    (
        12,
        "concurrency_indexes",
        include_str!("../../migrations/0012_concurrency_indexes.sql"),
    ),
    (
        13,
        "schedules",
        include_str!("../../migrations/0013_schedules.sql"),
    ),
    (
        14,
        "certified_keys",
        include_str!("../../migrations/0014_certified_keys.sql"),
    ),
    (
        15,
        "certified_key_indexes",
        include_str!("../../migrations/0015_certified_key_indexes.sql"),
    ),
    (16, "lanes", include_str!("../../migrations/0016_lanes.sql")),
    (
        17,
        "cancel_owner",
        include_str!("../../migrations/0017_cancel_owner.sql"),
    ),
    (
        18,
        "claims_without_stale_index",
        include_str!("../../migrations/0018_claims_without_stale_index.sql"),
    ),
];

/// The schema version this binary needs.
pub fn latest() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

const CREATE_VERSIONS: &str = "CREATE TABLE IF NOT EXISTS myjob_schema_migrations (
  version    INT UNSIGNED NOT NULL PRIMARY KEY,
  name       VARCHAR(255) NOT NULL,
  applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4";

/// Applies the migrations not yet recorded; returns the versions it applied. A named lock
/// keeps two `migrate` runs from applying the same one at once.
pub async fn migrate(conn: &mut Conn) -> anyhow::Result<Vec<u32>> {
    let locked: Option<i64> = conn
        .query_first("SELECT GET_LOCK('myjob_migrate', 60)")
        .await
        .context("taking the migration lock")?;
    if locked != Some(1) {
        anyhow::bail!("another myjob migrate has held the migration lock for 60 s");
    }
    let result = apply(conn).await;
    let _ = conn.query_drop("DO RELEASE_LOCK('myjob_migrate')").await;
    result
}

async fn apply(conn: &mut Conn) -> anyhow::Result<Vec<u32>> {
    conn.query_drop(CREATE_VERSIONS)
        .await
        .context("creating myjob_schema_migrations")?;
    let applied = applied_versions(conn).await?;
    let mut done = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        if applied.contains(&version) {
            continue;
        }
        // DDL commits by itself in MariaDB, so a migration cannot share a transaction with
        // its record; each is written to be safe to apply again (IF NOT EXISTS).
        conn.query_drop(sql)
            .await
            .with_context(|| format!("applying migration {version} ({name})"))?;
        conn.exec_drop(
            "INSERT INTO myjob_schema_migrations (version, name) VALUES (?, ?)",
            (version, name),
        )
        .await
        .with_context(|| format!("recording migration {version}"))?;
        done.push(version);
    }
    Ok(done)
}

async fn applied_versions(conn: &mut Conn) -> anyhow::Result<Vec<u32>> {
    conn.query("SELECT version FROM myjob_schema_migrations ORDER BY version")
        .await
        .context("reading myjob_schema_migrations")
}

/// Why the schema does not fit this binary.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("schema: the database has no myjob tables; run `myjob migrate` first")]
    Missing,
    #[error("schema: the database is at version {found}, this myjob needs {needed}; run `myjob migrate`")]
    Behind { found: u32, needed: u32 },
    #[error("schema: the database is at version {found}, newer than this myjob knows ({needed}); upgrade myjob")]
    Ahead { found: u32, needed: u32 },
}

/// Checks that the database is at exactly the version this binary needs.
pub async fn check(conn: &mut Conn) -> anyhow::Result<Result<(), SchemaError>> {
    let exists: Option<i64> = conn
        .query_first(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'myjob_schema_migrations'",
        )
        .await
        .context("looking for myjob_schema_migrations")?;
    if exists != Some(1) {
        return Ok(Err(SchemaError::Missing));
    }
    let found = applied_versions(conn).await?.last().copied().unwrap_or(0);
    let needed = latest();
    Ok(match found {
        0 => Err(SchemaError::Missing),
        f if f < needed => Err(SchemaError::Behind { found, needed }),
        f if f > needed => Err(SchemaError::Ahead { found, needed }),
        _ => Ok(()),
    })
}

/// A connection for a command that reads or writes jobs, whose reads see what was committed
/// through any node of a Galera cluster: exit 69 when the database cannot be reached, 78 when
/// its schema does not fit this binary.
pub async fn connect_checked(database: &DatabaseSettings) -> Result<Conn, Error> {
    let mut conn = db::connect(database)
        .await
        .map_err(|e| Error::new(e.exit_code(), e))?;
    // An operator reads what was committed through any node, a migrate just now included.
    db::causal(&mut conn, db::Causal::Reads)
        .await
        .or_exit(ExitCode::Unavailable)?;
    check(&mut conn)
        .await
        .or_exit(ExitCode::Unavailable)?
        .or_exit(ExitCode::Config)?;
    Ok(conn)
}
