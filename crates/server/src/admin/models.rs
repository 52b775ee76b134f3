//! `/admin/v1/models`: what each model's state is, and loading or unloading one by hand.

use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use gantry_api::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::errors::IntoApiError;
use crate::pool::ModelStatus;
use crate::state::AppState;

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/models", get(list))
        .route("/models/{id}/load", post(load))
        .route("/models/{id}/unload", post(unload))
}

fn view(s: &ModelStatus) -> Value {
    json!({
        "id": s.id,
        "state": if s.loaded { "loaded" } else { "unloaded" },
        "bytes": s.bytes,
        "measured_bytes": s.measured_bytes,
        "running_requests": s.leases,
        "pinned": s.pinned,
    })
}

async fn list(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state.models.status().iter().map(view).collect();
    Json(json!({"object": "list", "budget_bytes": state.models.budget(), "data": data}))
}

fn status_of(state: &AppState, id: &str) -> Json<Value> {
    let status = state.models.status().into_iter().find(|s| s.id == id).expect("the pool knows this id");
    Json(view(&status))
}

async fn load(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    drop(state.models.acquire(&id).await.map_err(|e| e.into_api_error())?);
    Ok(status_of(&state, &id))
}

#[derive(Deserialize)]
struct UnloadParams {
    #[serde(default)]
    force: bool,
}

async fn unload(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<UnloadParams>,
) -> Result<Json<Value>, ApiError> {
    state.models.unload(&id, params.force).await.map_err(|e| e.into_api_error())?;
    Ok(status_of(&state, &id))
}
