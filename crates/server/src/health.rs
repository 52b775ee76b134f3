//! Readiness, as load balancers and Kubernetes probe it, and the draining state a SIGTERM starts.
//! Liveness is `/health` itself (503 once the engine failed), also routed as `/health/live`.
//!
//! Liveness says whether the process should be restarted (its engine failed); readiness says
//! whether it should get traffic (not draining, engine healthy, accounts database reachable).
//! They differ on purpose: a replica whose database is briefly unreachable is taken out of the
//! load balancer, not killed, and comes back when the database does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::app::AppState;

/// How long readiness waits for the database before calling it unreachable: probes have
/// timeouts of their own (Kubernetes' default is 1 s), so answer within them.
const DATABASE_PING_TIMEOUT: Duration = Duration::from_millis(800);

/// Set once, when a shutdown signal arrives: from then on readiness answers 503 and new chat
/// requests are refused, while running ones finish.
#[derive(Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

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

fn unavailable(status: &str, error: Option<String>) -> Response {
    let body = match error {
        Some(e) => json!({"status": status, "error": e}),
        None => json!({"status": status}),
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}
