//! OpenAI's Responses API (`POST /v1/responses`): the same keys, admission, engine, ledger and
//! rate limits as Chat Completions. The request is translated into the chat request it means
//! (`gantry_api::responses`), run by the chat path, and its answer translated back into a
//! Response object or its semantic stream events. Responses are not stored.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, StreamExt};
use gantry_accounts::KeyInfo;
use gantry_api::responses::{response_from_chat, ResponseEvent, ResponseIds, ResponseStream};
use gantry_api::{ApiError, ValidatedChat};
use gantry_engine::{EngineError, Event};
use serde_json::{Map, Value};

use crate::openai::chat::{self, Dialect};
use crate::openai::stream::{ChunkEncoder, SseFrame};
use crate::openai::tool_calls::ToolPlan;
use crate::request_id::{ClientRequestId, RequestId};
use crate::state::AppState;

/// `POST /v1/responses`.
pub(crate) async fn create(
    state: State<AppState>,
    key: Extension<KeyInfo>,
    request_id: Extension<RequestId>,
    client_request_id: Extension<ClientRequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    chat::serve(state, key, request_id, client_request_id, headers, body, Dialect::Responses).await
}

/// `GET` and `DELETE /v1/responses/{id}`: nothing is stored, so every id is unknown (the answer
/// OpenAI gives for an id that is not the key's).
pub(crate) async fn stored(Path(id): Path<String>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No response found with id '{id}': this server does not store responses."),
        Some("response_id"),
        None,
    )
}

/// The Responses answer to a request the chat path admitted and started.
pub(crate) async fn respond(
    ids: ResponseIds,
    echo: Map<String, Value>,
    chat: &ValidatedChat,
    tools: Option<ToolPlan>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    if chat.stream {
        return Ok(stream(ids, echo, tools, events).into_response());
    }
    let collected =
        chat::collect_response(ids.id.clone(), ids.created_at, ids.model.clone(), chat, tools.as_ref(), 1, events)
            .await?;
    Ok(Json(response_from_chat(&ids, &echo, &collected.response)).into_response())
}

/// The chat stream's chunks (tool calls included) as Responses events. Dropping it (client
/// gone) drops the engine's receiver: the request is cancelled.
fn stream(
    ids: ResponseIds,
    echo: Map<String, Value>,
    tools: Option<ToolPlan>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let encoder = ChunkEncoder::new(ids.id.clone(), ids.created_at, ids.model.clone(), true, false)
        .with_tools(tools.filter(|t| t.parse), 1);
    let (translator, opening) = ResponseStream::start(ids, echo);
    let body = stream::unfold((events, encoder, translator), |(mut events, mut encoder, mut translator)| async move {
        if encoder.is_finished() {
            return None;
        }
        let event = events.recv().await.unwrap_or_else(|| {
            Event::Error(EngineError::Crashed("the engine stopped before finishing the request".into()))
        });
        let mut out = Vec::new();
        for frame in encoder.on_event(event) {
            match frame {
                SseFrame::Data(chunk) => out.extend(translator.on_chunk(&chunk)),
                SseFrame::Done => out.extend(translator.finish()),
            }
        }
        Some((stream::iter(out), (events, encoder, translator)))
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
