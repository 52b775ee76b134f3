//! A key's prompt-cache scope: which other requests may reuse the prompt prefixes its requests
//! leave in the cache, and whose prefixes its requests may reuse. Reuse shows in the response
//! (`cached_tokens`, time to first token), so a shared cache lets one client test guesses of
//! another's prompts; OpenAI scopes its prompt cache to the organization, as `tenant` does here.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::KeyInfo;

/// The setting stored on a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScopeSetting {
    /// Shared by every key of the key's tenant.
    #[default]
    Tenant,
    /// This key's alone.
    Key,
    /// Shared by every key whose setting is `shared`, whatever their tenant.
    Shared,
}

/// The scope id of every `shared` key; tenant and key scopes are never 0.
pub const SHARED_CACHE_SCOPE: u64 = 0;

impl CacheScopeSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheScopeSetting::Tenant => "tenant",
            CacheScopeSetting::Key => "key",
            CacheScopeSetting::Shared => "shared",
        }
    }
}

impl fmt::Display for CacheScopeSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CacheScopeSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "tenant" => Ok(CacheScopeSetting::Tenant),
            "key" => Ok(CacheScopeSetting::Key),
            "shared" => Ok(CacheScopeSetting::Shared),
            other => Err(format!("cache scope must be tenant, key or shared, not {other:?}")),
        }
    }
}

/// A stable nonzero id for `value` of `kind` (a tenant name, a key id): the same on every replica
/// and across restarts, apart between kinds.
pub(crate) fn digest(kind: &str, value: &str) -> u64 {
    let d = Sha256::new().chain_update(kind).chain_update([0]).chain_update(value).finalize();
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes")).max(1)
}

impl KeyInfo {
    /// The id of the prompt-cache scope this key's requests run in: a digest of the tenant name
    /// or of the key id (the same on every replica and across restarts), or
    /// [`SHARED_CACHE_SCOPE`]. Tenant and key digests are taken over distinct prefixes, so a
    /// tenant named like a key id gets another scope.
    pub fn cache_scope_id(&self) -> u64 {
        match self.cache_scope {
            CacheScopeSetting::Tenant => digest("tenant", &self.tenant),
            CacheScopeSetting::Key => digest("key", &self.id.to_string()),
            CacheScopeSetting::Shared => SHARED_CACHE_SCOPE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Budget;

    fn key(id: i64, tenant: &str, cache_scope: CacheScopeSetting) -> KeyInfo {
        KeyInfo {
            id,
            name: format!("k{id}"),
            tenant: tenant.into(),
            prefix: "sk-gantry-AbCd".into(),
            created_at: 0,
            revoked_at: None,
            expires_at: None,
            rpm_limit: None,
            tpm_limit: None,
            budget: Budget::default(),
            allowed_models: None,
            cache_scope,
            weight: 1,
            tenant_weight: 1,
            priority_tier: false,
        }
    }

    #[test]
    fn tenants_keys_and_shared_keys_get_apart_scopes() {
        use CacheScopeSetting::*;
        let scope = |id, tenant, setting| key(id, tenant, setting).cache_scope_id();
        assert_eq!(scope(1, "acme", Tenant), scope(2, "acme", Tenant), "one tenant, one scope");
        assert_ne!(scope(1, "acme", Tenant), scope(3, "globex", Tenant));
        assert_ne!(scope(1, "acme", Key), scope(2, "acme", Key), "a key-scoped key shares with no one");
        assert_ne!(scope(1, "acme", Key), scope(1, "acme", Tenant));
        assert_ne!(scope(1, "1", Key), scope(2, "1", Tenant), "a tenant named like a key id");
        assert_eq!(scope(1, "acme", Shared), scope(3, "globex", Shared));
        assert_eq!(scope(1, "acme", Shared), SHARED_CACHE_SCOPE);
        assert_ne!(scope(1, "acme", Tenant), SHARED_CACHE_SCOPE);
    }

    #[test]
    fn settings_parse_and_print_as_stored() {
        for s in [CacheScopeSetting::Tenant, CacheScopeSetting::Key, CacheScopeSetting::Shared] {
            assert_eq!(s.as_str().parse::<CacheScopeSetting>(), Ok(s));
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
        }
        assert!("org".parse::<CacheScopeSetting>().unwrap_err().contains("tenant, key or shared"));
    }
}
