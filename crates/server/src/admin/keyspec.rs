//! Key settings as people write them (USD, RFC 3339 dates, model lists), shared by the
//! `gantry keys` commands and the admin HTTP API so both take exactly one path into accounts.

use gantry_accounts::{Budget, BudgetPeriod, CacheScopeSetting, KeyInfo, KeyUpdate, NewKey, Spend, NANOS_PER_USD};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Fields of a key create or update. On update an absent field is left alone and `null`
/// clears an optional setting (unlimited, no expiry, every model).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFields {
    pub name: Option<String>,
    pub tenant: Option<String>,
    #[serde(default, deserialize_with = "some")]
    pub rpm_limit: Option<Option<i64>>,
    #[serde(default, deserialize_with = "some")]
    pub tpm_limit: Option<Option<i64>>,
    #[serde(default, deserialize_with = "some")]
    pub budget_tokens: Option<Option<i64>>,
    #[serde(default, deserialize_with = "some")]
    pub budget_usd: Option<Option<f64>>,
    pub budget_period: Option<BudgetPeriod>,
    #[serde(default, deserialize_with = "some")]
    pub models: Option<Option<Vec<String>>>,
    /// RFC 3339, e.g. `2027-01-01T00:00:00Z`.
    #[serde(default, deserialize_with = "some")]
    pub expires_at: Option<Option<String>>,
    /// Whose cached prompt prefixes the key's requests reuse: `tenant` (default), `key`, `shared`.
    pub cache_scope: Option<CacheScopeSetting>,
    /// The key's share of the engine among its tenant's keys (default 1).
    pub weight: Option<i64>,
    /// Whether the key's requests may run in `service_tier: "priority"` (default false).
    pub priority_tier: Option<bool>,
}

/// Present (even as `null`) → `Some(..)`; absent → `None` via `#[serde(default)]`.
fn some<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl KeyFields {
    pub fn to_new_key(&self) -> Result<NewKey, String> {
        let name = self.name.clone().ok_or("`name` is required")?;
        Ok(NewKey {
            name,
            tenant: self.tenant.clone(),
            rpm_limit: self.rpm_limit.flatten(),
            tpm_limit: self.tpm_limit.flatten(),
            budget: Budget {
                tokens: self.budget_tokens.flatten(),
                nanos: self.budget_usd.flatten().map(usd_to_nanos).transpose()?,
                period: self.budget_period.unwrap_or_default(),
            },
            allowed_models: self.models.clone().flatten().map(clean_models),
            expires_at: self.expires_at.as_ref().and_then(|e| e.as_deref()).map(parse_future_time).transpose()?,
            cache_scope: self.cache_scope.unwrap_or_default(),
            weight: self.weight,
            priority_tier: self.priority_tier.unwrap_or(false),
        })
    }

    pub fn to_update(&self) -> Result<KeyUpdate, String> {
        Ok(KeyUpdate {
            name: self.name.clone(),
            tenant: self.tenant.clone(),
            rpm_limit: self.rpm_limit,
            tpm_limit: self.tpm_limit,
            budget_tokens: self.budget_tokens,
            budget_nanos: self.budget_usd.map(|b| b.map(usd_to_nanos).transpose()).transpose()?,
            budget_period: self.budget_period,
            allowed_models: self.models.clone().map(|m| m.map(clean_models)),
            expires_at: self.expires_at.as_ref().map(|e| e.as_deref().map(parse_time).transpose()).transpose()?,
            cache_scope: self.cache_scope,
            weight: self.weight,
            priority_tier: self.priority_tier,
        })
    }
}

fn clean_models(models: Vec<String>) -> Vec<String> {
    models.into_iter().map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect()
}

pub(crate) fn usd_to_nanos(usd: f64) -> Result<i64, String> {
    if !usd.is_finite() || usd <= 0.0 || usd > 1e9 {
        return Err(format!("a money budget must be a positive number of USD, not {usd}"));
    }
    Ok((usd * NANOS_PER_USD as f64).round() as i64)
}

/// RFC 3339 (`2027-01-01T00:00:00Z`) or a bare date (`2027-01-01`, midnight UTC) → unix seconds.
pub(crate) fn parse_time(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t.unix_timestamp());
    }
    let date = time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]"))
        .map_err(|_| format!("{s:?} is not an RFC 3339 time (2027-01-01T00:00:00Z) or a date (2027-01-01)"))?;
    Ok(date.midnight().assume_utc().unix_timestamp())
}

/// A new key's expiry: a time already past would make a key that never works, most likely a
/// typo in the year. (An update may set one: that is how a key is expired now and kept listed.)
fn parse_future_time(s: &str) -> Result<i64, String> {
    let t = parse_time(s)?;
    if t <= OffsetDateTime::now_utc().unix_timestamp() {
        return Err(format!("the expiry {s:?} is already past: a key created with it would never work"));
    }
    Ok(t)
}

