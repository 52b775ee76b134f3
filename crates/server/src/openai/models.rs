//! `GET /v1/models` and `GET /v1/models/{id}`: the models a key may use.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use gantry_accounts::KeyInfo;
use gantry_api::{ApiError, ModelList, ModelObject};

use crate::state::AppState;

fn model_object(name: &str, spec: &crate::pool::ModelSpec) -> ModelObject {
    ModelObject { id: name.to_string(), object: "model", created: spec.created, owned_by: "gantry".into() }
}

/// Whether `key` may use the model reached as `name` (allowed by that name or by its id).
pub(crate) fn key_allows(key: &KeyInfo, name: &str, spec: &crate::pool::ModelSpec) -> bool {
    key.allows_model(name) || key.allows_model(&spec.id)
}

/// Every model the key may use, loaded or not, under its id and each of its aliases.
pub(crate) async fn list_models(State(state): State<AppState>, Extension(key): Extension<KeyInfo>) -> Json<ModelList> {
    let data = state
        .models
        .specs()
        .iter()
        .flat_map(|s| std::iter::once(&s.id).chain(&s.aliases).map(move |name| (name, s)))
        .filter(|(name, s)| key_allows(&key, name, s))
        .map(|(name, s)| model_object(name, s))
        .collect();
    Json(ModelList { object: "list", data })
}

pub(crate) async fn get_model(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, ApiError> {
    match state.models.resolve(&id) {
        Some(spec) if key_allows(&key, &id, spec) => Ok(Json(model_object(&id, spec))),
        _ => Err(ApiError::model_not_found(&id)),
    }
}
