//! `/v1/files`: upload (multipart, `purpose: batch`), list, retrieve, read and delete a key's
//! files, in OpenAI's shapes. Another key's file is not found. Every call counts against the
//! key's requests per minute, as every read of stored data does.

use std::collections::HashMap;

use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gantry_accounts::{AccountsError, FileInfo, FileQuery, KeyInfo, NewFile};
use gantry_api::ApiError;
use serde_json::{json, Value};

use crate::clock::now_secs;
use crate::responses::{counted, storage_failed};
use crate::state::AppState;

/// The purposes a file may be uploaded for: a batch's input only (`batch_output` is the server's).
const UPLOAD_PURPOSE: &str = "batch";

/// A file as the API shows it.
pub(super) fn file_object(file: &FileInfo) -> Value {
    json!({
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": file.created_at,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": null,
        "status_details": null,
    })
}

pub(super) fn file_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No such File object: {id}"),
        Some("id"),
        None,
    )
}

/// 507: the data directory is below its free space floor (`--min-free-disk`).
pub(super) fn low_disk() -> ApiError {
    ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        "server_error",
        "This server is low on disk space and stores no new files or batches now; retry later.",
        None,
        Some("insufficient_storage"),
    )
}

/// 400 `storage_limit_exceeded`: the key is at its file quota (`--files-per-key`,
/// `--file-bytes-per-key`).
pub(super) fn storage_limit(message: String, param: Option<&str>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message, param, Some("storage_limit_exceeded"))
}

/// 413 `request_too_large`, naming `--max-file-bytes`: a file over it, whether it was read whole
/// (`size`) or the upload ran past the route's body limit while it was read.
pub(super) fn file_too_large(max_file_bytes: u64, size: Option<usize>) -> ApiError {
    let message = match size {
        Some(size) => format!("The file is {size} bytes; this server takes files of at most {max_file_bytes} bytes."),
        None => format!("The upload is too large: this server takes files of at most {max_file_bytes} bytes."),
    };
    ApiError { message, param: Some("file".into()), ..ApiError::payload_too_large(max_file_bytes) }
}

/// `POST /v1/files`.
pub(super) async fn upload(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    form: Multipart,
) -> Response {
    counted(&state, &key, upload_counted(&state, &key, form)).await
}

async fn upload_counted(state: &AppState, key: &KeyInfo, mut form: Multipart) -> Result<Response, ApiError> {
    let settings = &state.batches;
    let bad_form = |e: axum::extract::multipart::MultipartError| match e.status() {
        // The body limit (the largest file plus room for the form's framing) was reached.
        StatusCode::PAYLOAD_TOO_LARGE => file_too_large(settings.max_file_bytes, None),
        status => ApiError::new(
            status,
            "invalid_request_error",
            format!("The upload is not a valid multipart form: {e}"),
            None,
            None,
        ),
    };
    let (mut purpose, mut file) = (None, None);
    while let Some(field) = form.next_field().await.map_err(bad_form)? {
        match field.name() {
            Some("purpose") => purpose = Some(field.text().await.map_err(bad_form)?),
            Some("file") => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
                file = Some((filename, field.bytes().await.map_err(bad_form)?));
            }
            // `expires_after[...]` and whatever else a client adds: files here live until deleted.
            _ => {}
        }
    }
    let purpose =
        purpose.ok_or_else(|| ApiError::invalid_value("purpose", "Missing required parameter: 'purpose'."))?;
    if purpose != UPLOAD_PURPOSE {
        return Err(ApiError::invalid_value(
            "purpose",
            format!("Invalid value for 'purpose': this server takes files for 'batch' only, got '{purpose}'."),
        ));
    }
    let (filename, bytes) =
        file.ok_or_else(|| ApiError::invalid_value("file", "Missing required parameter: 'file'."))?;
    if bytes.len() as u64 > settings.max_file_bytes {
        return Err(file_too_large(settings.max_file_bytes, Some(bytes.len())));
    }
    let content = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::invalid_value("file", "The file is not UTF-8 text; a batch's input is JSON lines."))?;
    if !state.response_storage.has_room() {
        return Err(low_disk());
    }
    let new = NewFile {
        id: super::new_id("file-"),
        key_id: key.id,
        purpose,
        filename: filename.chars().take(256).collect(),
        created_at: now_secs() as i64,
        content,
    };
    match state.accounts.store_file(&new, settings.quota).await {
        Ok(info) => Ok(Json(file_object(&info)).into_response()),
        Err(AccountsError::QuotaExceeded(message)) => Err(storage_limit(message, Some("file"))),
        Err(e) => Err(storage_failed(e)),
    }
}

/// `GET /v1/files`: the key's files, newest first unless `order=asc`, a page of `limit`.
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    counted(&state, &key, list_counted(&state, &key, params)).await
}

async fn list_counted(state: &AppState, key: &KeyInfo, params: HashMap<String, String>) -> Result<Response, ApiError> {
    let limit = match params.get("limit") {
        None => 10_000,
        Some(v) => v.parse::<u32>().ok().filter(|n| (1..=10_000).contains(n)).ok_or_else(|| {
            ApiError::invalid_value(
                "limit",
                format!("Invalid 'limit': expected an integer from 1 to 10000, got '{v}'."),
            )
        })?,
    };
    let ascending = match params.get("order").map(String::as_str) {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(v) => {
            return Err(ApiError::invalid_value(
                "order",
                format!("Invalid 'order': expected 'asc' or 'desc', got '{v}'."),
            ))
        }
    };
    let query =
        FileQuery { purpose: params.get("purpose").cloned(), after: params.get("after").cloned(), limit, ascending };
    let mut files = state.accounts.list_files(key.id, &query).await.map_err(storage_failed)?;
    let has_more = files.len() > limit as usize;
    files.truncate(limit as usize);
    Ok(Json(list_object(files.iter().map(|f| (f.id.as_str(), file_object(f))), has_more)).into_response())
}

/// OpenAI's page of a list: its objects, the first and last ids, whether more follow.
pub(super) fn list_object<'a>(items: impl Iterator<Item = (&'a str, Value)>, has_more: bool) -> Value {
    let (ids, data): (Vec<&str>, Vec<Value>) = items.unzip();
    json!({"object": "list", "data": data, "first_id": ids.first(), "last_id": ids.last(), "has_more": has_more})
}

/// `GET /v1/files/{id}`.
pub(super) async fn retrieve(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, async {
        let file = state.accounts.file(key.id, &id).await.map_err(storage_failed)?;
        Ok(Json(file_object(&file.ok_or_else(|| file_not_found(&id))?)).into_response())
    })
    .await
}

/// `GET /v1/files/{id}/content`: the file's bytes.
pub(super) async fn content(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, async {
        let content = state.accounts.file_content(key.id, &id).await.map_err(storage_failed)?;
        let content = content.ok_or_else(|| file_not_found(&id))?;
        Ok(([(header::CONTENT_TYPE, "application/octet-stream")], content).into_response())
    })
    .await
}

/// `DELETE /v1/files/{id}`. A batch made from the file keeps its own copy of the lines.
pub(super) async fn delete(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, async {
        if !state.accounts.delete_file(key.id, &id).await.map_err(storage_failed)? {
            return Err(file_not_found(&id));
        }
        Ok(Json(json!({"id": id, "object": "file", "deleted": true})).into_response())
    })
    .await
}
