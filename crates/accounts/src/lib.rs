//! API keys and the token usage ledger, stored in an embedded SQLite database.
//!
//! Plaintext secrets are never stored or logged: the database holds the SHA-256 hex digest
//! of each secret plus a short display prefix (e.g. `sk-gantry-AbCd`).

use std::path::Path;

use sqlx::SqlitePool;

mod db;
mod keys;
mod usage;

pub use db::{BUSY_TIMEOUT, DB_FILE_NAME};
pub use keys::{
    generate_secret, looks_like_key, CreatedKey, KeyInfo, KeyLimits, DISPLAY_PREFIX_LEN, MAX_KEY_LEN,
    MIN_KEY_LEN, SECRET_PREFIX,
};
pub use usage::{UsageRecord, UsageRow};

/// Errors from the accounts store.
#[derive(Debug, thiserror::Error)]
pub enum AccountsError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("ambiguous: {0}")]
    Ambiguous(String),
    #[error("API key has been revoked")]
    KeyRevoked,
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Handle to the accounts database. Cloning is cheap and shares the connection pool.
#[derive(Debug, Clone)]
pub struct Accounts {
    pool: SqlitePool,
}

impl Accounts {
    /// Opens (creating dirs and file) `<data_dir>/gantry.db` in WAL mode, busy_timeout 5s,
    /// and runs migrations.
    pub async fn open_data_dir(dir: &Path) -> Result<Self, AccountsError> {
        Ok(Self {
            pool: db::open_data_dir(dir).await?,
        })
    }

    /// Opens `sqlite://path` (file created if missing) or `sqlite::memory:` (one shared
    /// connection held for the lifetime of the pool), and runs migrations.
    pub async fn open_url(url: &str) -> Result<Self, AccountsError> {
        Ok(Self {
            pool: db::open_url(url).await?,
        })
    }

    /// Creates a key with a fresh random secret. The secret is returned once and not stored.
    pub async fn create_key(&self, name: &str) -> Result<CreatedKey, AccountsError> {
        keys::create_key(&self.pool, name, KeyLimits::default()).await
    }

    /// Creates a key with rate limits (positive, or `None` for unlimited).
    pub async fn create_key_with_limits(&self, name: &str, limits: KeyLimits) -> Result<CreatedKey, AccountsError> {
        keys::create_key(&self.pool, name, limits).await
    }

    /// Registers a caller-provided plaintext key (e.g. `gantry serve --api-key`). Idempotent:
    /// an existing active key is returned as is (its name unchanged); a revoked one yields
    /// [`AccountsError::KeyRevoked`] and stays revoked. Malformed secrets (see
    /// [`looks_like_key`]) and empty names yield [`AccountsError::Invalid`].
    pub async fn ensure_key(&self, secret: &str, name: &str) -> Result<KeyInfo, AccountsError> {
        keys::ensure_key(&self.pool, secret, name).await
    }

    /// All keys, revoked ones included, ordered by id.
    pub async fn list_keys(&self) -> Result<Vec<KeyInfo>, AccountsError> {
        keys::list_keys(&self.pool).await
    }

    /// Revokes a key chosen by numeric id, else by name, else by display prefix (active keys
    /// are preferred when matching names/prefixes). [`AccountsError::NotFound`] if nothing
    /// matches, [`AccountsError::Ambiguous`] if several active keys do. Revoking an already
    /// revoked key returns it unchanged.
    pub async fn revoke_key(&self, id_or_name: &str) -> Result<KeyInfo, AccountsError> {
        keys::revoke_key(&self.pool, id_or_name).await
    }

    pub async fn count_active_keys(&self) -> Result<u64, AccountsError> {
        keys::count_active_keys(&self.pool).await
    }

    /// Looks a presented secret up by its SHA-256 hash. `Ok(None)` for malformed, unknown or
    /// revoked keys.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<KeyInfo>, AccountsError> {
        keys::authenticate(&self.pool, secret).await
    }

    /// Records one request's usage exactly once per `request_id` (duplicates are ignored).
    /// `key_id` must reference an existing key.
    pub async fn record_usage(&self, rec: &UsageRecord) -> Result<(), AccountsError> {
        usage::record_usage(&self.pool, rec).await
    }

    /// Usage totals grouped by key name and model, ordered by key name then model.
    pub async fn usage_summary(&self) -> Result<Vec<UsageRow>, AccountsError> {
        usage::usage_summary(&self.pool).await
    }

    /// Closes the pool, waiting for connections to finish (checkpoints the WAL).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests;
