//! `/admin/v1`: key management and usage reports over HTTP, for operators. Guarded by the
//! admin token (`--admin-token`), never by an ordinary API key; without a token configured the
//! admin API is off.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gantry_accounts::{AccountsError, RequestRow, UsageQuery, UsageRow};
use gantry_api::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::admin_guard::FailureThrottle;
use crate::keyspec::{key_view, parse_time, KeyFields};
use crate::state::AppState;

pub(crate) fn router(state: AppState) -> Router<AppState> {
    // One throttle per router: the admin API is served by one listener at a time.
    let gate = AdminGate { state, throttle: Arc::new(FailureThrottle::default()) };
    Router::new()
        .route("/keys", get(list_keys).post(create_key))
        .route("/keys/{key}", get(show_key).patch(update_key).delete(revoke_key))
        .route("/keys/{key}/rotate", post(rotate_key))
        .route("/usage", get(usage))
        .route("/usage/requests", get(usage_requests))
        .route("/stats", get(stats))
        .merge(crate::admin_models::router())
        .route_layer(middleware::from_fn_with_state(gate, require_admin))
}

#[derive(Clone)]
struct AdminGate {
    state: AppState,
    throttle: Arc<FailureThrottle>,
}

async fn require_admin(State(gate): State<AdminGate>, req: Request, next: Next) -> Response {
    let Some(token) = gate.state.admin_token.as_deref() else {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "The admin API is disabled; start the server with --admin-token (or GANTRY_ADMIN_TOKEN) to enable it.",
            None,
            Some("admin_api_disabled"),
        )
        .into_response();
    };
    // Without a peer address (a router driven in-process) every caller shares one bucket.
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ConnectInfo(addr)| addr.ip());
    let now = Instant::now();
    if let Some(wait) = gate.throttle.locked_for(client, now) {
        return too_many_failures(wait);
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    if !crate::admin_guard::token_matches(presented, token) {
        if let Some(wait) = gate.throttle.failed(client, now) {
            tracing::warn!(%client, lockout_seconds = wait.as_secs(), "too many wrong admin tokens: address locked out");
            return too_many_failures(wait);
        }
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "The admin API needs the admin token (Authorization: Bearer <admin token>); API keys are not accepted here.",
            None,
            Some("invalid_admin_token"),
        )
        .into_response();
    }
    gate.throttle.succeeded(client);
    next.run(req).await
}

fn too_many_failures(wait: Duration) -> Response {
    let seconds = wait.as_secs().max(1);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "invalid_request_error",
        format!("Too many wrong admin tokens from this address; try again in {seconds} s."),
        None,
        Some("admin_auth_throttled"),
    )
    .with_retry_after(seconds)
    .into_response()
}

/// `GET /admin/v1/stats`: the live figures and their 15-minute history.
async fn stats(State(state): State<AppState>) -> Json<Value> {
    Json(state.stats.view())
}

fn accounts_error(e: AccountsError) -> ApiError {
    match e {
        AccountsError::NotFound(m) => ApiError::not_found(m),
        AccountsError::Ambiguous(m) | AccountsError::Invalid(m) => ApiError::invalid_request(m, None),
        AccountsError::KeyRevoked => ApiError::invalid_request("That key is revoked.", None),
        other => {
            tracing::error!(error = %other, "admin API accounts error");
            ApiError::internal("The accounts database failed; see the server log.")
        }
    }
}

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
async fn list_keys(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let keys = state.accounts.list_keys().await.map_err(accounts_error)?;
    let now = crate::clock::now_ms();
    let mut data = Vec::with_capacity(keys.len());
    for k in &keys {
        let spend = state.accounts.spend(k, now).await.map_err(accounts_error)?;
        data.push(key_view(k, Some(&spend)));
    }
    Ok(Json(json!({"object": "list", "data": data})))
}

