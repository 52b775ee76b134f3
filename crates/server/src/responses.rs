//! OpenAI's Responses API (`POST /v1/responses`): the same keys, admission, engine, ledger and
//! rate limits as Chat Completions. The request is translated into the chat request it means
//! (`gantry_api::responses`), run by the chat path, and its answer translated back into a
//! Response object or its semantic stream events. With `store` (the default) the Response is
//! kept per key in the accounts database for `GET`, `DELETE` and `previous_response_id`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, StreamExt};
use gantry_accounts::KeyInfo;
use gantry_api::responses::{
    response_from_chat, turn_items, ResponseEvent, ResponseIds, ResponseStream, ResponsesRequest,
};
use gantry_api::{ApiError, ChatDelta};
use gantry_engine::Event;
use serde_json::{json, Map, Value};

use crate::clock::now_ms;
use crate::openai::chat;
use crate::openai::deltas::{deltas, ChatDeltas};
use crate::openai::tool_calls::ToolPlan;
use crate::response_storage::ResponseStorage;
use crate::state::AppState;

/// The request with the conversation its `previous_response_id` continues read in before its
/// own input (unchanged without one). Called once the request was admitted and holds its
/// preparation turn: at most `--prepare-concurrency` conversations, each bounded by
/// [`gantry_accounts::MAX_CONVERSATION_BYTES`], are in memory at once, and they are parsed on a
/// blocking thread. Only the key's own unexpired responses continue.
pub(crate) async fn continued(
    state: &AppState,
    key: &KeyInfo,
    request: ResponsesRequest,
) -> Result<ResponsesRequest, ApiError> {
    let Some(id) = request.continues().map(str::to_owned) else { return Ok(request) };
    let turns = match state.accounts.stored_conversation(key.id, &id, now_ms()).await {
        Err(gantry_accounts::AccountsError::Invalid(why)) => {
            return Err(ApiError::invalid_value("previous_response_id", format!("Cannot continue '{id}': {why}.")))
        }
        other => other.map_err(storage_failed)?,
    };
    let Some(turns) = turns else {
        return Err(ApiError::invalid_value(
            "previous_response_id",
            format!("Previous response with id '{id}' not found (never stored, deleted, expired, or made with another key)."),
        ));
    };
    tokio::task::spawn_blocking(move || {
        let mut items = Vec::new();
        for turn in turns {
            match serde_json::from_str::<Value>(&turn) {
                Ok(Value::Array(turn)) => items.extend(turn),
                _ => return Err(ApiError::internal("a stored response's items are not a JSON array")),
            }
        }
        request.continuing(&items)
    })
    .await
    .map_err(|e| crate::errors::task_failed("reading a stored conversation", e))?
}

/// Counts a call on stored data (stored responses, files, batches) against the key's requests
/// per minute before `handle` runs; its answer carries the `x-ratelimit-*` headers, a refusal is
/// a 429. Not its budget: these calls spend nothing, and a key that spent its budget still reads
/// what it paid for.
pub(crate) async fn counted<F>(state: &AppState, key: &KeyInfo, handle: F) -> Response
where
    F: std::future::Future<Output = Result<Response, ApiError>>,
{
    let rate = match state.meter.count_request(key).await {
        Ok(rate) => rate,
        Err(refused) => return crate::errors::refusal_response(key, refused),
    };
    let mut response = handle.await.unwrap_or_else(IntoResponse::into_response);
    crate::openai::rate_limit::apply(&rate, response.headers_mut());
    response
}

pub(crate) fn storage_failed(e: gantry_accounts::AccountsError) -> ApiError {
    tracing::error!(error = %e, "stored responses: the accounts database failed");
    ApiError::temporarily_unavailable("The stored responses could not be read or written; retry.")
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No response found with id '{id}'."),
        Some("response_id"),
        None,
    )
}

/// `GET /v1/responses/{id}`: the key's stored Response; another key's is not found.
pub(crate) async fn retrieve(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, retrieve_counted(&state, &key, id)).await
}

async fn retrieve_counted(state: &AppState, key: &KeyInfo, id: String) -> Result<Response, ApiError> {
    let stored = state.accounts.stored_response(key.id, &id, now_ms()).await.map_err(storage_failed)?;
    let stored = stored.ok_or_else(|| not_found(&id))?;
    let body: Value = serde_json::from_str(&stored).map_err(|_| ApiError::internal("a stored response is not JSON"))?;
    Ok(Json(body).into_response())
}

/// `GET /v1/responses/{id}/input_items`: the input items of the key's stored Response, a page at
/// a time (`gantry_api::responses::input_items_page`).
pub(crate) async fn input_items(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    counted(&state, &key, input_items_counted(&state, &key, id, params)).await
}

