//! API keys: generation, hashing and storage. Plaintext secrets never reach the database
//! or the logs; only the SHA-256 hex digest and a short display prefix are kept.

use std::fmt;

use rand::distr::Alphanumeric;
use rand::rngs::OsRng;
use rand::{Rng, TryRngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use subtle::ConstantTimeEq;

use crate::AccountsError;

/// Every generated secret starts with this.
pub const SECRET_PREFIX: &str = "sk-gantry-";
/// Number of random base62 characters after [`SECRET_PREFIX`] (40 * log2(62) ≈ 238 bits).
pub const SECRET_RANDOM_LEN: usize = 40;
/// Length of the display prefix for generated keys, e.g. `sk-gantry-AbCd`.
pub const DISPLAY_PREFIX_LEN: usize = 14;
/// Shortest and longest strings [`looks_like_key`] accepts.
pub const MIN_KEY_LEN: usize = 20;
pub const MAX_KEY_LEN: usize = 200;
/// Longest accepted key name.
pub const MAX_NAME_LEN: usize = 200;

/// A stored API key, safe to display.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    pub id: i64,
    pub name: String,
    /// Leading characters of the secret, e.g. `sk-gantry-AbCd`.
    pub prefix: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds; `None` while the key is active.
    pub revoked_at: Option<i64>,
    /// Requests per minute; `None` is unlimited.
    pub rpm_limit: Option<i64>,
    /// Tokens (prompt + max completion) per minute; `None` is unlimited.
    pub tpm_limit: Option<i64>,
}

/// Limits set on a key at creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyLimits {
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
}

impl KeyInfo {
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

/// A freshly created key together with its plaintext secret, which is shown once and
/// never stored. `Debug` redacts the secret.
#[derive(Clone, Serialize, Deserialize)]
pub struct CreatedKey {
    pub key: KeyInfo,
    pub secret: String,
}

impl fmt::Debug for CreatedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreatedKey")
            .field("key", &self.key)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// `"sk-gantry-"` followed by 40 base62 characters drawn from the OS RNG.
pub fn generate_secret() -> String {
    let mut rng = OsRng.unwrap_err();
    let mut s = String::with_capacity(SECRET_PREFIX.len() + SECRET_RANDOM_LEN);
    s.push_str(SECRET_PREFIX);
    s.extend(
        (&mut rng)
            .sample_iter(Alphanumeric)
            .take(SECRET_RANDOM_LEN)
            .map(char::from),
    );
    s
}

/// Cheap syntactic check done before touching the database: 20..=200 printable ASCII
/// characters, no whitespace.
pub fn looks_like_key(s: &str) -> bool {
    (MIN_KEY_LEN..=MAX_KEY_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Lowercase hex SHA-256 of the secret.
pub(crate) fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The part of a secret that is safe to store and display: the first 14 characters, but
/// never more than half of the secret (so short caller-provided keys keep most of their
/// entropy hidden). Callers ensure the secret is ASCII.
pub(crate) fn display_prefix(secret: &str) -> String {
    let n = DISPLAY_PREFIX_LEN.min(secret.len() / 2);
    secret[..n].to_string()
}

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn validate_name(name: &str) -> Result<&str, AccountsError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(AccountsError::Invalid("key name must not be empty".into()));
    }
    if name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(AccountsError::Invalid(format!(
            "key name must be at most {MAX_NAME_LEN} bytes without control characters"
        )));
    }
    Ok(name)
}

type KeyRow = (i64, String, String, i64, Option<i64>, Option<i64>, Option<i64>);

fn to_info((id, name, prefix, created_at, revoked_at, rpm_limit, tpm_limit): KeyRow) -> KeyInfo {
    KeyInfo { id, name, prefix, created_at, revoked_at, rpm_limit, tpm_limit }
}

const KEY_COLUMNS: &str = "id, name, prefix, created_at, revoked_at, rpm_limit, tpm_limit";

pub(crate) async fn create_key(pool: &SqlitePool, name: &str, limits: KeyLimits) -> Result<CreatedKey, AccountsError> {
    let name = validate_name(name)?;
    if limits.rpm.is_some_and(|n| n <= 0) || limits.tpm.is_some_and(|n| n <= 0) {
        return Err(AccountsError::Invalid("rate limits must be positive".into()));
    }
    let secret = generate_secret();
    let prefix = display_prefix(&secret);
    let row: KeyRow = sqlx::query_as(&format!(
        "INSERT INTO api_keys (name, prefix, secret_hash, created_at, rpm_limit, tpm_limit) \
         VALUES (?, ?, ?, ?, ?, ?) RETURNING {KEY_COLUMNS}"
    ))
    .bind(name)
    .bind(&prefix)
    .bind(hash_secret(&secret))
    .bind(now_unix())
    .bind(limits.rpm)
    .bind(limits.tpm)
    .fetch_one(pool)
    .await?;
    let key = to_info(row);
    tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "created API key");
    Ok(CreatedKey { key, secret })
}

