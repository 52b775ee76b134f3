//! `/admin/v1/tenants`: the tenants keys name, and the weight each shares the engine by.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use gantry_api::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::errors::IntoApiError;
use crate::state::AppState;

/// What `PATCH /admin/v1/tenants/{tenant}` may change.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFields {
    weight: i64,
}

fn tenant_view(t: &gantry_accounts::TenantInfo) -> Value {
    json!({"object": "tenant", "name": t.name, "weight": t.weight, "active_keys": t.active_keys})
}

pub(super) async fn list_tenants(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let tenants = state.accounts.list_tenants().await.map_err(IntoApiError::into_api_error)?;
    Ok(Json(json!({"object": "list", "data": tenants.iter().map(tenant_view).collect::<Vec<_>>()})))
}

pub(super) async fn show_tenant(
    State(state): State<AppState>,
    Path(tenant): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let t = state.accounts.find_tenant(&tenant).await.map_err(IntoApiError::into_api_error)?;
    Ok(Json(tenant_view(&t)))
}

/// Sets a tenant's weight; a tenant no key names yet may be given one ahead of its keys.
pub(super) async fn update_tenant(
    State(state): State<AppState>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let fields: TenantFields = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid_request(format!("Invalid tenant JSON: {e}"), Some("weight")))?;
    let t = state.accounts.set_tenant_weight(&tenant, fields.weight).await.map_err(IntoApiError::into_api_error)?;
    Ok(Json(tenant_view(&t)))
}
