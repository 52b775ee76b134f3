//! `/admin/v1/models`: what each model's state is, and loading or unloading one by hand, named
//! by its id or an alias.

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

/// The id of the model an operator names by its id or one of its aliases, as a request would.
fn model_id(state: &AppState, name: &str) -> Result<String, ApiError> {
    state.models.resolve(name).map(|spec| spec.id.clone()).ok_or_else(|| ApiError::model_not_found(name))
}

fn status_of(state: &AppState, id: &str) -> Result<Json<Value>, ApiError> {
    let status = state.models.status().into_iter().find(|s| s.id == id);
    status.map(|s| Json(view(&s))).ok_or_else(|| ApiError::model_not_found(id))
}

async fn load(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = model_id(&state, &name)?;
    drop(state.models.acquire(&id).await.map_err(|e| e.into_api_error())?);
    status_of(&state, &id)
}

#[derive(Deserialize)]
struct UnloadParams {
    #[serde(default)]
    force: bool,
}

async fn unload(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(params): Query<UnloadParams>,
) -> Result<Json<Value>, ApiError> {
    let id = model_id(&state, &name)?;
    state.models.unload(&id, params.force).await.map_err(|e| e.into_api_error())?;
    status_of(&state, &id)
}
