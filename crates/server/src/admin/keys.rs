//! `/admin/v1/keys`: listing, creating, showing, updating, revoking and rotating API keys.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_api::ApiError;
use serde_json::{json, Value};

use crate::admin::keyspec::{key_view, KeyFields};
use crate::errors::IntoApiError;
use crate::state::AppState;

fn parse_fields(body: &Bytes) -> Result<KeyFields, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        // A bad cache scope is named, with the values it may take.
        let scope = serde_json::from_slice::<Value>(body).ok().and_then(|v| v.get("cache_scope").cloned());
        if scope.is_some_and(|s| serde_json::from_value::<Option<gantry_accounts::CacheScopeSetting>>(s).is_err()) {
            return ApiError::invalid_request(
                "Invalid 'cache_scope': it must be \"tenant\", \"key\" or \"shared\".",
                Some("cache_scope"),
            );
        }
        ApiError::invalid_request(format!("Invalid key JSON: {e}"), None)
    })
}

/// Every key with its spend this budget period (the console draws it against the budget).
pub(super) async fn list_keys(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let keys = state.accounts.list_keys().await.map_err(IntoApiError::into_api_error)?;
    let now = crate::clock::now_ms();
    let mut data = Vec::with_capacity(keys.len());
    for k in &keys {
        let spend = state.accounts.spend(k, now).await.map_err(IntoApiError::into_api_error)?;
        data.push(key_view(k, Some(&spend)));
    }
    Ok(Json(json!({"object": "list", "data": data})))
}

pub(super) async fn create_key(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let spec = parse_fields(&body)?.to_new_key().map_err(|m| ApiError::invalid_request(m, None))?;
    let created = state.accounts.create_key_from(&spec).await.map_err(IntoApiError::into_api_error)?;
    let mut v = key_view(&created.key, None);
    v["secret"] = Value::String(created.secret);
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

pub(super) async fn show_key(State(state): State<AppState>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    let k = state.accounts.find_key(&key).await.map_err(IntoApiError::into_api_error)?;
    let spend = state.accounts.spend(&k, crate::clock::now_ms()).await.map_err(IntoApiError::into_api_error)?;
    Ok(Json(key_view(&k, Some(&spend))))
}

pub(super) async fn update_key(
    State(state): State<AppState>,
    Path(key): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let update = parse_fields(&body)?.to_update().map_err(|m| ApiError::invalid_request(m, None))?;
    let k = state.accounts.update_key(&key, &update).await.map_err(IntoApiError::into_api_error)?;
    Ok(Json(key_view(&k, None)))
}

pub(super) async fn revoke_key(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let k = state.accounts.revoke_key(&key).await.map_err(IntoApiError::into_api_error)?;
    Ok(Json(key_view(&k, None)))
}

pub(super) async fn rotate_key(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let created = state.accounts.rotate_key(&key).await.map_err(IntoApiError::into_api_error)?;
    let mut v = key_view(&created.key, None);
    v["secret"] = Value::String(created.secret);
    Ok(Json(v))
}
