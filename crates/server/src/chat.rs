//! `POST /v1/chat/completions`: validate → prepare the prompt → submit → stream or collect.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, Stream, StreamExt};
use gantry_accounts::{AccountsError, Backend, KeyInfo, Price, Reservation, UsageRecord};
use gantry_api::{
    ApiError, ChatCompletionResponse, Choice, ChoiceLogprobs, ResponseMessage, TokenLogprob as ApiTokenLogprob,
    TopLogprob as ApiTopLogprob, Usage as ApiUsage, ValidatedChat,
};
use gantry_engine::{
    Constraint, Event, FinishReason, GenerateRequest, GenerationHandle, Outcome, SamplingParams, SubmitError, TokenLogprob,
    Usage,
};

use crate::app::AppState;
use crate::request_id::RequestId;
use crate::stream::{ChunkEncoder, SseFrame};
use crate::tool_calls::ToolPlan;

pub async fn chat_completions(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_json_content_type(&headers)?;
    let chat = gantry_api::parse_chat_request(&body)?;
    // A model the key may not use is reported as missing, as OpenAI does.
    if *chat.model != *state.model_id || !key.allows_model(&chat.model) {
        return Err(ApiError::model_not_found(&chat.model));
    }
    reject_unsupported(&chat, &state)?;
    // Images are fetched and checked even though no served model reads them yet, so a bad image
    // gets its own precise error rather than the generic "no vision" one.
    let images = state.images.load_all(&chat.images).await?;
    if !images.is_empty() && !state.engine.model().info().supports_vision {
        return Err(ApiError::invalid_request(
            format!("The model `{}` does not support image inputs; send text content only.", state.model_id),
            Some("messages"),
        ));
    }

    let tools = ToolPlan::from_request(&chat)?;
    let started_at_ms = now_ms();
    let generate = prepare(&state, &chat, tools.as_ref()).await?;
    let n = generate.n;
    let budget = generate.prompt.tokens.len() as u64 + u64::from(generate.max_tokens) * u64::from(n);
    let (limits, admitted) = match state.accounts.backend() {
        Backend::Postgres => crate::rate_limit::admit_shared(&state.accounts, &key, budget, started_at_ms).await,
        Backend::Sqlite => state.rate_limits.admit(&key, budget, std::time::Instant::now()),
    };
    if let Err(refused) = admitted {
        let mut response = refused.into_response();
        limits.apply(response.headers_mut());
        return Ok(response);
    }
    let price = state.price_of(&state.model_id);
    let reservation = Reservation {
        request_id: request_id.clone(),
        tokens: budget as i64,
        nanos: price.cost_nanos(generate.prompt.tokens.len() as u64, u64::from(generate.max_tokens) * u64::from(n)),
        owner: state.instance_id.to_string(),
        at_ms: started_at_ms,
    };
    if let Err(e) = state.accounts.reserve(&key, &reservation).await {
        let mut response = match e {
            AccountsError::QuotaExceeded(message) => ApiError::insufficient_quota(message).into_response(),
            other => {
                tracing::error!(error = %other, "budget reservation failed");
                ApiError::internal("The server could not check your budget; please retry.").into_response()
            }
        };
        limits.apply(response.headers_mut());
        return Ok(response);
    }
    let submitted = state.engine.submit(generate);
    if submitted.is_err() {
        // Never reached the engine: nothing to bill, give the reservation back.
        if let Err(e) = state.accounts.release(&request_id).await {
            tracing::error!(error = %e, request_id = %request_id, "failed to release a reservation");
        }
    }
    let handle = submitted
        .map_err(|e| match e {
            SubmitError::QueueFull(_) => ApiError::overloaded(format!(
                "The server is overloaded ({e}). Please retry after a short wait."
            ))
            .with_retry_after(1),
            SubmitError::Stopped => ApiError::overloaded("The server is shutting down.").with_retry_after(5),
        })?;
    let GenerationHandle { events, usage } = handle;
    spawn_usage_recorder(&state, &key, &request_id, usage, started_at_ms, price);

    let id = format!("chatcmpl-{request_id}");
    let created = now_secs();
    let mut response = if chat.stream {
        stream_response(id, created, state.model_id.to_string(), &chat, tools, n, events).into_response()
    } else {
        let response = collect_response(id, created, state.model_id.to_string(), &chat, tools.as_ref(), n, events).await?;
        Json(response).into_response()
    };
    limits.apply(response.headers_mut());
    Ok(response)
}

/// OpenAI accepts only JSON bodies; a form or text body is a client error, not a parse attempt.
fn require_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
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

