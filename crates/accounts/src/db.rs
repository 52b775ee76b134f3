//! Connection setup and migrations: SQLite embedded by default, PostgreSQL when several
//! replicas share state. Both go through sqlx's `Any` driver, and every query in this crate is
//! written once, in the SQL both accept (`$N` parameters, `RETURNING`, `ON CONFLICT`).

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::AnyPool;
use sqlx::Executor;

use crate::AccountsError;

/// File name of the database inside a data directory.
pub const DB_FILE_NAME: &str = "gantry.db";

/// How long a connection waits on a locked database before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in a file-backed or PostgreSQL pool.
const POOL_SIZE: u32 = 8;

/// How long an operation waits for a PostgreSQL connection (see `open_postgres`).
const POSTGRES_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// Which database a pool talks to; the few dialect differences key off this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// `YYYY-MM-DD` (UTC) of a unix-milliseconds column.
    pub(crate) fn day_of_ms(self, column: &str) -> String {
        match self {
            Backend::Sqlite => format!("strftime('%Y-%m-%d', {column} / 1000, 'unixepoch')"),
            Backend::Postgres => format!("to_char(to_timestamp({column} / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"),
        }
    }
}

fn install_drivers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(sqlx::any::install_default_drivers);
}

/// Opens (creating directories and the file as needed) `<dir>/gantry.db`.
pub(crate) async fn open_data_dir(dir: &Path) -> Result<(AnyPool, Backend), AccountsError> {
    tokio::fs::create_dir_all(dir).await?;
    let file = dir.join(DB_FILE_NAME);
    let path = file
        .to_str()
        .ok_or_else(|| AccountsError::Invalid(format!("data directory {} is not UTF-8", dir.display())))?;
    open_sqlite(&format!("sqlite://{path}?mode=rwc"), false).await
}

/// Opens `sqlite://path`, `sqlite::memory:` or `postgres://…`.
pub(crate) async fn open_url(url: &str) -> Result<(AnyPool, Backend), AccountsError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return open_postgres(url).await;
    }
    if !url.starts_with("sqlite:") {
        return Err(AccountsError::Invalid("the database URL must start with sqlite: or postgres://".into()));
    }
    if is_memory_url(url) {
        return open_sqlite(url, true).await;
    }
    let file = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let file = Path::new(file.split('?').next().unwrap_or(file));
    if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
        tokio::fs::create_dir_all(parent).await?;
    }
    let url = if url.contains("mode=") {
        url.to_string()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    };
    open_sqlite(&url, false).await
}

fn is_memory_url(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// WAL, a busy timeout and foreign keys on every connection. `synchronous = FULL` makes every
/// commit durable through a power loss (NORMAL may roll back the last commits, and the outbox
/// forgets a usage record once the database has acknowledged it). An in-memory database lives only
/// as long as its connection, so its pool holds exactly one connection forever.
async fn open_sqlite(url: &str, memory: bool) -> Result<(AnyPool, Backend), AccountsError> {
    install_drivers();
    let busy_ms = BUSY_TIMEOUT.as_millis();
    let mut opts = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(30)).after_connect(move |conn, _| {
        Box::pin(async move {
            let pragmas = if memory {
                format!("PRAGMA busy_timeout = {busy_ms}; PRAGMA foreign_keys = ON;")
            } else {
                format!(
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = {busy_ms}; PRAGMA foreign_keys = ON;"
                )
            };
            conn.execute(pragmas.as_str()).await?;
            Ok(())
        })
    });
    opts = if memory {
        opts.max_connections(1).min_connections(1).idle_timeout(None).max_lifetime(None)
    } else {
        opts.max_connections(POOL_SIZE)
    };
    let pool = opts.connect(url).await?;
    migrate(&pool, Backend::Sqlite).await?;
    Ok((pool, Backend::Sqlite))
}

/// Every connection commits durably: with `synchronous_commit = off` (a common tuning, and
/// the test cluster's setting) PostgreSQL acknowledges commits that a crash of the database then
/// loses, and a usage record the outbox already let go of would be gone. `local` is enough for
/// that (the commit is flushed on the primary); any stronger setting the operator chose is kept.
async fn open_postgres(url: &str) -> Result<(AnyPool, Backend), AccountsError> {
    install_drivers();
    let pool = AnyPoolOptions::new()
        .max_connections(POOL_SIZE)
        // A request waits at most this long for the database: one that does not answer makes
        // authentication and admission a 503 with Retry-After within seconds (what load
        // balancers retry on another replica), not after half a minute.
        .acquire_timeout(POSTGRES_ACQUIRE_TIMEOUT)
        .after_connect(|conn, _| {
            Box::pin(async move {
                let level: String = sqlx::query_scalar("SHOW synchronous_commit").fetch_one(&mut *conn).await?;
                if level == "off" {
                    conn.execute("SET synchronous_commit = local").await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?;
    migrate(&pool, Backend::Postgres).await?;
    Ok((pool, Backend::Postgres))
}

/// Runs pending migrations. PostgreSQL serialises concurrent runs with an advisory lock;
/// SQLite has none, so two processes opening a fresh data directory at the same moment can
/// race: the loser fails once and sees the winner's work on retry.
async fn migrate(pool: &AnyPool, backend: Backend) -> Result<(), AccountsError> {
    let migrator = match backend {
        Backend::Sqlite => &SQLITE_MIGRATOR,
        Backend::Postgres => &POSTGRES_MIGRATOR,
    };
    let mut attempt = 0;
    loop {
        match migrator.run(pool).await {
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
