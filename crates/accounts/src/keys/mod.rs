//! API keys: generation, hashing and storage. Plaintext secrets never reach the database
//! or the logs; only the SHA-256 hex digest and a short display prefix are kept.

use std::fmt;

use rand::distr::Alphanumeric;
use rand::rngs::OsRng;
use rand::{Rng, TryRngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache_scope::CacheScopeSetting;
use crate::money::{Budget, BudgetPeriod};

/// Every generated secret starts with this.
pub const SECRET_PREFIX: &str = "sk-gantry-";
/// Number of random base62 characters after [`SECRET_PREFIX`] (40 * log2(62) ≈ 238 bits).
pub(crate) const SECRET_RANDOM_LEN: usize = 40;
/// Length of the display prefix for generated keys, e.g. `sk-gantry-AbCd`.
pub const DISPLAY_PREFIX_LEN: usize = 14;
/// Shortest and longest strings [`looks_like_key`] accepts.
pub const MIN_KEY_LEN: usize = 20;
pub const MAX_KEY_LEN: usize = 200;
/// Longest accepted key name.
pub(crate) const MAX_NAME_LEN: usize = 200;

/// A stored API key, safe to display.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    pub id: i64,
    pub name: String,
    /// The project or customer the key belongs to; usage is reported per tenant.
    pub tenant: String,
    /// Leading characters of the secret, e.g. `sk-gantry-AbCd`.
    pub prefix: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds; `None` while the key is active.
    pub revoked_at: Option<i64>,
    /// Unix seconds after which the key no longer authenticates; `None` never expires.
    pub expires_at: Option<i64>,
    /// Requests per minute; `None` is unlimited.
    pub rpm_limit: Option<i64>,
    /// Tokens (prompt + max completion) per minute; `None` is unlimited.
    pub tpm_limit: Option<i64>,
    pub budget: Budget,
    /// Model ids the key may use; `None` allows every model.
    pub allowed_models: Option<Vec<String>>,
    /// Whose cached prompt prefixes the key's requests may reuse (see `cache_scope`).
    #[serde(default)]
    pub cache_scope: CacheScopeSetting,
    /// Its share of the engine among its tenant's keys (weighted fair sharing), 1..=`MAX_WEIGHT`.
    #[serde(default = "one")]
    pub weight: i64,
    /// Its tenant's share among tenants (`tenants`), 1 for a tenant never given one.
    #[serde(default = "one")]
    pub tenant_weight: i64,
    /// Whether its requests may run in `service_tier: "priority"` (others asking get `default`).
    #[serde(default)]
    pub priority_tier: bool,
}

fn one() -> i64 {
    1
}

/// The largest weight a key or tenant may have: enough to give one a thousand times another's
/// share, small enough that a typo does not starve everyone else for good.
pub const MAX_WEIGHT: i64 = 1000;

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

    /// True once `now` (unix seconds) has reached the key's expiry.
    pub fn is_expired_at(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|t| now >= t)
    }

    pub fn is_expired(&self) -> bool {
        self.is_expired_at(now_unix())
    }

    /// The id the engine shares by for the key's tenant (a digest of its name).
    pub fn tenant_id(&self) -> u64 {
        crate::cache_scope::digest("tenant", &self.tenant)
    }

    pub fn allows_model(&self, model: &str) -> bool {
        self.allowed_models.as_ref().is_none_or(|m| m.iter().any(|x| x == model))
    }
}

/// Everything settable on a new key (the server's `keyspec` turns what people type into this).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewKey {
    pub name: String,
    pub tenant: Option<String>,
    pub rpm_limit: Option<i64>,
    pub tpm_limit: Option<i64>,
    pub budget: Budget,
    pub allowed_models: Option<Vec<String>>,
    pub expires_at: Option<i64>,
    pub cache_scope: CacheScopeSetting,
    /// `None` weighs 1.
    pub weight: Option<i64>,
    pub priority_tier: bool,
}

/// A partial change to a key: `None` leaves a field alone, `Some(None)` clears an optional one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUpdate {
    pub name: Option<String>,
    pub tenant: Option<String>,
    pub rpm_limit: Option<Option<i64>>,
    pub tpm_limit: Option<Option<i64>>,
    pub budget_tokens: Option<Option<i64>>,
    pub budget_nanos: Option<Option<i64>>,
    pub budget_period: Option<BudgetPeriod>,
    pub allowed_models: Option<Option<Vec<String>>>,
    pub expires_at: Option<Option<i64>>,
    pub cache_scope: Option<CacheScopeSetting>,
    pub weight: Option<i64>,
    pub priority_tier: Option<bool>,
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
        f.debug_struct("CreatedKey").field("key", &self.key).field("secret", &"<redacted>").finish()
    }
}

/// `"sk-gantry-"` followed by 40 base62 characters drawn from the OS RNG.
pub fn generate_secret() -> String {
    let mut rng = OsRng.unwrap_err();
    let mut s = String::with_capacity(SECRET_PREFIX.len() + SECRET_RANDOM_LEN);
    s.push_str(SECRET_PREFIX);
    s.extend((&mut rng).sample_iter(Alphanumeric).take(SECRET_RANDOM_LEN).map(char::from));
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

pub(crate) fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

pub(crate) mod store;

pub(crate) use store::*;