/// Values the served model cannot honour are refused, never silently ignored.
fn reject_unsupported(chat: &ValidatedChat, state: &AppState) -> Result<(), ApiError> {
    let n_vocab = state.engine.model().info().n_vocab;
    if let Some(&(token, _)) = chat.logit_bias.iter().find(|(t, _)| *t < 0 || *t >= n_vocab) {
        return Err(ApiError::invalid_request(
            format!("Invalid 'logit_bias': token id {token} is outside the model's vocabulary (0..{n_vocab})."),
            Some("logit_bias"),
        ));
    }
    Ok(())
}

/// Renders and tokenizes the prompt off the async runtime, then checks it fits the context.
async fn prepare(state: &AppState, chat: &ValidatedChat, tools: Option<&ToolPlan>) -> Result<GenerateRequest, ApiError> {
    let model = state.engine.model().clone();
    let messages: Vec<serde_json::Value> = chat.messages.iter().map(|m| m.to_template_value()).collect();
    let constraint = match tools {
        Some(t) => t.constraint(constraint_of(chat)),
        None => constraint_of(chat),
    };
    let checked = constraint.clone();
    let tool_defs = tools.map(|t| t.tools.clone());
    let lazy = tools.and_then(|t| t.lazy.clone());
    let (prompt, grammar) = tokio::task::spawn_blocking(move || {
        // The grammars a call started under `auto` would switch to are checked now too, so a bad
        // tool schema is a 400 before anything runs.
        let lazy_checked = lazy.iter().flat_map(|l| [&l.bare, &l.tagged, &l.fenced]).try_for_each(|c| model.check_constraint(c));
        let grammar = checked.as_ref().map(|c| model.check_constraint(c)).transpose().and_then(|g| lazy_checked.map(|()| g));
        (model.prepare(&messages, tool_defs.as_deref()), grammar)
    })
    .await
    .map_err(|e| ApiError::internal(format!("prompt preparation failed: {e}")))?;
    let prompt = prompt
        .map_err(|e| ApiError::invalid_request(format!("The chat template rejected these messages: {e}"), Some("messages")))?;
    let schema_param = if tools.is_some() { "tools" } else { "response_format" };
    grammar.map_err(|e| ApiError::invalid_request(format!("Invalid schema for {schema_param}: {e}"), Some(schema_param)))?;

    let ctx = state.engine.config().ctx_size;
    let prompt_len = prompt.tokens.len() as u32;
    let max_tokens = match chat.max_tokens {
        Some(m) if prompt_len.saturating_add(m) > ctx => {
            return Err(ApiError::context_length_exceeded(format!(
                "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({prompt_len} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                prompt_len as u64 + m as u64
            )))
        }
        Some(m) => m,
        None if prompt_len >= ctx => {
            return Err(ApiError::context_length_exceeded(format!(
                "This model's maximum context length is {ctx} tokens. However, your messages resulted in {prompt_len} tokens. Please reduce the length of the messages."
            )))
        }
        None => ctx - prompt_len,
    };
    let sampling = SamplingParams {
        temperature: chat.temperature.unwrap_or(1.0),
        top_p: chat.top_p.unwrap_or(1.0),
        presence_penalty: chat.presence_penalty,
        frequency_penalty: chat.frequency_penalty,
        seed: chat.seed.map(|s| s as u64),
        logit_bias: chat.logit_bias.clone(),
    };
    Ok(GenerateRequest {
        prompt,
        n: chat.n,
        max_tokens,
        stop: chat.stop.clone(),
        sampling,
        logprobs: chat.logprobs.then_some(chat.top_logprobs),
        constraint,
        lazy_tools: tools.and_then(|t| t.lazy.clone()),
    })
}

/// `response_format` as a grammar; the API layer has already checked its shape.
fn constraint_of(chat: &ValidatedChat) -> Option<Constraint> {
    let format = chat.response_format.as_ref()?;
    match format.get("type").and_then(|t| t.as_str())? {
        "json_object" => Some(Constraint::JsonObject),
        "json_schema" => format.pointer("/json_schema/schema").cloned().map(Constraint::JsonSchema),
        _ => None,
    }
}