pub(crate) fn format_time(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| unix.to_string())
}

/// The JSON view of a key (never its secret), with its current spend when known.
pub(crate) fn key_view(k: &KeyInfo, spend: Option<&Spend>) -> Value {
    let status = if !k.is_active() {
        "revoked"
    } else if k.is_expired() {
        "expired"
    } else {
        "active"
    };
    let mut v = json!({
        "object": "api_key",
        "id": k.id,
        "name": k.name,
        "tenant": k.tenant,
        "prefix": k.prefix,
        "status": status,
        "created_at": format_time(k.created_at),
        "revoked_at": k.revoked_at.map(format_time),
        "expires_at": k.expires_at.map(format_time),
        "rpm_limit": k.rpm_limit,
        "tpm_limit": k.tpm_limit,
        "budget_tokens": k.budget.tokens,
        "budget_usd": k.budget.nanos.map(nanos_to_usd),
        "budget_period": k.budget.period,
        "models": k.allowed_models,
        "cache_scope": k.cache_scope,
        "weight": k.weight,
        "tenant_weight": k.tenant_weight,
        "priority_tier": k.priority_tier,
    });
    if let Some(s) = spend {
        v["spend"] = json!({
            "tokens": s.spent_tokens,
            "usd": nanos_to_usd(s.spent_nanos),
            "reserved_tokens": s.reserved_tokens,
            "reserved_usd": nanos_to_usd(s.reserved_nanos),
        });
    }
    v
}

pub(crate) fn nanos_to_usd(n: i64) -> f64 {
    n as f64 / NANOS_PER_USD as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_distinguishes_absent_from_null() {
        let f: KeyFields = serde_json::from_str(r#"{"rpm_limit": null, "budget_usd": 2.5}"#).unwrap();
        let u = f.to_update().unwrap();
        assert_eq!(u.rpm_limit, Some(None));
        assert_eq!(u.tpm_limit, None);
        assert_eq!(u.budget_nanos, Some(Some(2_500_000_000)));
    }

    #[test]
    fn create_needs_a_name_and_valid_values() {
        let f: KeyFields = serde_json::from_str(r#"{"tenant": "acme"}"#).unwrap();
        assert!(f.to_new_key().unwrap_err().contains("name"));
        let f: KeyFields = serde_json::from_str(r#"{"name": "a", "budget_usd": -1}"#).unwrap();
        assert!(f.to_new_key().is_err());
        let f: KeyFields = serde_json::from_str(r#"{"name": "a", "expires_at": "soon"}"#).unwrap();
        assert!(f.to_new_key().unwrap_err().contains("RFC 3339"));
        let f: KeyFields = serde_json::from_str(r#"{"name": "a", "expires_at": "2020-01-01"}"#).unwrap();
        assert!(f.to_new_key().unwrap_err().contains("already past"));
        // An update may expire a key now.
        assert_eq!(f.to_update().unwrap().expires_at, Some(Some(1_577_836_800)));
        let f: KeyFields = serde_json::from_str(r#"{"name": "a", "expires_at": "2999-01-01"}"#).unwrap();
        assert!(f.to_new_key().unwrap().expires_at.is_some());
        assert!(serde_json::from_str::<KeyFields>(r#"{"name": "a", "colour": "red"}"#).is_err());
    }

    #[test]
    fn cache_scope_defaults_to_tenant_on_create_and_is_left_alone_on_update() {
        let f: KeyFields = serde_json::from_str(r#"{"name": "a"}"#).unwrap();
        let (created, updated) = (f.to_new_key().unwrap(), f.to_update().unwrap());
        assert_eq!((created.cache_scope, updated.cache_scope), (CacheScopeSetting::Tenant, None));
        let f: KeyFields = serde_json::from_str(r#"{"name": "a", "cache_scope": "key"}"#).unwrap();
        assert_eq!(f.to_new_key().unwrap().cache_scope, CacheScopeSetting::Key);
        assert_eq!(f.to_update().unwrap().cache_scope, Some(CacheScopeSetting::Key));
        assert!(serde_json::from_str::<KeyFields>(r#"{"name": "a", "cache_scope": "org"}"#).is_err());
        let null: KeyFields = serde_json::from_str(r#"{"name": "a", "cache_scope": null}"#).unwrap();
        assert!(null.cache_scope.is_none());
    }

    #[test]
    fn times_parse_as_rfc3339_or_dates() {
        assert_eq!(parse_time("2027-01-01T00:00:00Z").unwrap(), 1_798_761_600);
        assert_eq!(parse_time("2027-01-01").unwrap(), 1_798_761_600);
        assert_eq!(format_time(1_798_761_600), "2027-01-01T00:00:00Z");
    }
}