async fn input_items_counted(
    state: &AppState,
    key: &KeyInfo,
    id: String,
    params: HashMap<String, String>,
) -> Result<Response, ApiError> {
    let query = gantry_api::responses::items_query(&params)?;
    let stored = state.accounts.stored_response_and_items(key.id, &id, now_ms()).await.map_err(storage_failed)?;
    let (response, items) = stored.ok_or_else(|| not_found(&id))?;
    let corrupt = || ApiError::internal("a stored response is not JSON");
    let response: Value = serde_json::from_str(&response).map_err(|_| corrupt())?;
    let mut items: Vec<Value> = serde_json::from_str(&items).map_err(|_| corrupt())?;
    // The turn's items are its input, then its output.
    let outputs = response["output"].as_array().map_or(0, Vec::len);
    items.truncate(items.len().saturating_sub(outputs));
    Ok(Json(gantry_api::responses::input_items_page(&id, &items, &query)).into_response())
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Path(id): Path<String>,
) -> Response {
    counted(&state, &key, delete_counted(&state, &key, id)).await
}

async fn delete_counted(state: &AppState, key: &KeyInfo, id: String) -> Result<Response, ApiError> {
    if !state.accounts.delete_stored_response(key.id, &id).await.map_err(storage_failed)? {
        return Err(not_found(&id));
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}

/// Where a finished Response is kept, when it is.
#[derive(Clone)]
struct Keeper {
    accounts: gantry_accounts::Accounts,
    storage: ResponseStorage,
    key_id: i64,
    retention: Duration,
    previous_id: Option<String>,
    items: Vec<Value>,
}

impl Keeper {
    /// Stores a finished (completed or incomplete) Response; a failed one is not kept. One the
    /// limits refuse (too large, the disk below its floor) or a write that fails is not kept
    /// either, and its answer says `store: false`: the client still gets its answer, which it
    /// paid for.
    async fn keep(&self, response: &mut Value) {
        if !matches!(response["status"].as_str(), Some("completed" | "incomplete")) {
            return;
        }
        if !self.stored(response).await {
            response["store"] = false.into();
        }
    }

    async fn stored(&self, response: &Value) -> bool {
        let now = now_ms();
        let retention = i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX);
        let new = gantry_accounts::NewStoredResponse {
            id: response["id"].as_str().unwrap_or_default(),
            key_id: self.key_id,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(retention),
            previous_id: self.previous_id.as_deref(),
            items: turn_items(&self.items, response).to_string(),
            response: response.to_string(),
        };
        if !self.storage.fits(new.bytes()) {
            tracing::warn!(id = new.id, bytes = new.bytes(), "a response too large to store was not stored");
            return false;
        }
        if !self.storage.has_room() {
            tracing::warn!(id = new.id, "the data directory is below --min-free-disk: a response was not stored");
            return false;
        }
        match self.accounts.store_response(&new, self.storage.quota).await {
            Ok(dropped) => {
                if dropped > 0 {
                    tracing::debug!(
                        key_id = self.key_id,
                        dropped,
                        "the key's oldest stored responses went for a new one"
                    );
                }
                true
            }
            Err(e) => {
                tracing::error!(error = %e, id = new.id, "could not store a response");
                false
            }
        }
    }
}

/// The Responses answer to a request the chat path admitted and started; stored first when
/// the request asked (and this server keeps responses), so a `GET` right after finds it.
pub(crate) async fn respond(
    state: &AppState,
    key: &KeyInfo,
    ids: ResponseIds,
    request: ResponsesRequest,
    tools: Option<ToolPlan>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let ResponsesRequest { chat, store, previous_response_id, items, mut echo, .. } = request;
    let store = store && !state.response_retention.is_zero();
    echo.insert("store".into(), store.into());
    let keeper = store.then(|| Keeper {
        accounts: state.accounts.clone(),
        storage: state.response_storage.clone(),
        key_id: key.id,
        retention: state.response_retention,
        previous_id: previous_response_id,
        items,
    });
    if chat.stream {
        let deltas = deltas(events, ChatDeltas::for_request(&chat, tools, 1));
        return Ok(stream(ids, echo, deltas, keeper).into_response());
    }
    let collected =
        chat::collect_response(ids.id.clone(), ids.created_at, ids.model.clone(), &chat, tools.as_ref(), 1, events)
            .await?;
    let mut response = response_from_chat(&ids, &echo, &collected.response);
    if let Some(keeper) = keeper {
        keeper.keep(&mut response).await;
    }
    Ok(Json(response).into_response())
}

/// The answer's deltas (tool calls read out of its text) as Responses events, the finished
/// Response kept before its last event leaves. Dropping it (client gone) drops the engine's
/// receiver: the request is cancelled.
fn stream(
    ids: ResponseIds,
    echo: Map<String, Value>,
    deltas: impl futures_util::Stream<Item = ChatDelta> + Send + 'static,
    keeper: Option<Keeper>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let (translator, opening) = ResponseStream::start(ids, echo);
    let state = (Box::pin(deltas), translator, keeper);
    let body = stream::unfold(state, |(mut deltas, mut translator, keeper)| async move {
        let delta = deltas.next().await?;
        let done = matches!(delta, ChatDelta::Done { .. });
        let mut out = translator.on_delta(delta);
        if let (true, Some(keeper), Some(end)) = (done, &keeper, out.last_mut()) {
            keeper.keep(&mut end.data["response"]).await;
        }
        Some((stream::iter(out), (deltas, translator, keeper)))
    })
    .flatten();
    let frames = stream::iter(opening).chain(body).map(|e| Ok(to_sse(e)));
    Sse::new(frames).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn to_sse(e: ResponseEvent) -> SseEvent {
    SseEvent::default().event(e.event).data(e.data.to_string())
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
