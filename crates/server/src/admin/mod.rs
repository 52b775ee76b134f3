//! The operator's side: `/admin/v1` (keys, tenants, usage, models, live stats) and the web console.
//! Guarded by the admin token (`--admin-token`), never by an ordinary API key; without a token
//! configured the admin API is off.

/// `GET /console`: the web console's static files.
pub(crate) mod console;
#[cfg(test)]
mod console_tests;
/// The admin token's strength check, comparison and per-address throttle.
pub(crate) mod guard;
/// `/admin/v1/keys`.
mod keys;
/// Key settings as people write them, shared with `gantry keys`.
pub(crate) mod keyspec;
#[cfg(test)]
mod listener_tests;
/// `/admin/v1/models`: model states, loading and unloading by hand.
mod models;
#[cfg(test)]
mod models_tests;
/// The live figures behind `/admin/v1/stats` and the console's overview.
pub(crate) mod stats;
/// `/admin/v1/tenants`: tenants and their weights.
mod tenants;
/// `/admin/v1/usage`: the ledger as JSON or CSV.
mod usage;
#[cfg(test)]
mod usage_tests;

pub(crate) use usage::{csv_field, requests_csv, usage_csv, UsageParams};

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;

use crate::admin::guard::FailureThrottle;
use crate::admin::keys::{create_key, list_keys, revoke_key, rotate_key, show_key, update_key};
use crate::admin::tenants::{list_tenants, show_tenant, update_tenant};
use crate::admin::usage::{usage, usage_requests};
use crate::errors::{AdminRefusal, IntoApiError};
use crate::state::AppState;

/// The admin API, behind `gate`.
pub(crate) fn router(gate: &AdminGate) -> Router<AppState> {
    guarded(
        gate,
        Router::new()
            .route("/keys", get(list_keys).post(create_key))
            .route("/keys/{key}", get(show_key).patch(update_key).delete(revoke_key))
            .route("/keys/{key}/rotate", post(rotate_key))
            .route("/tenants", get(list_tenants))
            .route("/tenants/{tenant}", get(show_tenant).patch(update_tenant))
            .route("/usage", get(usage))
            .route("/usage/requests", get(usage_requests))
            .route("/stats", get(stats))
            .merge(models::router()),
    )
}

/// `routes` behind the admin token, e.g. `/metrics` on the one listener of a server without
/// `--admin-listen`.
pub(crate) fn guarded(gate: &AdminGate, routes: Router<AppState>) -> Router<AppState> {
    routes.route_layer(middleware::from_fn_with_state(gate.clone(), require_admin))
}

/// The admin token's check and its throttle on wrong tokens: one per listener, shared by every
/// route it guards there, so that each route does not give a guesser attempts of its own.
#[derive(Clone)]
pub(crate) struct AdminGate {
    state: AppState,
    throttle: Arc<FailureThrottle>,
}

impl AdminGate {
    pub(crate) fn new(state: AppState) -> Self {
        Self { state, throttle: Arc::new(FailureThrottle::default()) }
    }
}

async fn require_admin(State(gate): State<AdminGate>, req: Request, next: Next) -> Response {
    let Some(token) = gate.state.admin_token.as_deref() else {
        return AdminRefusal::Disabled.into_api_error().into_response();
    };
    // Without a peer address (a router driven in-process) every caller shares one bucket.
    let client = crate::client_addr::of(&req).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let now = Instant::now();
    if let Some(wait) = gate.throttle.locked_for(client, now) {
        return AdminRefusal::Throttled { wait }.into_api_error().into_response();
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::openai::auth::bearer_credentials)
        .map(str::trim)
        .unwrap_or("");
    if !crate::admin::guard::token_matches(presented, token) {
        // A request without any token guessed nothing: counting it would let anyone sharing the
        // operator's address (a browser page's plain GET) lock the operator out.
        if presented.is_empty() {
            return AdminRefusal::WrongToken.into_api_error().into_response();
        }
        if let Some(wait) = gate.throttle.failed(client, now) {
            tracing::warn!(%client, lockout_seconds = wait.as_secs(), "too many wrong admin tokens: address locked out");
            return AdminRefusal::Throttled { wait }.into_api_error().into_response();
        }
        return AdminRefusal::WrongToken.into_api_error().into_response();
    }
    gate.throttle.succeeded(client);
    next.run(req).await
}

/// `GET /admin/v1/stats`: the live figures and their 15-minute history.
async fn stats(State(state): State<AppState>) -> Json<Value> {
    Json(state.stats.view())
}
