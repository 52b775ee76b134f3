//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): the same
//! keys, admission, engine, ledger and rate limits as Chat Completions. The request is
//! translated into the chat request it means (`gantry_api::anthropic`), run by the chat path,
//! and its answer translated back; errors leave in Anthropic's shape.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, StreamExt};
use gantry_accounts::KeyInfo;
use gantry_api::anthropic::{message_from_chat, MessageStream, StreamEvent};
use gantry_api::{ApiError, ChatDelta, ValidatedChat};
use gantry_engine::Event;
use serde_json::{json, Value};

use crate::errors::IntoApiError;
use crate::openai::chat;
use crate::openai::deltas::{deltas, ChatDeltas};
use crate::openai::models::key_allows;
use crate::openai::tool_calls::ToolPlan;
use crate::state::AppState;

/// The answer's identity, known once the request was admitted.
pub(crate) struct Answer {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens: usize,
    /// `max_tokens` was more than the context left, and was cut to it
    /// ([`prepare_within_context`]): stopping there is `model_context_window_exceeded`.
    pub context_capped: bool,
}

/// Anthropic's `max_tokens` is a ceiling: an answer that would run past the model's context stops
/// at its end instead (`stop_reason: model_context_window_exceeded`), as Anthropic's models do.
/// Claude-Code-style clients send 32,000 whatever the model; refused, every request of theirs
/// failed against a 4,096-token context. Whether it was cut comes back with the request.
pub(crate) async fn prepare_within_context(
    model: &crate::pool::Lease,
    chat: &ValidatedChat,
    tools: Option<&ToolPlan>,
    scope: gantry_engine::CacheScope,
) -> Result<(gantry_engine::GenerateRequest, bool), ApiError> {
    match chat::prepare_or_refusal(model, chat, tools, scope).await? {
        Ok(generate) => Ok((generate, false)),
        Err(gantry_engine::PrepareError::ContextLength { limit, prompt_tokens, max_tokens: Some(_) })
            if prompt_tokens < limit =>
        {
            let within = ValidatedChat { max_tokens: Some(limit - prompt_tokens), ..chat.clone() };
            Ok((chat::prepare(model, &within, tools, scope).await?, true))
        }
        Err(refusal) => Err(refusal.into_api_error()),
    }
}

/// The stop reason of an answer that ran to the end of a context its `max_tokens` was cut to.
const CONTEXT_END: &str = "model_context_window_exceeded";

/// The Messages answer to a request the chat path admitted and started.
pub(crate) async fn respond(
    answer: Answer,
    chat: &ValidatedChat,
    tools: Option<ToolPlan>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    if chat.stream {
        return Ok(stream(answer, chat, tools, events).into_response());
    }
    let collected =
        chat::collect_response(answer.id.clone(), answer.created, answer.model, chat, tools.as_ref(), 1, events)
            .await?;
    let stop = collected.stop_sequences.into_iter().next().flatten();
    let mut message = message_from_chat(&answer.id, &collected.response, stop.as_deref());
    if answer.context_capped && message["stop_reason"] == "max_tokens" {
        message["stop_reason"] = CONTEXT_END.into();
    }
    Ok(Json(message).into_response())
}

/// The answer's deltas (tool calls read out of its text) as Messages events. Dropping it
/// (client gone) drops the engine's receiver: cancelled.
fn stream(
    answer: Answer,
    chat: &ValidatedChat,
    tools: Option<ToolPlan>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let mut translation = Translation { messages: None, answer };
    let frames = deltas(events, ChatDeltas::for_request(chat, tools, 1))
        .flat_map(move |delta| stream::iter(translation.translate(delta)))
        .map(|e| Ok(to_sse(e)));
    Sse::new(frames).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

struct Translation {
    /// Opened at the first delta: the prompt's cached part, once the request holds its cached
    /// prefix, so `message_start` splits the prompt as the final usage will (or anything else,
    /// such as an error before it ran, with nothing cached).
    messages: Option<MessageStream>,
    /// What `message_start` says of the message, known before the engine runs it.
    answer: Answer,
}

impl Translation {
    fn translate(&mut self, delta: ChatDelta) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let messages = match &mut self.messages {
            Some(messages) => messages,
            None => {
                let cached = if let ChatDelta::PromptCached { tokens } = delta { tokens } else { 0 };
                let a = &self.answer;
                let prompt_tokens = u32::try_from(a.prompt_tokens).unwrap_or(u32::MAX);
                let (messages, opening) = MessageStream::start(&a.id, &a.model, prompt_tokens, cached);
                out.extend(opening);
                self.messages.insert(messages)
            }
        };
        out.extend(messages.on_delta(delta));
        if self.answer.context_capped {
            for e in out.iter_mut().filter(|e| e.event == "message_delta") {
                if e.data["delta"]["stop_reason"] == "max_tokens" {
                    e.data["delta"]["stop_reason"] = CONTEXT_END.into();
                }
            }
        }
        out
    }
}

