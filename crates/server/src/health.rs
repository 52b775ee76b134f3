//! Liveness (`/health`, also routed as `/health/live`: 503 once the engine failed) and
//! readiness (`/health/ready`), as load balancers and Kubernetes probe them.
//!
//! Liveness says whether the process should be restarted (its engine failed); readiness says
//! whether it should get traffic (not draining, engine healthy, accounts database reachable).
//! They differ on purpose: a replica whose database is briefly unreachable is taken out of the
//! load balancer, not killed, and comes back when the database does.
//!
//! Readiness is unauthenticated, so it must not cost a database round trip per request: the
//! database's state is cached and asked again at most once per [`DATABASE_STATE_TTL`], by one
//! request while the others wait for its answer.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::state::AppState;

/// How long readiness waits for the database before calling it unreachable: probes have
/// timeouts of their own (Kubernetes' default is 1 s), so answer within them.
const DATABASE_PING_TIMEOUT: Duration = Duration::from_millis(800);

/// How long an answer from the database stands for it.
pub(crate) const DATABASE_STATE_TTL: Duration = Duration::from_secs(1);

/// Whether the accounts database answered, as last asked; shared by every listener's router.
#[derive(Clone, Default)]
pub struct DatabaseState {
    last: Arc<Mutex<Option<(Instant, bool)>>>,
    /// Held while one request asks the database, so that concurrent probes share its answer.
    asking: Arc<tokio::sync::Mutex<()>>,
}

impl DatabaseState {
    /// Whether the database answers: the cached state while it is fresh, else `ping`'s answer.
    pub(crate) async fn reachable<F>(&self, ping: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = bool>,
    {
        if let Some(reachable) = self.fresh() {
            return reachable;
        }
        let _asking = self.asking.lock().await;
        if let Some(reachable) = self.fresh() {
            return reachable;
        }
        let reachable = ping().await;
        *self.last.lock().expect("database state lock") = Some((Instant::now(), reachable));
        reachable
    }

    fn fresh(&self) -> Option<bool> {
        let last = *self.last.lock().expect("database state lock");
        last.filter(|(at, _)| at.elapsed() < DATABASE_STATE_TTL).map(|(_, reachable)| reachable)
    }
}

/// `GET /health/ready`: 200 when this replica should get requests; 503 with the reason while it
/// drains, after its engine failed, or while the accounts database does not answer (why is
/// logged, not shown).
pub(crate) async fn ready(State(state): State<AppState>, database: DatabaseState) -> Response {
    if state.draining.is_draining() {
        return unavailable("draining", None);
    }
    if let Some(why) = state.models.failure() {
        return unavailable("failed", Some(why));
    }
    // The database's error names hosts, users and databases: it goes to the log, and the
    // unauthenticated probe only says which check failed.
    if !database.reachable(|| ping(&state)).await {
        return unavailable("database_unreachable", None);
    }
    let loaded: Vec<String> = state.models.status().into_iter().filter(|m| m.loaded).map(|m| m.id).collect();
    Json(json!({"status": "ready", "loaded_models": loaded})).into_response()
}

async fn ping(state: &AppState) -> bool {
    match tokio::time::timeout(DATABASE_PING_TIMEOUT, state.accounts.ping()).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the accounts database does not answer");
            false
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = DATABASE_PING_TIMEOUT.as_millis() as u64,
                "readiness: the accounts database does not answer in time"
            );
            false
        }
    }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn probes_ask_the_database_at_most_once_a_second() {
        let database = DatabaseState::default();
        let pings = Arc::new(AtomicUsize::new(0));
        let ping = || {
            let pings = pings.clone();
            move || async move {
                pings.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                true
            }
        };
        let probes: Vec<_> = (0..200).map(|_| database.reachable(ping())).collect();
        assert!(futures_util::future::join_all(probes).await.into_iter().all(|ready| ready));
        assert_eq!(pings.load(Ordering::SeqCst), 1, "concurrent probes share one round trip");
        // A stale answer is asked again, once.
        *database.last.lock().unwrap() = Some((Instant::now() - DATABASE_STATE_TTL, true));
        for _ in 0..10 {
            assert!(database.reachable(ping()).await);
        }
        assert_eq!(pings.load(Ordering::SeqCst), 2);
    }
}
