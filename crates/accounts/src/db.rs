//! Connection setup and migrations (SQLite for now; PostgreSQL later).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use crate::AccountsError;

/// File name of the database inside a data directory.
pub const DB_FILE_NAME: &str = "gantry.db";

/// How long a connection waits on a locked database before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in a file-backed pool.
const FILE_POOL_SIZE: u32 = 8;

static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// Opens (creating directories and the file as needed) `<dir>/gantry.db`.
pub(crate) async fn open_data_dir(dir: &Path) -> Result<SqlitePool, AccountsError> {
    tokio::fs::create_dir_all(dir).await?;
    let opts = SqliteConnectOptions::new().filename(dir.join(DB_FILE_NAME));
    open_file(opts).await
}

/// Opens a `sqlite://path` or `sqlite::memory:` URL.
pub(crate) async fn open_url(url: &str) -> Result<SqlitePool, AccountsError> {
    let opts = SqliteConnectOptions::from_str(url)?;
    if is_memory_url(url) {
        open_memory(opts).await
    } else {
        let file = opts.get_filename();
        if let Some(parent) = file.parent() {
            if !parent.as_os_str().is_empty() {
                tokio::fs::create_dir_all(parent).await?;
            }
        }
        open_file(opts).await
    }
}

fn is_memory_url(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

async fn open_file(opts: SqliteConnectOptions) -> Result<SqlitePool, AccountsError> {
    let opts = opts
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(FILE_POOL_SIZE)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// An in-memory database lives only as long as its connection, so the pool holds exactly
/// one connection forever and every caller shares it.
async fn open_memory(opts: SqliteConnectOptions) -> Result<SqlitePool, AccountsError> {
    let opts = opts.busy_timeout(BUSY_TIMEOUT).foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// Runs pending migrations. Two processes opening a fresh data directory at the same moment
/// can race (SQLite has no migration lock); the loser fails once and sees the winner's work
/// on retry.
async fn migrate(pool: &SqlitePool) -> Result<(), AccountsError> {
    let mut attempt = 0;
    loop {
        match SQLITE_MIGRATOR.run(pool).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 3 => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "migration failed, retrying");
                tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