async fn create_key(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let spec = parse_fields(&body)?.to_new_key().map_err(|m| ApiError::invalid_request(m, None))?;
    let created = state.accounts.create_key_from(&spec).await.map_err(accounts_error)?;
    let mut v = key_view(&created.key, None);
    v["secret"] = Value::String(created.secret);
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

async fn show_key(State(state): State<AppState>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    let k = state.accounts.find_key(&key).await.map_err(accounts_error)?;
    let spend = state.accounts.spend(&k, crate::clock::now_ms()).await.map_err(accounts_error)?;
    Ok(Json(key_view(&k, Some(&spend))))
}

async fn update_key(
    State(state): State<AppState>,
    Path(key): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let update = parse_fields(&body)?.to_update().map_err(|m| ApiError::invalid_request(m, None))?;
    let k = state.accounts.update_key(&key, &update).await.map_err(accounts_error)?;
    Ok(Json(key_view(&k, None)))
}

async fn revoke_key(State(state): State<AppState>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    let k = state.accounts.revoke_key(&key).await.map_err(accounts_error)?;
    Ok(Json(key_view(&k, None)))
}

async fn rotate_key(State(state): State<AppState>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    let created = state.accounts.rotate_key(&key).await.map_err(accounts_error)?;
    let mut v = key_view(&created.key, None);
    v["secret"] = Value::String(created.secret);
    Ok(Json(v))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageParams {
    pub key_name: Option<String>,
    pub tenant: Option<String>,
    pub model: Option<String>,
    /// RFC 3339 time or a date.
    pub since: Option<String>,
    pub until: Option<String>,
    /// `day` adds one row per UTC day.
    pub group_by: Option<String>,
    /// `json` (default) or `csv`.
    pub format: Option<String>,
}

impl UsageParams {
    pub(crate) fn to_query(&self) -> Result<UsageQuery, String> {
        let by_day = match self.group_by.as_deref() {
            None | Some("") | Some("key") => false,
            Some("day") => true,
            Some(other) => return Err(format!("group_by must be `day`, not {other:?}")),
        };
        Ok(UsageQuery {
            key_name: self.key_name.clone(),
            tenant: self.tenant.clone(),
            model: self.model.clone(),
            since_ms: self.since.as_deref().map(parse_time).transpose()?.map(|s| s * 1000),
            until_ms: self.until.as_deref().map(parse_time).transpose()?.map(|s| s * 1000),
            by_day,
        })
    }
}

async fn usage(
    State(state): State<AppState>,
    params: Result<Query<UsageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid_request(e.body_text(), None))?;
    let query = params.to_query().map_err(|m| ApiError::invalid_request(m, None))?;
    let rows = state.accounts.usage_report(&query).await.map_err(accounts_error)?;
    match params.format.as_deref() {
        None | Some("json") => Ok(Json(json!({"object": "list", "data": rows})).into_response()),
        Some("csv") => Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], usage_csv(&rows)).into_response()),
        Some(other) => {
            Err(ApiError::invalid_request(format!("format must be `json` or `csv`, not {other:?}"), Some("format")))
        }
    }
}

/// One row per request: `GET /admin/v1/usage/requests` with the filters of `/usage`.
async fn usage_requests(
    State(state): State<AppState>,
    params: Result<Query<UsageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid_request(e.body_text(), None))?;
    if params.group_by.is_some() {
        return Err(ApiError::invalid_request("group_by does not apply to the per-request listing", Some("group_by")));
    }
    let query = params.to_query().map_err(|m| ApiError::invalid_request(m, None))?;
    let rows = state.accounts.usage_requests(&query).await.map_err(accounts_error)?;
    match params.format.as_deref() {
        None | Some("json") => Ok(Json(json!({"object": "list", "data": rows})).into_response()),
        Some("csv") => Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], requests_csv(&rows)).into_response()),
        Some(other) => {
            Err(ApiError::invalid_request(format!("format must be `json` or `csv`, not {other:?}"), Some("format")))
        }
    }
}

/// CSV of the per-request listing; the same text `gantry usage --requests --format csv` prints.
pub(crate) fn requests_csv(rows: &[RequestRow]) -> String {
    let mut out = String::from(
        "request_id,client_request_id,key_name,tenant,model,prompt_tokens,cached_tokens,completion_tokens,cost,outcome,started_at_ms,finished_at_ms\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.9},{},{},{}\n",
            r.request_id,
            r.client_request_id.as_deref().unwrap_or(""),
            csv_field(&r.key_name),
            csv_field(&r.tenant),
            csv_field(&r.model),
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            r.cost,
            r.outcome,
            r.started_at_ms,
            r.finished_at_ms
        ));
    }
    out
}

/// CSV with a header row; the same text `gantry usage --format csv` prints.
pub(crate) fn usage_csv(rows: &[UsageRow]) -> String {
    let mut out =
        String::from("key_name,tenant,model,day,requests,prompt_tokens,cached_tokens,completion_tokens,cost\n");
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.9}\n",
            csv_field(&r.key_name),
            csv_field(&r.tenant),
            csv_field(&r.model),
            r.day.as_deref().unwrap_or(""),
            r.requests,
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            r.cost
        ));
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
