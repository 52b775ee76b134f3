//! Tenants' settings. A tenant exists by name on its keys (`api_keys.tenant`); a row in `tenants`
//! records only what an operator set for it: the weight its keys together share the engine by
//! (weighted fair sharing, see the engine's `scheduler::queue`).

use serde::Serialize;
use sqlx::AnyPool;

use crate::keys::store::{validate_tenant, validate_weight};
use crate::AccountsError;

/// A tenant as the admin API and `gantry tenants` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantInfo {
    pub name: String,
    /// 1 unless set.
    pub weight: i64,
    /// Keys of the tenant that are not revoked.
    pub active_keys: i64,
}

const TENANT_ROWS: &str = "SELECT n.name, COALESCE(t.weight, 1) AS weight, \
       (SELECT COUNT(*) FROM api_keys k WHERE k.tenant = n.name AND k.revoked_at IS NULL) AS active_keys \
     FROM (SELECT tenant AS name FROM api_keys UNION SELECT name FROM tenants) n \
     LEFT JOIN tenants t ON t.name = n.name";

#[derive(sqlx::FromRow)]
struct TenantRow {
    name: String,
    weight: i64,
    active_keys: i64,
}

impl From<TenantRow> for TenantInfo {
    fn from(r: TenantRow) -> Self {
        Self { name: r.name, weight: r.weight, active_keys: r.active_keys }
    }
}

/// Every tenant named by a key or given a setting, by name.
pub(crate) async fn list(pool: &AnyPool) -> Result<Vec<TenantInfo>, AccountsError> {
    let rows: Vec<TenantRow> = sqlx::query_as(&format!("{TENANT_ROWS} ORDER BY n.name")).fetch_all(pool).await?;
    Ok(rows.into_iter().map(TenantInfo::from).collect())
}

/// The tenant `name`; not found unless a key names it or it was given a setting.
pub(crate) async fn find(pool: &AnyPool, name: &str) -> Result<TenantInfo, AccountsError> {
    let row: Option<TenantRow> =
        sqlx::query_as(&format!("{TENANT_ROWS} WHERE n.name = $1")).bind(name.trim()).fetch_optional(pool).await?;
    row.map(TenantInfo::from).ok_or_else(|| AccountsError::NotFound(format!("no tenant named {:?}", name.trim())))
}

/// Sets the weight of tenant `name` (which may have no key yet: its keys get it once made).
pub(crate) async fn set_weight(pool: &AnyPool, name: &str, weight: i64) -> Result<TenantInfo, AccountsError> {
    let name = validate_tenant(name)?;
    validate_weight("tenant", Some(weight))?;
    sqlx::query(
        "INSERT INTO tenants (name, weight) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET weight = excluded.weight",
    )
    .bind(name)
    .bind(weight)
    .execute(pool)
    .await?;
    tracing::info!(tenant = %name, weight, "set tenant weight");
    find(pool, name).await
}
