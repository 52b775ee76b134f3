//! API keys, budgets, rate-limit windows and the token usage ledger, stored in an embedded
//! SQLite database or, for several replicas, in PostgreSQL.
//!
//! Plaintext secrets are never stored or logged: the database holds the SHA-256 hex digest
//! of each secret plus a short display prefix (e.g. `sk-gantry-AbCd`).

use std::path::Path;

use sqlx::AnyPool;

mod batches;
mod budget;
mod cache_scope;
mod db;
mod files;
mod instances;
mod keys;
mod metering;
mod money;
pub mod outbox;
mod rate;
mod stored_responses;
mod tenants;
#[doc(hidden)]
pub mod testing;
mod unknown_keys;
mod usage;

pub use batches::{BatchInfo, BatchLine, ClaimedLine, Finishable, NewBatch, NewLine};
pub use budget::{Reservation, Spend};
pub use cache_scope::{CacheScopeSetting, SHARED_CACHE_SCOPE};
pub use files::{FileInfo, FileQuery, FileQuota, NewFile};
pub use money::{Budget, BudgetPeriod, Price, NANOS_PER_USD};

pub use db::{Backend, BUSY_TIMEOUT, DB_FILE_NAME};
pub use keys::{
    generate_secret, looks_like_key, CreatedKey, KeyInfo, KeyLimits, KeyUpdate, NewKey, DISPLAY_PREFIX_LEN,
    MAX_KEY_LEN, MAX_WEIGHT, MIN_KEY_LEN, SECRET_PREFIX,
};
pub use metering::{
    Charge, DefaultLimits, Meter, MeterConfig, Outcome, Pass, Refusal, Refused, Settlement, Ticket, UNLIMITED_RPM,
    UNLIMITED_TPM,
};
pub use rate::{Allowance, Count, LocalWindows, RateRefusal, RateStatus, RateWindow};
pub use stored_responses::{NewStoredResponse, StoredQuota, MAX_CONVERSATION_BYTES, MAX_CONVERSATION_DEPTH};
pub use tenants::TenantInfo;
pub use unknown_keys::{UNKNOWN_KEY_CAPACITY, UNKNOWN_KEY_TTL};
pub use usage::{RequestRow, UsageQuery, UsageRecord, UsageRow};

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
    /// The key's budget cannot cover the request (OpenAI's `insufficient_quota`).
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Handle to the accounts database. Cloning is cheap and shares the connection pool.
#[derive(Debug, Clone)]
pub struct Accounts {
    pool: AnyPool,
    backend: Backend,
    /// Secrets recently found unknown, shared by the clones of this handle.
    unknown_keys: std::sync::Arc<unknown_keys::UnknownKeys>,
}

impl Accounts {
    /// Opens (creating dirs and file) `<data_dir>/gantry.db` in WAL mode, busy_timeout 5s,
    /// and runs migrations.
    pub async fn open_data_dir(dir: &Path) -> Result<Self, AccountsError> {
        let (pool, backend) = db::open_data_dir(dir).await?;
        Ok(Self { pool, backend, unknown_keys: unknown_keys::UnknownKeys::new() })
    }

    /// Opens `sqlite://path` (file created if missing), `sqlite::memory:` (one shared
    /// connection held for the lifetime of the pool) or `postgres://…`, and runs migrations.
    pub async fn open_url(url: &str) -> Result<Self, AccountsError> {
        let (pool, backend) = db::open_url(url).await?;
        Ok(Self { pool, backend, unknown_keys: unknown_keys::UnknownKeys::new() })
    }

    /// Creates a key with a fresh random secret. The secret is returned once and not stored.
    pub async fn create_key(&self, name: &str) -> Result<CreatedKey, AccountsError> {
        self.known(keys::create_key(&self.pool, name, KeyLimits::default()).await)
    }

    /// Registers a caller-provided plaintext key (e.g. `gantry serve --api-key`). Idempotent:
    /// an existing active key is returned as is (its name unchanged); a revoked one yields
    /// [`AccountsError::KeyRevoked`] and stays revoked. Malformed secrets (see
    /// [`looks_like_key`]) and empty names yield [`AccountsError::Invalid`].
    pub async fn ensure_key(&self, secret: &str, name: &str) -> Result<KeyInfo, AccountsError> {
        let key = keys::ensure_key(&self.pool, secret, name).await?;
        self.unknown_keys.forget(&keys::hash_secret(secret));
        Ok(key)
    }