pub(crate) async fn ensure_key(
    pool: &SqlitePool,
    secret: &str,
    name: &str,
) -> Result<KeyInfo, AccountsError> {
    if !looks_like_key(secret) {
        return Err(AccountsError::Invalid(format!(
            "API key must be {MIN_KEY_LEN}..={MAX_KEY_LEN} printable ASCII characters without whitespace"
        )));
    }
    let name = validate_name(name)?;
    let hash = hash_secret(secret);
    let inserted = sqlx::query(
        "INSERT INTO api_keys (name, prefix, secret_hash, created_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (secret_hash) DO NOTHING",
    )
    .bind(name)
    .bind(display_prefix(secret))
    .bind(&hash)
    .bind(now_unix())
    .execute(pool)
    .await?
    .rows_affected();
    let key = find_by_hash(pool, &hash)
        .await?
        .ok_or_else(|| AccountsError::NotFound("key vanished after insert".into()))?;
    if !key.is_active() {
        return Err(AccountsError::KeyRevoked);
    }
    if inserted > 0 {
        tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "registered API key");
    }
    Ok(key)
}

async fn find_by_hash(pool: &SqlitePool, hash: &str) -> Result<Option<KeyInfo>, AccountsError> {
    let row: Option<KeyRow> = sqlx::query_as(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys WHERE secret_hash = ?"
    ))
    .bind(hash)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(to_info))
}

pub(crate) async fn list_keys(pool: &SqlitePool) -> Result<Vec<KeyInfo>, AccountsError> {
    let rows: Vec<KeyRow> =
        sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY id"))
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(to_info).collect())
}

pub(crate) async fn count_active_keys(pool: &SqlitePool) -> Result<u64, AccountsError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL")
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(crate) async fn authenticate(
    pool: &SqlitePool,
    secret: &str,
) -> Result<Option<KeyInfo>, AccountsError> {
    if !looks_like_key(secret) {
        return Ok(None);
    }
    let hash = hash_secret(secret);
    let row: Option<(String, i64, String, String, i64, Option<i64>, Option<i64>, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT secret_hash, {KEY_COLUMNS} FROM api_keys WHERE secret_hash = ?"
    ))
    .bind(&hash)
    .fetch_optional(pool)
    .await?;
    let Some((stored_hash, id, name, prefix, created_at, revoked_at, rpm_limit, tpm_limit)) = row else {
        return Ok(None);
    };
    let matches: bool = stored_hash.as_bytes().ct_eq(hash.as_bytes()).into();
    if !matches || revoked_at.is_some() {
        return Ok(None);
    }
    Ok(Some(KeyInfo { id, name, prefix, created_at, revoked_at, rpm_limit, tpm_limit }))
}

/// Resolves `id_or_name` (numeric id, then name, then display prefix; a full `sk-gantry-`
/// secret is matched by hash) and revokes that key.
/// Revoking an already revoked key returns it unchanged.
pub(crate) async fn revoke_key(
    pool: &SqlitePool,
    id_or_name: &str,
) -> Result<KeyInfo, AccountsError> {
    let key = resolve(pool, id_or_name.trim()).await?;
    if key.is_active() {
        sqlx::query("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
            .bind(now_unix())
            .bind(key.id)
            .execute(pool)
            .await?;
        tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "revoked API key");
    }
    let row: KeyRow = sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?"))
        .bind(key.id)
        .fetch_one(pool)
        .await?;
    Ok(to_info(row))
}

async fn resolve(pool: &SqlitePool, what: &str) -> Result<KeyInfo, AccountsError> {
    if what.is_empty() {
        return Err(AccountsError::NotFound("empty key id or name".into()));
    }
    if let Ok(id) = what.parse::<i64>() {
        let row: Option<KeyRow> =
            sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?"))
                .bind(id)
                .fetch_optional(pool)
                .await?;
        if let Some(row) = row {
            return Ok(to_info(row));
        }
    }
    // Someone may paste the full secret; match it by hash and never echo it back.
    if what.starts_with(SECRET_PREFIX) && what.len() > DISPLAY_PREFIX_LEN && looks_like_key(what) {
        return find_by_hash(pool, &hash_secret(what))
            .await?
            .ok_or_else(|| AccountsError::NotFound("no API key matches that secret".into()));
    }
    for column in ["name", "prefix"] {
        let rows: Vec<KeyRow> = sqlx::query_as(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE {column} = ? ORDER BY id"
        ))
        .bind(what)
        .fetch_all(pool)
        .await?;
        let mut keys: Vec<KeyInfo> = rows.into_iter().map(to_info).collect();
        // Prefer active keys: an old revoked key sharing a name must not block revoking the
        // current one.
        if keys.iter().any(KeyInfo::is_active) {
            keys.retain(KeyInfo::is_active);
        }
        match keys.len() {
            0 => continue,
            1 => return Ok(keys.remove(0)),
            n => {
                return Err(AccountsError::Ambiguous(format!(
                    "{n} keys have {column} {what:?}; use the numeric id"
                )))
            }
        }
    }
    Err(AccountsError::NotFound(format!(
        "no API key with id, name or prefix {what:?}"
    )))
}
