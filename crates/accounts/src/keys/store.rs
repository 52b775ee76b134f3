//! Keys in the database: create, update, rotate, revoke, find and authenticate. Only a secret's
//! SHA-256 digest is stored and compared (in constant time).

use sqlx::AnyPool;
use subtle::ConstantTimeEq;

use super::{
    display_prefix, generate_secret, hash_secret, looks_like_key, now_unix, CreatedKey, KeyInfo, KeyLimits, KeyUpdate,
    NewKey, DISPLAY_PREFIX_LEN, MAX_KEY_LEN, MAX_NAME_LEN, MAX_WEIGHT, MIN_KEY_LEN, SECRET_PREFIX,
};
use crate::cache_scope::CacheScopeSetting;
use crate::money::{Budget, BudgetPeriod};
use crate::AccountsError;

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
    // The CLI and the admin API take a key by name or by id: a name of digits alone would be
    // read as another key's id.
    if name.chars().all(|c| c.is_ascii_digit()) {
        return Err(AccountsError::Invalid("key name must not be digits alone (it would read as a key id)".into()));
    }
    if name.starts_with(SECRET_PREFIX) {
        return Err(AccountsError::Invalid(format!(
            "key name must not start with {SECRET_PREFIX:?} (it would read as a key's prefix or secret)"
        )));
    }
    Ok(name)
}

#[derive(sqlx::FromRow)]
struct KeyRow {
    id: i64,
    name: String,
    tenant: String,
    prefix: String,
    created_at: i64,
    revoked_at: Option<i64>,
    expires_at: Option<i64>,
    rpm_limit: Option<i64>,
    tpm_limit: Option<i64>,
    budget_tokens: Option<i64>,
    budget_nanos: Option<i64>,
    budget_period: String,
    allowed_models: Option<String>,
    cache_scope: String,
    weight: i64,
    tenant_weight: i64,
    priority_tier: i64,
}

fn to_info(r: KeyRow) -> KeyInfo {
    KeyInfo {
        id: r.id,
        name: r.name,
        tenant: r.tenant,
        prefix: r.prefix,
        created_at: r.created_at,
        revoked_at: r.revoked_at,
        expires_at: r.expires_at,
        rpm_limit: r.rpm_limit,
        tpm_limit: r.tpm_limit,
        budget: Budget {
            tokens: r.budget_tokens,
            nanos: r.budget_nanos,
            period: r.budget_period.parse().unwrap_or(BudgetPeriod::Total),
        },
        // Written only by this crate from a Vec<String>; unreadable means "nothing allowed"
        // rather than "everything allowed".
        allowed_models: r.allowed_models.map(|j| serde_json::from_str(&j).unwrap_or_default()),
        // Unreadable means the narrowest scope rather than a shared one.
        cache_scope: r.cache_scope.parse().unwrap_or(CacheScopeSetting::Key),
        weight: r.weight,
        tenant_weight: r.tenant_weight,
        priority_tier: r.priority_tier != 0,
    }
}

const KEY_COLUMNS: &str = "id, name, tenant, prefix, created_at, revoked_at, expires_at, rpm_limit, tpm_limit, \
                           budget_tokens, budget_nanos, budget_period, allowed_models, cache_scope, weight, priority_tier, \
                           COALESCE((SELECT t.weight FROM tenants t WHERE t.name = api_keys.tenant), 1) AS tenant_weight";

pub(crate) fn validate_tenant(tenant: &str) -> Result<&str, AccountsError> {
    let t = tenant.trim();
    if t.is_empty() || t.len() > MAX_NAME_LEN || t.chars().any(char::is_control) {
        return Err(AccountsError::Invalid(format!(
            "tenant must be 1..={MAX_NAME_LEN} bytes without control characters"
        )));
    }
    Ok(t)
}

pub(crate) fn validate_weight(what: &str, v: Option<i64>) -> Result<(), AccountsError> {
    match v {
        Some(n) if !(1..=MAX_WEIGHT).contains(&n) => {
            Err(AccountsError::Invalid(format!("{what} weight must be a whole number in 1..={MAX_WEIGHT}, not {n}")))
        }
        _ => Ok(()),
    }
}