    /// All keys, revoked ones included, ordered by id.
    pub async fn list_keys(&self) -> Result<Vec<KeyInfo>, AccountsError> {
        keys::list_keys(&self.pool).await
    }

    /// Revokes a key chosen by numeric id, else by name, else by display prefix (active keys
    /// are preferred when matching names/prefixes). [`AccountsError::NotFound`] if nothing
    /// matches, [`AccountsError::Ambiguous`] if several active keys do. Revoking an already
    /// revoked key returns it unchanged.
    /// The key's stored responses are deleted with it.
    pub async fn revoke_key(&self, id_or_name: &str) -> Result<KeyInfo, AccountsError> {
        let key = keys::revoke_key(&self.pool, id_or_name).await?;
        let deleted = stored_responses::delete_all_of(&self.pool, key.id).await?;
        if deleted > 0 {
            tracing::info!(key_id = key.id, deleted, "deleted the revoked key's stored responses");
        }
        Ok(key)
    }

    /// Keeps a response (`store: true`) for its key until `expires_at_ms`, then drops the key's
    /// oldest responses past `quota`; returns how many were dropped.
    pub async fn store_response(&self, new: &NewStoredResponse<'_>, quota: StoredQuota) -> Result<u64, AccountsError> {
        stored_responses::store(&self.pool, new, quota).await
    }

    /// The key's stored Response object `id` (JSON), unless it expired; another key's is `None`.
    pub async fn stored_response(&self, key_id: i64, id: &str, now_ms: i64) -> Result<Option<String>, AccountsError> {
        stored_responses::response(&self.pool, key_id, id, now_ms).await
    }