fn to_sse(e: StreamEvent) -> SseEvent {
    SseEvent::default().event(e.event).data(e.data.to_string())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the model would read them
/// (template, tools and all), without generating. Counts against the key's requests per
/// minute like any request, and the tokens it counted against its tokens per minute (a 429
/// when they do not fit); never booked. It waits for its preparation turn in the same per-key
/// gate as a generation, holding no model while it waits.
pub(crate) async fn count_tokens(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let counted = async {
        let n = count(&state, &key, &headers, &body).await?;
        Ok((n as u64, json!({"input_tokens": n})))
    };
    crate::tokenize::metered_count(&state, &key, counted).await
}

async fn count(state: &AppState, key: &KeyInfo, headers: &HeaderMap, body: &[u8]) -> Result<usize, ApiError> {
    chat::require_json_content_type(headers)?;
    // The same fields as a message, but for `max_tokens`, which counting does not need.
    let mut request: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_request(format!("The request body is not valid JSON: {e}"), None))?;
    if let Some(obj) = request.as_object_mut() {
        obj.entry("max_tokens").or_insert(json!(1));
    }
    let chat = gantry_api::anthropic::parse_messages_request(request.to_string().as_bytes())?;
    if !state.models.resolve(&chat.model).is_some_and(|spec| key_allows(key, &chat.model, spec)) {
        return Err(ApiError::model_not_found(&chat.model));
    }
    let tools = ToolPlan::from_request(&chat)?;
    // The turn first: a request waiting behind the key's others holds no model, so it keeps
    // none from being unloaded.
    let _turn = state.prepare_gate.enter(key.id).await;
    let model = state.models.acquire(&chat.model).await.map_err(IntoApiError::into_api_error)?;
    let scope = gantry_engine::CacheScope(key.cache_scope_id());
    // A prompt longer than the context is counted all the same, as Anthropic counts it.
    match chat::prepare_or_refusal(&model, &chat, tools.as_ref(), scope).await? {
        Ok(generate) => Ok(generate.prompt.tokens.len()),
        Err(gantry_engine::PrepareError::ContextLength { prompt_tokens, .. }) => Ok(prompt_tokens as usize),
        Err(refused) => Err(refused.into_api_error()),
    }
}

/// Every error answered under `/v1/messages` (the handlers', authentication's, the body
/// limit's, an unknown route's, a panic's) leaves in Anthropic's shape, with the same status,
/// rendered from the `ApiError` the response carries in its extensions (`errors_as_json`,
/// inside this layer, turns any other error into one).
pub(crate) async fn errors_in_anthropic_shape(req: Request, next: Next) -> Response {
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let response = next.run(req).await;
    let status = response.status();
    if !anthropic || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let error = parts.extensions.remove::<ApiError>().unwrap_or_else(|| {
        // Not expected: an error answered without an `ApiError`; its status still says what it is.
        tracing::warn!(%status, "an error under /v1/messages without its ApiError");
        ApiError::new(status, "", status.canonical_reason().unwrap_or("error"), None, None)
    });
    // A spent budget is Anthropic's 402 `billing_error`, which its SDK does not retry (a 429
    // it retries twice, in vain).
    let body = gantry_api::anthropic::error_body(&error);
    if body["error"]["type"] == "billing_error" {
        parts.status = StatusCode::PAYMENT_REQUIRED;
    }
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.extensions.insert(error);
    Response::from_parts(parts, Body::from(body.to_string()))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
