//! `GET /v1/models` and `GET /v1/models/{id}`: the models a key may use.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gantry_accounts::KeyInfo;
use gantry_api::{ApiError, ModelList, ModelObject};
use serde_json::{json, Value};

use crate::state::AppState;

fn model_object(name: &str, spec: &crate::pool::ModelSpec) -> ModelObject {
    ModelObject {
        id: name.to_string(),
        object: "model",
        created: spec.created,
        owned_by: "gantry".into(),
        capabilities: capabilities(spec),
    }
}

/// What the model serves, by the names `/v1/models` lists: read from its GGUF (and whether it
/// has a projector) when the server started, so a model not loaded says it too.
pub(crate) fn capabilities(spec: &crate::pool::ModelSpec) -> Vec<&'static str> {
    let c = &spec.capabilities;
    [
        ("chat", c.generates() && c.chat_template),
        ("completions", c.generates()),
        ("fill_in_the_middle", c.generates() && c.fill_in_the_middle),
        ("vision", c.generates() && spec.config.mmproj_path.is_some()),
        ("embeddings", c.embeds()),
        ("rerank", c.ranks()),
    ]
    .into_iter()
    .filter_map(|(name, has)| has.then_some(name))
    .collect()
}

/// Whether `key` may use the model reached as `name` (allowed by that name or by its id).
pub(crate) fn key_allows(key: &KeyInfo, name: &str, spec: &crate::pool::ModelSpec) -> bool {
    key.allows_model(name) || key.allows_model(&spec.id)
}

/// Anthropic's SDK sends `anthropic-version` on every call, and reads models in Anthropic's
/// shape (`type`, `display_name`, `created_at`); every other client gets OpenAI's.
fn wants_anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

/// A model as Anthropic's `GET /v1/models` lists it.
fn anthropic_model(name: &str, spec: &crate::pool::ModelSpec) -> Value {
    let created_at = time::OffsetDateTime::from_unix_timestamp(spec.created as i64)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into());
    json!({"type": "model", "id": name, "display_name": name, "created_at": created_at})
}

/// Every model the key may use, loaded or not, under its id and each of its aliases.
pub(crate) async fn list_models(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    headers: HeaderMap,
) -> Response {
    let models: Vec<(&String, &crate::pool::ModelSpec)> = state
        .models
        .specs()
        .iter()
        .flat_map(|s| std::iter::once(&s.id).chain(&s.aliases).map(move |name| (name, s)))
        .filter(|(name, s)| key_allows(&key, name, s))
        .collect();
    if wants_anthropic(&headers) {
        let data: Vec<Value> = models.iter().map(|(name, s)| anthropic_model(name, s)).collect();
        let (first, last) = (data.first().map(|m| m["id"].clone()), data.last().map(|m| m["id"].clone()));
        return Json(json!({"data": data, "has_more": false, "first_id": first, "last_id": last})).into_response();
    }
    let data = models.iter().map(|(name, s)| model_object(name, s)).collect();
    Json(ModelList { object: "list", data }).into_response()
}

pub(crate) async fn get_model(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.models.resolve(&id) {
        Some(spec) if key_allows(&key, &id, spec) && wants_anthropic(&headers) => {
            Ok(Json(anthropic_model(&id, spec)).into_response())
        }
        Some(spec) if key_allows(&key, &id, spec) => Ok(Json(model_object(&id, spec)).into_response()),
        _ => Err(ApiError::model_not_found(&id)),
    }
}

/// The first model the key may use: llama.cpp's clients (`/infill`) name none.
pub(crate) fn default_model(state: &AppState, key: &KeyInfo) -> Result<String, ApiError> {
    let spec = state.models.specs().iter().find(|spec| key_allows(key, &spec.id, spec));
    spec.map(|spec| spec.id.clone()).ok_or_else(|| no_model_named("model"))
}

/// The 404 of a request that named no model when the key may use none of the kind it needs
/// (`what`: "model", "reranker"), saying so instead of naming an empty model.
pub(crate) fn no_model_named(what: &str) -> ApiError {
    let mut e = ApiError::model_not_found("");
    e.message = format!("The request names no `model`, and this key may use no {what} here; name one.");
    e
}