    /// The key's stored Response `id` (JSON) and its own turn's items (a JSON array: its input,
    /// then its output).
    pub async fn stored_response_and_items(
        &self,
        key_id: i64,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<(String, String)>, AccountsError> {
        stored_responses::response_and_items(&self.pool, key_id, id, now_ms).await
    }

    /// The items of the conversation ending with the key's stored response `id`, one JSON array
    /// per turn, oldest first; `None` if any of its responses is gone or not the key's.
    pub async fn stored_conversation(
        &self,
        key_id: i64,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>, AccountsError> {
        stored_responses::conversation(&self.pool, key_id, id, now_ms).await
    }

    /// Deletes the key's stored response `id`; whether there was one.
    pub async fn delete_stored_response(&self, key_id: i64, id: &str) -> Result<bool, AccountsError> {
        stored_responses::delete(&self.pool, key_id, id).await
    }

    pub async fn count_active_keys(&self) -> Result<u64, AccountsError> {
        keys::count_active_keys(&self.pool).await
    }

    /// Looks a presented secret up by its SHA-256 hash. `Ok(None)` for malformed, unknown or
    /// revoked keys.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<KeyInfo>, AccountsError> {
        if !looks_like_key(secret) {
            return Ok(None);
        }
        let hash = keys::hash_secret(secret);
        if self.unknown_keys.contains(&hash) {
            return Ok(None);
        }
        self.unknown_keys.count_lookup();
        let found = keys::authenticate(&self.pool, secret).await?;
        if found.is_none() {
            self.unknown_keys.insert(hash);
        }
        Ok(found)
    }

    /// Key lookups [`Accounts::authenticate`] sent to the database (secrets remembered as
    /// unknown cost none), counted across this handle's clones.
    pub fn key_lookups(&self) -> u64 {
        self.unknown_keys.lookups()
    }

    /// A secret just issued must not stay remembered as unknown.
    fn known(&self, created: Result<CreatedKey, AccountsError>) -> Result<CreatedKey, AccountsError> {
        if let Ok(created) = &created {
            self.unknown_keys.forget(&keys::hash_secret(&created.secret));
        }
        created
    }

    /// Creates a key with every setting of [`NewKey`]; the secret is returned once.
    pub async fn create_key_from(&self, spec: &NewKey) -> Result<CreatedKey, AccountsError> {
        self.known(keys::create(&self.pool, spec).await)
    }

    /// The key `id_or_name` resolves to (see [`Accounts::revoke_key`] for the rules).
    pub async fn find_key(&self, id_or_name: &str) -> Result<KeyInfo, AccountsError> {
        keys::find(&self.pool, id_or_name).await
    }

    /// Changes the fields `update` names; returns the key as stored.
    pub async fn update_key(&self, id_or_name: &str, update: &KeyUpdate) -> Result<KeyInfo, AccountsError> {
        keys::update(&self.pool, id_or_name, update).await
    }

    /// A new secret for the same key; the old secret stops working at once.
    /// Every tenant named by a key or given a setting.
    pub async fn list_tenants(&self) -> Result<Vec<TenantInfo>, AccountsError> {
        tenants::list(&self.pool).await
    }

    pub async fn find_tenant(&self, name: &str) -> Result<TenantInfo, AccountsError> {
        tenants::find(&self.pool, name).await
    }

    /// Sets a tenant's weight (1..=[`MAX_WEIGHT`]); its keys' next requests share by it.
    pub async fn set_tenant_weight(&self, name: &str, weight: i64) -> Result<TenantInfo, AccountsError> {
        tenants::set_weight(&self.pool, name, weight).await
    }

    pub async fn rotate_key(&self, id_or_name: &str) -> Result<CreatedKey, AccountsError> {
        self.known(keys::rotate(&self.pool, id_or_name).await)
    }

    /// Holds a request's maximum cost against the key's budget before it reaches the engine;
    /// [`AccountsError::QuotaExceeded`] when the budget cannot cover it.
    pub async fn reserve(&self, key: &KeyInfo, reservation: &Reservation) -> Result<(), AccountsError> {
        budget::reserve(&self.pool, key, reservation).await
    }

    /// Gives back a reservation of a request that never ran.
    pub async fn release(&self, request_id: &str) -> Result<(), AccountsError> {
        budget::release(&self.pool, request_id).await
    }

    /// Releases what a previous run of server `owner` still held (it crashed mid-request).
    pub async fn release_reservations_of(&self, owner: &str) -> Result<u64, AccountsError> {
        budget::release_owner(&self.pool, owner).await
    }

    /// Releases reservations made before `cutoff_ms` by any server (one that died for good).
    pub async fn release_reservations_before(&self, cutoff_ms: i64) -> Result<u64, AccountsError> {
        budget::release_older_than(&self.pool, cutoff_ms).await
    }

    /// The key's settled and reserved spend in the budget period containing `at_ms`.
    pub async fn spend(&self, key: &KeyInfo, at_ms: i64) -> Result<Spend, AccountsError> {
        budget::spend(&self.pool, key, at_ms).await
    }

    /// Records one request's usage exactly once per `request_id` (duplicates are ignored) and
    /// settles its reservation, if any. `key_id` must reference an existing key.
    pub async fn record_usage(&self, rec: &UsageRecord) -> Result<(), AccountsError> {
        budget::settle(&self.pool, rec).await
    }

    /// Usage totals grouped by key name, tenant and model.
    pub async fn usage_summary(&self) -> Result<Vec<UsageRow>, AccountsError> {
        usage::report(&self.pool, self.backend, &UsageQuery::default()).await
    }

    /// Usage totals filtered and grouped as `query` says.
    pub async fn usage_report(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, AccountsError> {
        usage::report(&self.pool, self.backend, query).await
    }

    /// One row per request matching `query` (its `by_day` is ignored), oldest first, with the
    /// server's and the client's request ids.
    pub async fn usage_requests(&self, query: &UsageQuery) -> Result<Vec<RequestRow>, AccountsError> {
        usage::requests(&self.pool, query).await
    }

    /// Counts a request of `tokens` against the key's per-minute limits shared through the
    /// database; refused (and not counted) when either limit would be passed.
    pub async fn rate_admit(
        &self,
        key_id: i64,
        now_ms: i64,
        tokens: i64,
        rpm: Option<i64>,
        tpm: Option<i64>,
    ) -> Result<RateWindow, AccountsError> {
        rate::admit(&self.pool, key_id, now_ms, tokens, rpm, tpm).await
    }

    /// One round trip to the database (`SELECT 1`): readiness probes ask whether it answers.
    pub async fn ping(&self) -> Result<(), AccountsError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// SQLite or PostgreSQL.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes the pool, waiting for connections to finish (checkpoints the WAL).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests;
