//! Chat Completions' ends of the request path (`crate::pipeline`): the prompt a validated chat
//! request prepares, and its answer, streamed as chunks or collected. The other dialects
//! translate these.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::{header, HeaderMap};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use gantry_api::{
    ApiError, ChatAnswer, ChatCompletionResponse, ChunkEncoder, ChunkFrame, ResponseFormat, ValidatedChat,
};
use gantry_engine::{ChatInput, Constraint, Event, GenerateRequest, SamplingParams};

use crate::errors::{task_failed, IntoApiError};
use crate::openai::deltas::{deltas, ChatDeltas};
use crate::openai::tool_calls::ToolPlan;
use crate::pool::Lease;

/// OpenAI accepts only JSON bodies; a form or text body is a client error, not a parse attempt.
pub(crate) fn require_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime == "application/json" || mime.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::invalid_request(
            format!("Invalid content type {ct:?}: the request body must be JSON, sent with 'Content-Type: application/json'."),
            None,
        ))
    }
}

/// The engine checks and tokenizes the request (off the async runtime: it renders the template
/// and compiles grammars); its refusals are the client's 400s.
/// `scope`: the key's prompt-cache scope; only prefixes cached under it are reused.
pub(crate) async fn prepare(
    model: &Lease,
    chat: &ValidatedChat,
    tools: Option<&ToolPlan>,
    scope: gantry_engine::CacheScope,
) -> Result<GenerateRequest, ApiError> {
    prepare_or_refusal(model, chat, tools, scope).await?.map_err(IntoApiError::into_api_error)
}

/// [`prepare`], with the engine's refusal as it gave it (the outer error: the task failed, or
/// the model has no chat template).
pub(crate) async fn prepare_or_refusal(
    model: &Lease,
    chat: &ValidatedChat,
    tools: Option<&ToolPlan>,
    scope: gantry_engine::CacheScope,
) -> Result<Result<GenerateRequest, gantry_engine::PrepareError>, ApiError> {
    if model.model_info().chat_template.is_none() {
        return Err(no_chat_template(model.id()));
    }
    // The whole output's grammar: a forced call's, the answer-or-call union of `auto` tools with
    // a response_format, or the response_format's own. Its schema errors name the field that
    // brought the schema: the tools whenever there are any.
    let param = if tools.is_some_and(ToolPlan::shapes_output) { "tools" } else { "response_format" };
    let constraint = match tools {
        Some(t) => t.constraint(constraint_of(chat)),
        None => constraint_of(chat),
    };
    let input = ChatInput {
        messages: {
            let marker = model.model_info().image_marker.as_deref();
            chat.messages.iter().map(|m| m.to_template_value_marking_images(marker)).collect()
        },
        tools: tools.map(|t| t.tools.clone()),
        n: chat.n,
        max_tokens: chat.max_tokens,
        stop: chat.stop.clone(),
        sampling: sampling_of(chat),
        logprobs: chat.logprobs.then_some(chat.top_logprobs),
        constraint: constraint.map(|c| (c, param)),
        lazy_tools: tools.and_then(ToolPlan::engine_lazy),
        answer_constraint: tools.filter(|t| t.answers_or_calls()).and_then(|_| constraint_of(chat)),
        cache_scope: scope,
        thinking: match chat.thinking_budget() {
            None => gantry_engine::Thinking::Default,
            Some(0) => gantry_engine::Thinking::Off,
            Some(budget) => gantry_engine::Thinking::Budget(budget),
        },
    };
    let engine = model.generator();
    tokio::task::spawn_blocking(move || engine.prepare(input)).await.map_err(|e| task_failed("prompt preparation", e))
}

/// The request's sampling parameters as the engine takes them (OpenAI's defaults where unset).
pub(crate) fn sampling_of(chat: &ValidatedChat) -> SamplingParams {
    SamplingParams {
        temperature: chat.temperature.unwrap_or(1.0),
        top_p: chat.top_p.unwrap_or(1.0),
        top_k: chat.top_k.unwrap_or(0),
        presence_penalty: chat.presence_penalty,
        frequency_penalty: chat.frequency_penalty,
        seed: chat.seed.map(|s| s as u64),
        logit_bias: chat.logit_bias.clone(),
        ignore_eos: chat.ignore_eos,
    }
}