fn validate_positive(what: &str, v: Option<i64>) -> Result<(), AccountsError> {
    match v {
        Some(n) if n <= 0 => Err(AccountsError::Invalid(format!("{what} must be positive"))),
        _ => Ok(()),
    }
}

fn models_json(models: Option<&[String]>) -> Result<Option<String>, AccountsError> {
    let Some(models) = models else { return Ok(None) };
    if models.iter().any(|m| m.trim().is_empty()) {
        return Err(AccountsError::Invalid("allowed model ids must not be empty".into()));
    }
    Ok(Some(serde_json::to_string(models).expect("strings serialize")))
}

pub(crate) async fn create_key(pool: &AnyPool, name: &str, limits: KeyLimits) -> Result<CreatedKey, AccountsError> {
    let spec = NewKey { name: name.to_string(), rpm_limit: limits.rpm, tpm_limit: limits.tpm, ..Default::default() };
    create(pool, &spec).await
}

pub(crate) async fn create(pool: &AnyPool, spec: &NewKey) -> Result<CreatedKey, AccountsError> {
    let name = validate_name(&spec.name)?;
    let tenant = validate_tenant(spec.tenant.as_deref().unwrap_or("default"))?;
    validate_positive("rpm limit", spec.rpm_limit)?;
    validate_positive("tpm limit", spec.tpm_limit)?;
    validate_positive("token budget", spec.budget.tokens)?;
    validate_positive("money budget", spec.budget.nanos)?;
    validate_weight("key", spec.weight)?;
    let models = models_json(spec.allowed_models.as_deref())?;
    let secret = generate_secret();
    let prefix = display_prefix(&secret);
    let row: KeyRow = sqlx::query_as(&format!(
        "INSERT INTO api_keys (name, tenant, prefix, secret_hash, created_at, expires_at, rpm_limit, tpm_limit, \
         budget_tokens, budget_nanos, budget_period, allowed_models, cache_scope, weight, priority_tier) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING {KEY_COLUMNS}"
    ))
    .bind(name)
    .bind(tenant)
    .bind(&prefix)
    .bind(hash_secret(&secret))
    .bind(now_unix())
    .bind(spec.expires_at)
    .bind(spec.rpm_limit)
    .bind(spec.tpm_limit)
    .bind(spec.budget.tokens)
    .bind(spec.budget.nanos)
    .bind(spec.budget.period.as_str())
    .bind(models)
    .bind(spec.cache_scope.as_str())
    .bind(spec.weight.unwrap_or(1))
    .bind(i64::from(spec.priority_tier))
    .fetch_one(pool)
    .await?;
    let key = to_info(row);
    tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "created API key");
    Ok(CreatedKey { key, secret })
}

