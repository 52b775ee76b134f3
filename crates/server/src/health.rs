//! Liveness (`/health`, also routed as `/health/live`: 503 once the engine failed) and
//! readiness (`/health/ready`), as load balancers and Kubernetes probe them.
//!
//! Liveness says whether the process should be restarted (its engine failed); readiness says
//! whether it should get traffic (not draining, engine healthy, accounts database reachable).
//! They differ on purpose: a replica whose database is briefly unreachable is taken out of the
//! load balancer, not killed, and comes back when the database does.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::state::AppState;

/// How long readiness waits for the database before calling it unreachable: probes have
/// timeouts of their own (Kubernetes' default is 1 s), so answer within them.
const DATABASE_PING_TIMEOUT: Duration = Duration::from_millis(800);

/// `GET /health/ready`: 200 when this replica should get requests; 503 with the reason while it
/// drains, after its engine failed, or while the accounts database does not answer (why is
/// logged, not shown).
pub(crate) async fn ready(State(state): State<AppState>) -> Response {
    if state.draining.is_draining() {
        return unavailable("draining", None);
    }
    if let Some(why) = state.models.failure() {
        return unavailable("failed", Some(why));
    }
    // The database's error names hosts, users and databases: it goes to the log, and the
    // unauthenticated probe only says which check failed.
    match tokio::time::timeout(DATABASE_PING_TIMEOUT, state.accounts.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the accounts database does not answer");
            return unavailable("database_unreachable", None);
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = DATABASE_PING_TIMEOUT.as_millis() as u64,
                "readiness: the accounts database does not answer in time"
            );
            return unavailable("database_unreachable", None);
        }
    }
    let loaded: Vec<String> = state.models.status().into_iter().filter(|m| m.loaded).map(|m| m.id).collect();
    Json(json!({"status": "ready", "loaded_models": loaded})).into_response()
}

/// 503 once an engine failed: load balancers stop sending traffic while the process exits.
pub(crate) async fn live(State(state): State<AppState>) -> Response {
    let models: Vec<&str> = state.models.specs().iter().map(|s| s.id.as_str()).collect();
    // `model` is the first (with one model, the only) one, for clients that expect one model.
    let model = models.first().copied().unwrap_or_default();
    match state.models.failure() {
        None => Json(json!({"status": "ok", "model": model, "models": models})).into_response(),
        Some(why) => {
            let body = json!({"status": "failed", "model": model, "models": models, "error": why});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

fn unavailable(status: &str, error: Option<String>) -> Response {
    let body = match error {
        Some(e) => json!({"status": status, "error": e}),
        None => json!({"status": status}),
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}