/// The refusal of a chat on a model whose GGUF has no chat template (a base model): the engine
/// will not guess a format, so the client hears which model it named and why.
pub(crate) fn no_chat_template(model: &str) -> ApiError {
    ApiError::invalid_request(
        format!(
            "The model `{model}` has no chat template (its GGUF file has no tokenizer.chat_template, as base \
             models often have none), so it cannot answer chat requests. Use a chat (instruction-tuned) model."
        ),
        Some("model"),
    )
}

/// `response_format` as a grammar.
fn constraint_of(chat: &ValidatedChat) -> Option<Constraint> {
    match chat.response_format.as_ref()? {
        ResponseFormat::JsonObject => Some(Constraint::JsonObject),
        ResponseFormat::JsonSchema { schema, strict: true, .. } => Some(Constraint::JsonSchema(schema.clone())),
        ResponseFormat::JsonSchema { schema, strict: false, .. } => {
            Some(Constraint::JsonSchema(gantry_engine::constraint::lenient(schema.clone())))
        }
        ResponseFormat::Text => None,
    }
}

/// The Chat Completions answer: SSE chunks, or one `chat.completion`.
pub(crate) async fn respond(
    id: String,
    created: u64,
    model: String,
    chat: &ValidatedChat,
    tools: Option<ToolPlan>,
    n: u32,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    if chat.stream {
        return Ok(stream_response(id, created, model, chat, tools, n, events).into_response());
    }
    let collected = collect_response(id, created, model, chat, tools.as_ref(), n, events).await?;
    Ok(Json(collected.response).into_response())
}

/// A collected answer, and which stop string ended each choice (Messages reports it).
pub(crate) struct Collected {
    pub response: ChatCompletionResponse,
    pub stop_sequences: Vec<Option<String>>,
}

/// The answer collected from the same deltas its stream would render (`ChatAnswer`).
pub(crate) async fn collect_response(
    id: String,
    created: u64,
    model: String,
    chat: &ValidatedChat,
    tools: Option<&ToolPlan>,
    n: u32,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Collected, ApiError> {
    let mut answer = ChatAnswer::new(n, chat.logprobs);
    let mut deltas = std::pin::pin!(deltas(events, ChatDeltas::for_request(chat, tools.cloned(), n)));
    let usage = loop {
        // The deltas end with `Done` or `Error` (a closed channel is read as an error).
        let delta = deltas.next().await.ok_or_else(|| ApiError::internal("the answer ended unfinished"))?;
        if let Some(usage) = answer.take(delta)? {
            break usage;
        }
    };
    let (choices, stop_sequences) = answer.into_choices();
    let response = ChatCompletionResponse {
        id,
        object: "chat.completion",
        created,
        model,
        system_fingerprint: None,
        service_tier: Some(chat.service_tier.as_str()),
        choices,
        usage,
    };
    Ok(Collected { response, stop_sequences })
}

fn stream_response(
    id: String,
    created: u64,
    model: String,
    chat: &ValidatedChat,
    tools: Option<ToolPlan>,
    n: u32,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let encoder = ChunkEncoder::new(id, created, model, chat.include_usage).in_tier(chat.service_tier);
    let reader = ChatDeltas::for_request(chat, tools, n);
    let opening = stream::iter(reader.opening(n));
    let frames = opening.chain(deltas(events, reader)).flat_map(move |d| stream::iter(encoder.encode(d)));
    Sse::new(frames.map(|frame| Ok(to_sse(frame)))).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn to_sse(frame: ChunkFrame) -> SseEvent {
    match frame {
        ChunkFrame::Data(v) => SseEvent::default().data(v.to_string()),
        ChunkFrame::Done => SseEvent::default().data("[DONE]"),
    }
}