/// Usage is recorded from the engine's own report, so it is written even when the client
/// disconnects mid-stream.
fn spawn_usage_recorder(
    state: &AppState,
    key: &KeyInfo,
    request_id: &str,
    usage: tokio::sync::oneshot::Receiver<Usage>,
    started_at_ms: i64,
    price: Price,
) {
    let accounts = state.accounts.clone();
    let model = state.model_id.to_string();
    let key_id = key.id;
    let request_id = request_id.to_string();
    state.usage_writers.spawn(async move {
        // The engine always reports; a dropped sender means it died, and nothing is billed.
        let usage = usage.await.unwrap_or(Usage { outcome: Outcome::Error, ..Usage::default() });
        let record = UsageRecord {
            request_id,
            key_id,
            model,
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            completion_tokens: usage.completion_tokens,
            cost_nanos: price.cost_nanos(u64::from(usage.prompt_tokens), u64::from(usage.completion_tokens)),
            outcome: usage.outcome.as_str().to_string(),
            started_at_ms,
            finished_at_ms: now_ms(),
        };
        // Settlement is idempotent on the request id, so retrying a failed write is safe.
        for attempt in 0..5u32 {
            match accounts.record_usage(&record).await {
                Ok(()) => return,
                Err(e) if attempt < 4 => {
                    tracing::warn!(error = %e, request_id = %record.request_id, attempt, "recording usage failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
                Err(e) => tracing::error!(error = %e, request_id = %record.request_id, ?record, "failed to record usage"),
            }
        }
    });
}

async fn collect_response(
    id: String,
    created: u64,
    model: String,
    chat: &ValidatedChat,
    tools: Option<&ToolPlan>,
    n: u32,
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<ChatCompletionResponse, ApiError> {
    let mut texts = vec![String::new(); n as usize];
    let mut logprobs: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n as usize];
    let mut reasons = vec![FinishReason::Length; n as usize];
    let usage = loop {
        match events.recv().await {
            Some(Event::Delta { choice, text, logprobs: lp }) => {
                texts[choice as usize].push_str(&text);
                logprobs[choice as usize].extend(lp);
            }
            Some(Event::Finished { choice, reason }) => reasons[choice as usize] = reason,
            Some(Event::Done(usage)) => break usage,
            Some(Event::Error(message)) => return Err(ApiError::internal(message)),
            None => return Err(ApiError::internal("the engine stopped before finishing the request")),
        }
    };
    let choices = texts
        .into_iter()
        .zip(logprobs)
        .zip(reasons)
        .enumerate()
        .map(|(index, ((text, lp), reason))| {
            let (content, tool_calls) = match tools {
                Some(plan) if reason != FinishReason::Cancelled => plan.read(text, reason),
                _ => (Some(text), None),
            };
            // A call cut by max_tokens is returned, but the reason stays `length`, as OpenAI's.
            let finish_reason = if tool_calls.is_some() && reason == FinishReason::Stop { "tool_calls" } else { reason.as_openai() };
            Choice {
                index: index as u32,
                message: ResponseMessage { role: "assistant", content, tool_calls },
                logprobs: chat.logprobs.then(|| to_api_logprobs(lp)),
                finish_reason: finish_reason.to_string(),
            }
        })
        .collect();
    Ok(ChatCompletionResponse {
        id,
        object: "chat.completion",
        created,
        model,
        system_fingerprint: None,
        choices,
        usage: to_api_usage(usage),
    })
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
    let encoder = ChunkEncoder::new(id, created, model, chat.include_usage, chat.logprobs)
        .with_tools(tools.filter(|t| t.parse), n);
    let opening = encoder.opening(n);
    // The receiver moves into the stream: when the client disconnects, axum drops the stream,
    // the receiver closes and the scheduler cancels the sequence at its next step.
    let body = stream::unfold((events, encoder), |(mut events, mut encoder)| async move {
        if encoder.is_finished() {
            return None;
        }
        let frames = match events.recv().await {
            Some(event) => encoder.on_event(event),
            None => encoder.on_event(Event::Error("the engine stopped before finishing the request".into())),
        };
        Some((stream::iter(frames), (events, encoder)))
    })
    .flatten();
    let frames = stream::iter(opening).chain(body).map(|frame| Ok(to_sse(frame)));
    Sse::new(frames).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn to_sse(frame: SseFrame) -> SseEvent {
    match frame {
        SseFrame::Data(v) => SseEvent::default().data(v.to_string()),
        SseFrame::Done => SseEvent::default().data("[DONE]"),
    }
}

pub(crate) fn to_api_usage(u: Usage) -> ApiUsage {
    ApiUsage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details: Some(gantry_api::PromptTokensDetails { cached_tokens: u.cached_tokens }),
    }
}

pub(crate) fn to_api_logprobs(lp: Vec<TokenLogprob>) -> ChoiceLogprobs {
    ChoiceLogprobs {
        content: lp
            .into_iter()
            .map(|t| ApiTokenLogprob {
                token: t.token,
                logprob: t.logprob,
                bytes: t.bytes,
                top_logprobs: t
                    .top
                    .into_iter()
                    .map(|a| ApiTopLogprob { token: a.token, logprob: a.logprob, bytes: a.bytes })
                    .collect(),
            })
            .collect(),
    }
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