/// Applies a partial update to the key `id_or_name` resolves to; returns the key as stored.
pub(crate) async fn update(pool: &AnyPool, id_or_name: &str, u: &KeyUpdate) -> Result<KeyInfo, AccountsError> {
    let key = resolve(pool, id_or_name.trim()).await?;
    let name = u.name.as_deref().map(validate_name).transpose()?;
    let tenant = u.tenant.as_deref().map(validate_tenant).transpose()?;
    validate_positive("rpm limit", u.rpm_limit.flatten())?;
    validate_positive("tpm limit", u.tpm_limit.flatten())?;
    validate_positive("token budget", u.budget_tokens.flatten())?;
    validate_positive("money budget", u.budget_nanos.flatten())?;
    validate_weight("key", u.weight)?;
    let models = match &u.allowed_models {
        Some(m) => Some(models_json(m.as_deref())?),
        None => None,
    };
    // One statement: each column keeps its value unless the update names it.
    let row: KeyRow = sqlx::query_as(&format!(
        "UPDATE api_keys SET \
           name = CASE WHEN $1 THEN $2 ELSE name END, \
           tenant = CASE WHEN $3 THEN $4 ELSE tenant END, \
           rpm_limit = CASE WHEN $5 THEN $6 ELSE rpm_limit END, \
           tpm_limit = CASE WHEN $7 THEN $8 ELSE tpm_limit END, \
           budget_tokens = CASE WHEN $9 THEN $10 ELSE budget_tokens END, \
           budget_nanos = CASE WHEN $11 THEN $12 ELSE budget_nanos END, \
           budget_period = CASE WHEN $13 THEN $14 ELSE budget_period END, \
           allowed_models = CASE WHEN $15 THEN $16 ELSE allowed_models END, \
           expires_at = CASE WHEN $17 THEN $18 ELSE expires_at END, \
           cache_scope = CASE WHEN $19 THEN $20 ELSE cache_scope END, \
           weight = CASE WHEN $21 THEN $22 ELSE weight END, \
           priority_tier = CASE WHEN $23 THEN $24 ELSE priority_tier END \
         WHERE id = $25 RETURNING {KEY_COLUMNS}"
    ))
    .bind(name.is_some())
    .bind(name)
    .bind(tenant.is_some())
    .bind(tenant)
    .bind(u.rpm_limit.is_some())
    .bind(u.rpm_limit.flatten())
    .bind(u.tpm_limit.is_some())
    .bind(u.tpm_limit.flatten())
    .bind(u.budget_tokens.is_some())
    .bind(u.budget_tokens.flatten())
    .bind(u.budget_nanos.is_some())
    .bind(u.budget_nanos.flatten())
    .bind(u.budget_period.is_some())
    .bind(u.budget_period.map(|p| p.as_str()))
    .bind(models.is_some())
    .bind(models.flatten())
    .bind(u.expires_at.is_some())
    .bind(u.expires_at.flatten())
    .bind(u.cache_scope.is_some())
    .bind(u.cache_scope.map(CacheScopeSetting::as_str))
    .bind(u.weight.is_some())
    .bind(u.weight)
    .bind(u.priority_tier.is_some())
    .bind(u.priority_tier.map(i64::from))
    .bind(key.id)
    .fetch_one(pool)
    .await?;
    let key = to_info(row);
    tracing::info!(key_id = key.id, name = %key.name, "updated API key");
    Ok(key)
}

/// Gives an active key a new secret; the old one stops working at once. The key keeps its id,
/// settings, budget and usage history.
pub(crate) async fn rotate(pool: &AnyPool, id_or_name: &str) -> Result<CreatedKey, AccountsError> {
    let key = resolve(pool, id_or_name.trim()).await?;
    if !key.is_active() {
        return Err(AccountsError::KeyRevoked);
    }
    let secret = generate_secret();
    let row: KeyRow = sqlx::query_as(&format!(
        "UPDATE api_keys SET prefix = $1, secret_hash = $2 WHERE id = $3 AND revoked_at IS NULL RETURNING {KEY_COLUMNS}"
    ))
    .bind(display_prefix(&secret))
    .bind(hash_secret(&secret))
    .bind(key.id)
    .fetch_optional(pool)
    .await?
    .ok_or(AccountsError::KeyRevoked)?;
    let key = to_info(row);
    tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "rotated API key");
    Ok(CreatedKey { key, secret })
}

pub(crate) async fn find(pool: &AnyPool, id_or_name: &str) -> Result<KeyInfo, AccountsError> {
    resolve(pool, id_or_name.trim()).await
}

pub(crate) async fn ensure_key(pool: &AnyPool, secret: &str, name: &str) -> Result<KeyInfo, AccountsError> {
    if !looks_like_key(secret) {
        return Err(AccountsError::Invalid(format!(
            "API key must be {MIN_KEY_LEN}..={MAX_KEY_LEN} printable ASCII characters without whitespace"
        )));
    }
    let name = validate_name(name)?;
    let hash = hash_secret(secret);
    let inserted = sqlx::query(
        "INSERT INTO api_keys (name, prefix, secret_hash, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (secret_hash) DO NOTHING",
    )
    .bind(name)
    .bind(display_prefix(secret))
    .bind(&hash)
    .bind(now_unix())
    .execute(pool)
    .await?
    .rows_affected();
    let key =
        find_by_hash(pool, &hash).await?.ok_or_else(|| AccountsError::NotFound("key vanished after insert".into()))?;
    if !key.is_active() {
        return Err(AccountsError::KeyRevoked);
    }
    if inserted > 0 {
        tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "registered API key");
    }
    Ok(key)
}

