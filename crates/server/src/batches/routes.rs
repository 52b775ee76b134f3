//! `/v1/batches`: create a batch from a key's file, list, retrieve and cancel the key's batches,
//! in OpenAI's shapes. Another key's batch (or file) is not found.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gantry_accounts::{AccountsError, BatchInfo, KeyInfo, NewBatch};
use gantry_api::ApiError;
use serde_json::{json, Map, Value};

use super::endpoint::Endpoint;
use super::files::{file_not_found, list_object};
use super::validate;
use super::{COMPLETION_WINDOW, MAX_BATCH_LINES};
use crate::clock::now_secs;
use crate::responses::{counted, storage_failed};
use crate::state::AppState;

const KNOWN_FIELDS: [&str; 5] = ["input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"];

/// A batch as the API shows it.
pub(super) fn batch_object(b: &BatchInfo) -> Value {
    let json_of = |text: &Option<String>| text.as_deref().and_then(|t| serde_json::from_str::<Value>(t).ok());
    let (input, output) = (b.prompt_tokens, b.completion_tokens);
    json!({
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": json_of(&b.errors).map(|data| json!({"object": "list", "data": data})),
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": b.created_at,
        "in_progress_at": b.in_progress_at,
        "expires_at": b.expires_at,
        "finalizing_at": b.finalizing_at,
        "completed_at": b.completed_at,
        "failed_at": b.failed_at,
        "expired_at": b.expired_at,
        "cancelling_at": b.cancelling_at,
        "cancelled_at": b.cancelled_at,
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
        "metadata": json_of(&b.metadata),
        "usage": {
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": b.cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": b.reasoning_tokens},
            "total_tokens": input + output,
        },
    })
}

fn batch_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No batch found with id '{id}'."),
        Some("batch_id"),
        None,
    )
}

/// `POST /v1/batches`.
pub(super) async fn create(State(state): State<AppState>, Extension(key): Extension<KeyInfo>, body: Bytes) -> Response {
    counted(&state, &key, create_counted(&state, &key, body)).await
}

async fn create_counted(state: &AppState, key: &KeyInfo, body: Bytes) -> Result<Response, ApiError> {
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(&body) else {
        return Err(ApiError::invalid_request("The request body must be a JSON object.", None));
    };
    if let Some(unknown) = request.keys().find(|k| !KNOWN_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid_value(unknown, format!("Unrecognized request argument supplied: {unknown}")));
    }
    let text = |field: &str| match request.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ApiError::invalid_value(field, format!("Invalid type for '{field}': expected a string."))),
        None => Err(ApiError::invalid_value(field, format!("Missing required parameter: '{field}'."))),
    };
    let (input_file_id, endpoint, window) = (text("input_file_id")?, text("endpoint")?, text("completion_window")?);
    let Some(kind) = Endpoint::from_path(&endpoint) else {
        let known: Vec<&str> = Endpoint::ALL.iter().map(|e| e.path()).collect();
        let message = format!("Invalid value for 'endpoint': expected one of {}, got '{endpoint}'.", known.join(", "));
        return Err(ApiError::invalid_value("endpoint", message));
    };
    if window != COMPLETION_WINDOW.0 {
        let message = format!("Invalid value for 'completion_window': only '24h' is supported, got '{window}'.");
        return Err(ApiError::invalid_value("completion_window", message));
    }
    let metadata = metadata(request.get("metadata"))?;
    // Its output files will be the key's, and its requests are copied: none while the key is at
    // its quota (its files and unfinished batches), or the disk low. `create_batch` checks again
    // with the batch's own requests counted.
    let (files, bytes) = state.accounts.file_usage(key.id).await.map_err(storage_failed)?;
    let quota = state.batches.quota;
    if files >= quota.files || bytes >= quota.bytes {
        let message = format!(
            "This key holds {files} files and unfinished batches of {bytes} bytes, at its quota ({} files, {} bytes): a new batch would not fit. Wait for its batches to finish, or delete files.",
            quota.files, quota.bytes
        );
        return Err(super::files::storage_limit(message, None));
    }
    if !state.response_storage.has_room() {
        return Err(super::files::low_disk());
    }
    let file = state.accounts.file(key.id, &input_file_id).await.map_err(storage_failed)?;
    let file =
        file.ok_or_else(|| ApiError { param: Some("input_file_id".into()), ..file_not_found(&input_file_id) })?;
    if file.purpose != "batch" {
        let message = format!(
            "The file {input_file_id} has purpose '{}'; a batch's input must have purpose 'batch'.",
            file.purpose
        );
        return Err(ApiError::invalid_value("input_file_id", message));
    }
    let content = state.accounts.file_content(key.id, &input_file_id).await.map_err(storage_failed)?;
    let content = content.ok_or_else(|| file_not_found(&input_file_id))?;
    // Parsing every line's body is CPU work: off the async workers, and in the key's turn of the
    // preparation gate, so that one key's many large batches wait for each other rather than
    // take every blocking thread.
    let _turn = state.prepare_gate.enter(key.id).await;
    let (st, k) = (state.clone(), key.clone());
    let checked = tokio::task::spawn_blocking(move || validate::lines(&st, &k, kind, &content, MAX_BATCH_LINES))
        .await
        .map_err(|e| crate::errors::task_failed("validating a batch", e))?;
    let created_at = now_secs() as i64;
    let (lines, errors) = match checked {
        Ok(lines) => (lines, None),
        Err(errors) => (Vec::new(), Some(Value::Array(errors.iter().map(|e| e.to_json()).collect()).to_string())),
    };
    let new = NewBatch {
        id: super::new_id("batch_"),
        key_id: key.id,
        endpoint,
        input_file_id,
        completion_window: window,
        metadata: metadata.map(|m| Value::Object(m).to_string()),
        errors,
        created_at,
        expires_at: created_at + COMPLETION_WINDOW.1.as_secs() as i64,
        lines,
    };
    let batch = match state.accounts.create_batch(&new, state.batches.quota).await {
        Ok(batch) => batch,
        Err(AccountsError::QuotaExceeded(message)) => return Err(super::files::storage_limit(message, None)),
        Err(e) => return Err(storage_failed(e)),
    };
    state.batches.wake.notify_one();
    Ok(Json(batch_object(&batch)).into_response())
}