async fn find_by_hash(pool: &AnyPool, hash: &str) -> Result<Option<KeyInfo>, AccountsError> {
    let row: Option<KeyRow> = sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE secret_hash = $1"))
        .bind(hash)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(to_info))
}

pub(crate) async fn list_keys(pool: &AnyPool) -> Result<Vec<KeyInfo>, AccountsError> {
    let rows: Vec<KeyRow> =
        sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY id")).fetch_all(pool).await?;
    Ok(rows.into_iter().map(to_info).collect())
}

pub(crate) async fn count_active_keys(pool: &AnyPool) -> Result<u64, AccountsError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL").fetch_one(pool).await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The key a presented secret belongs to, unless unknown or revoked. Expired keys are returned
/// (the caller tells the client why it is refused).
pub(crate) async fn authenticate(pool: &AnyPool, secret: &str) -> Result<Option<KeyInfo>, AccountsError> {
    if !looks_like_key(secret) {
        return Ok(None);
    }
    let hash = hash_secret(secret);
    let row: Option<(String, KeyRow)> =
        sqlx::query(&format!("SELECT secret_hash, {KEY_COLUMNS} FROM api_keys WHERE secret_hash = $1"))
            .bind(&hash)
            .fetch_optional(pool)
            .await?
            .map(|r| {
                use sqlx::{FromRow, Row};
                Ok::<_, sqlx::Error>((r.try_get::<String, _>("secret_hash")?, KeyRow::from_row(&r)?))
            })
            .transpose()?;
    let Some((stored_hash, row)) = row else {
        return Ok(None);
    };
    let matches: bool = stored_hash.as_bytes().ct_eq(hash.as_bytes()).into();
    if !matches || row.revoked_at.is_some() {
        return Ok(None);
    }
    Ok(Some(to_info(row)))
}

/// Resolves `id_or_name` (numeric id, then name, then display prefix; a full `sk-gantry-`
/// secret is matched by hash) and revokes that key.
/// Revoking an already revoked key returns it unchanged.
pub(crate) async fn revoke_key(pool: &AnyPool, id_or_name: &str) -> Result<KeyInfo, AccountsError> {
    let key = resolve(pool, id_or_name.trim()).await?;
    if key.is_active() {
        sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now_unix())
            .bind(key.id)
            .execute(pool)
            .await?;
        tracing::info!(key_id = key.id, name = %key.name, prefix = %key.prefix, "revoked API key");
    }
    let row: KeyRow = sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"))
        .bind(key.id)
        .fetch_one(pool)
        .await?;
    Ok(to_info(row))
}

async fn resolve(pool: &AnyPool, what: &str) -> Result<KeyInfo, AccountsError> {
    if what.is_empty() {
        return Err(AccountsError::NotFound("empty key id or name".into()));
    }
    if let Ok(id) = what.parse::<i64>() {
        let row: Option<KeyRow> = sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"))
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
    // Names and prefixes together: a key named like another key's prefix must not shadow it
    // (revoking a leaked key by its prefix would revoke the decoy instead).
    let rows: Vec<KeyRow> =
        sqlx::query_as(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE name = $1 OR prefix = $1 ORDER BY id"))
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
        0 => {}
        1 => return Ok(keys.remove(0)),
        n => {
            return Err(AccountsError::Ambiguous(format!(
                "{n} keys have the name or prefix {what:?}; use the numeric id"
            )))
        }
    }
    Err(AccountsError::NotFound(format!("no API key with id, name or prefix {what:?}")))
}