/// OpenAI's metadata: at most 16 pairs, keys of at most 64 characters, string values of at most 512.
fn metadata(value: Option<&Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let invalid = |m: &str| Err(ApiError::invalid_value("metadata", m.to_string()));
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) if map.len() > 16 => invalid("Invalid 'metadata': at most 16 keys."),
        Some(Value::Object(map)) => {
            for (k, v) in map {
                match v {
                    Value::String(s) if k.chars().count() <= 64 && s.chars().count() <= 512 => {}
                    _ => {
                        return invalid(
                            "Invalid 'metadata': keys of at most 64 characters with string values of at most 512.",
                        )
                    }
                }
            }
            Ok(Some(map.clone()))
        }
        Some(_) => invalid("Invalid type for 'metadata': expected an object."),
    }
}

/// `GET /v1/batches`: the key's batches, newest first, a page of `limit` (default 20).
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    counted(&state, &key, async {
        let limit = match params.get("limit") {
            None => 20,
            Some(v) => v.parse::<u32>().ok().filter(|n| (1..=100).contains(n)).ok_or_else(|| {
                ApiError::invalid_value(
                    "limit",
                    format!("Invalid 'limit': expected an integer from 1 to 100, got '{v}'."),
                )
            })?,
        };
        let after = params.get("after").map(String::as_str);
        let mut batches = state.accounts.list_batches(key.id, after, limit).await.map_err(storage_failed)?;
        let has_more = batches.len() > limit as usize;
        batches.truncate(limit as usize);
        Ok(Json(list_object(batches.iter().map(|b| (b.id.as_str(), batch_object(b))), has_more)).into_response())
    })
    .await
}

/// `GET /v1/batches/{id}`.
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, async {
        let batch = state.accounts.batch(key.id, &id).await.map_err(storage_failed)?;
        Ok(Json(batch_object(&batch.ok_or_else(|| batch_not_found(&id))?)).into_response())
    })
    .await
}

/// `POST /v1/batches/{id}/cancel`: no new line starts; the batch is `cancelled` once the lines
/// running end, with what they answered in its output.
pub(super) async fn cancel(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, async {
        match state.accounts.cancel_batch(key.id, &id, now_secs() as i64).await {
            Ok(batch) => Ok(Json(batch_object(&batch)).into_response()),
            Err(AccountsError::NotFound(_)) => Err(batch_not_found(&id)),
            Err(AccountsError::Invalid(message)) => {
                Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message, None, None))
            }
            Err(e) => Err(storage_failed(e)),
        }
    })
    .await
}
