//! One request's path, whatever its wire format: pre-admission → parse (each dialect onto a
//! `ValidatedChat`) → model → prepare → admission → images → engine → settlement, then the
//! dialect's answer. Chat Completions (`openai::chat`), Anthropic's Messages (`anthropic`),
//! OpenAI's Responses (`responses`), and the raw-prompt dialects, OpenAI's Completions
//! (`openai::completions`) and llama.cpp's `/infill` (`infill`), only translate at its two
//! ends. A raw request of several prompts runs one engine job per prompt, joined into one
//! answer and one settlement (`several_prompts`). Embeddings (`openai::embeddings`) share its
//! first gate, [`pre_admitted`].

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use gantry_accounts::{Charge, KeyInfo, Outcome as Settled, Pass, Settlement};
use gantry_api::{ApiError, ImageDetail, ValidatedChat};
use gantry_engine::{Event, GenerateRequest, GenerationHandle, ImageInput, Outcome, Usage};

use crate::batches::BatchLine;
use crate::clock::now_secs;
use crate::errors::{refusal_response, task_failed, IntoApiError};
use crate::openai::chat;
use crate::openai::models::key_allows;
use crate::openai::tool_calls::ToolPlan;
use crate::pool::Lease;
use crate::prices::BillingTier;
use crate::request_id::{ClientRequestId, RequestId};
use crate::state::AppState;
use crate::telemetry::traces;

/// The wire format a request came in, and its answer goes out, in. Each is a translation at the
/// edge: both run the same admission, engine and settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// OpenAI's Chat Completions.
    Chat,
    /// Anthropic's Messages (`crate::anthropic`).
    Messages,
    /// OpenAI's Responses (`crate::responses`).
    Responses,
    /// OpenAI's legacy Completions (`crate::openai::completions`): a raw prompt, no template.
    Completions,
    /// llama.cpp's `/infill` (`crate::infill`): a fill-in-the-middle raw prompt.
    Infill,
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    state: State<AppState>,
    key: Extension<KeyInfo>,
    request_id: Extension<RequestId>,
    client_request_id: Extension<ClientRequestId>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    serve(state, key, request_id, client_request_id, headers, body, Dialect::Chat, line).await
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    state: State<AppState>,
    key: Extension<KeyInfo>,
    request_id: Extension<RequestId>,
    client_request_id: Extension<ClientRequestId>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    serve(state, key, request_id, client_request_id, headers, body, Dialect::Messages, line).await
}

/// `POST /v1/responses`.
pub(crate) async fn responses(
    state: State<AppState>,
    key: Extension<KeyInfo>,
    request_id: Extension<RequestId>,
    client_request_id: Extension<ClientRequestId>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    serve(state, key, request_id, client_request_id, headers, body, Dialect::Responses, line).await
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    state: State<AppState>,
    key: Extension<KeyInfo>,
    request_id: Extension<RequestId>,
    client_request_id: Extension<ClientRequestId>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    serve(state, key, request_id, client_request_id, headers, body, Dialect::Completions, line).await
}

/// `POST /infill` (llama.cpp's).
pub(crate) async fn infill(
    state: State<AppState>,
    key: Extension<KeyInfo>,
    request_id: Extension<RequestId>,
    client_request_id: Extension<ClientRequestId>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    serve(state, key, request_id, client_request_id, headers, body, Dialect::Infill, line).await
}

/// One request of any dialect, from the pre-admission to its answer.
#[allow(clippy::too_many_arguments, reason = "the request's parts, each taken apart by axum")]
pub(crate) async fn serve(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    Extension(ClientRequestId(client_request_id)): Extension<ClientRequestId>,
    headers: HeaderMap,
    body: Bytes,
    dialect: Dialect,
    line: Option<Extension<BatchLine>>,
) -> Result<Response, ApiError> {
    let line = line.map(|Extension(line)| line);
    let (st, k) = (state.clone(), key.clone());
    pre_admitted(&state, &key, line.clone().as_ref(), |pass| async move {
        let ids = (request_id, client_request_id);
        match admitted(st, k, ids, line, pass, headers, body, dialect).await {
            Ok(response) => response,
            // The shared path's errors (tools, prompt, grammar, images) in the dialect's own terms.
            Err(e) => match dialect {
                Dialect::Chat | Dialect::Completions => e,
                Dialect::Infill => crate::infill::in_infill_terms(e),
                Dialect::Messages => gantry_api::anthropic::in_messages_terms(e),
                Dialect::Responses => gantry_api::responses::in_responses_terms(e),
            }
            .into_response(),
        }
    })
    .await
}

/// A metered request's first gate: refused while the server drains, then the key's rate limits
/// (not for a batch's `line`) and "any budget left" before the body is even parsed (a refused
/// request costs no parsing, templating, tokenizing, grammar compiling or model loading); `run`
/// does the rest with the pass. An answer given before the full admission (a bad body) reports
/// the pre-admission's count in its `x-ratelimit-*` headers.
pub(crate) async fn pre_admitted<F, Fut>(
    state: &AppState,
    key: &KeyInfo,
    line: Option<&BatchLine>,
    run: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(Pass) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    if state.draining.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let pre_admission = traces::in_span("pre_admission", async {
        match line {
            Some(_) => state.meter.pre_admit_batch_line(key).await,
            None => state.meter.pre_admit(key).await,
        }
    })
    .await;
    let pass = match pre_admission {
        Ok(pass) => pass,
        Err(refused) => return Ok(refusal_response(key, refused)),
    };
    let rate = pass.rate();
    let mut response = run(pass).await;
    if !response.headers().contains_key("x-ratelimit-limit-requests") {
        crate::openai::rate_limit::apply(&rate, response.headers_mut());
    }
    Ok(response)
}

/// The request once pre-admitted: parse, check, load the model, prepare, admit in full, run.
#[allow(clippy::too_many_arguments, reason = "the request's parts, each taken apart by axum")]
async fn admitted(
    state: AppState,
    key: KeyInfo,
    (request_id, client_request_id): (String, Option<String>),
    line: Option<BatchLine>,
    pass: Pass,
    headers: HeaderMap,
    body: Bytes,
    dialect: Dialect,
) -> Result<Response, ApiError> {
    chat::require_json_content_type(&headers)?;
    // A Responses request keeps its parse (the fields its Response repeats, what it stores).
    // The conversation it continues is read only once it holds its preparation turn (below).
    let mut completion = None;
    let (mut chat, mut responses_request) = match dialect {
        Dialect::Chat => (gantry_api::parse_chat_request(&body)?, None),
        Dialect::Messages => (gantry_api::anthropic::parse_messages_request(&body)?, None),
        Dialect::Responses => {
            let request = gantry_api::responses::parse_responses_request(&body)?;
            if request.store && !state.response_retention.is_zero() {
                state.response_storage.check_room()?;
            }
            (request.chat.clone(), Some(request))
        }
        Dialect::Completions | Dialect::Infill => {
            let mut request = if dialect == Dialect::Completions {
                gantry_api::completions::parse_completion_request(&body)?
            } else {
                gantry_api::completions::parse_infill_request(&body)?
            };
            // llama.cpp's clients name no model: the first the key may use.
            if request.chat.model.is_empty() {
                request.chat.model = crate::openai::models::default_model(&state, &key)?;
            }
            let chat = request.chat.clone();
            completion = Some(request);
            (chat, None)
        }
    };
    // A model the key may not use is reported as missing, as OpenAI does.
    let Some(spec) = state.models.resolve(&chat.model).filter(|spec| key_allows(&key, &chat.model, spec)) else {
        return Err(ApiError::model_not_found(&chat.model));
    };
    // Refused before the model is loaded for nothing.
    if !spec.capabilities.generates() {
        return Err(gantry_engine::PrepareError::NotGenerative.into_api_error());
    }
    let tools = ToolPlan::from_request(&chat)?;
    // Held until the request's last event: the model is not unloaded under it.
    let model = state.models.acquire(&chat.model).await.map_err(IntoApiError::into_api_error)?;
    let model_id = model.id().to_string();
    let mut context_capped = false;
    let mut answer_plan = None;
    let mut jobs = {
        // Bounded per key and overall, so one key's flood of huge prompts waits for its own
        // turns instead of taking every blocking thread.
        let _span = traces::span("prepare");
        let _turn = state.prepare_gate.enter(key.id).await;
        if let Some(request) = responses_request.take() {
            let request = crate::responses::continued(&state, &key, request).await?;
            chat = request.chat.clone();
            responses_request = Some(request);
        }
        let scope = gantry_engine::CacheScope(key.cache_scope_id());
        match dialect {
            Dialect::Messages => {
                let (generate, capped) =
                    crate::anthropic::prepare_within_context(&model, &chat, tools.as_ref(), scope).await?;
                context_capped = capped;
                vec![generate]
            }
            Dialect::Completions | Dialect::Infill => {
                let request =
                    completion.as_ref().ok_or_else(|| ApiError::internal("a completion without its parse"))?;
                let prepared = crate::openai::completions::prepare(&model, request, scope).await?;
                answer_plan = Some(prepared.answer);
                prepared.jobs
            }
            _ => vec![chat::prepare(&model, &chat, tools.as_ref(), scope).await?],
        }
    };
    let owner = owner_of(&key);
    // `priority` only for keys allowed it; the answer reports the tier granted. A batch's line
    // runs and is billed in the batch's own tier, whatever its body asked for, and reports
    // `default`.
    let billing = match line {
        Some(_) => BillingTier::Batch,
        None => BillingTier::Service(chat.service_tier.granted(key.priority_tier)),
    };
    chat.service_tier = match billing {
        BillingTier::Service(tier) => tier,
        BillingTier::Batch => gantry_api::ServiceTier::Default,
    };
    if let Some(request) = responses_request.as_mut() {
        request.chat.service_tier = chat.service_tier;
        request.echo.insert("service_tier".into(), chat.service_tier.as_str().into());
    }
    let tier = match billing {
        BillingTier::Service(gantry_api::ServiceTier::Default) => gantry_engine::ServiceTier::Default,
        BillingTier::Service(gantry_api::ServiceTier::Flex) => gantry_engine::ServiceTier::Flex,
        BillingTier::Service(gantry_api::ServiceTier::Priority) => gantry_engine::ServiceTier::Priority,
        BillingTier::Batch => gantry_engine::ServiceTier::Batch,
    };
    traces::annotate_request(&chat.model, &model_id, billing.as_str());
    for job in &mut jobs {
        (job.owner, job.tier, job.streamed) = (owner, tier, chat.stream);
    }
    // The ledger keeps the name the client sent (an alias stays an alias); its price in the tier
    // granted, else the model's.
    let price = state.prices.price(&chat.model, &model_id, billing);
    // Choices per job (per prompt), and over the whole request.
    let n = jobs.first().map_or(1, |j| j.n);
    let choices = n * jobs.len() as u32;
    let prompt_tokens: usize = jobs.iter().map(|j| j.prompt.tokens.len()).sum();
    // `/infill` names the stop string that ended its answer (`stopping_word`).
    let stop = jobs.first().filter(|_| dialect == Dialect::Infill).map(|j| j.stop.clone()).unwrap_or_default();
    // Full admission: tokens per minute and the budget reservation (the request itself was
    // counted by the pre-admission). The ticket settles with the engine's usage report or,
    // dropped unsettled (submission refused, handler dropped), releases.
    let charge = Charge {
        request_id: request_id.clone(),
        client_request_id,
        model: chat.model.to_string(),
        price,
        service_tier: billing.as_str(),
        batch_id: line.map(|line| line.batch_id),
        prompt_tokens: prompt_tokens as u64,
        max_completion_tokens: jobs.iter().map(|j| u64::from(j.max_tokens) * u64::from(j.n)).sum(),
    };
    let ticket = match traces::in_span("admission", state.meter.admit_passed(pass, &key, charge)).await {
        Ok(ticket) => ticket,
        Err(refused) => return Ok(refusal_response(&key, refused)),
    };
    let rate = ticket.rate();
    // Images are fetched only now, once the key is known to be allowed to spend: an unadmitted
    // request makes the server fetch nothing. Refused here, the dropped ticket releases.
    // Only chat dialects have images, and they run one job.
    if let Some(job) = jobs.pop_if(|_| !chat.images.is_empty()) {
        match attach_images(&state, key.id, &model, &chat, job).await {
            Ok(job) => jobs.push(job),
            Err(e) => {
                let mut response = e.into_response();
                crate::openai::rate_limit::apply(&rate, response.headers_mut());
                return Ok(response);
            }
        }
    }
    let handles = model.submit_all(jobs).map_err(IntoApiError::into_api_error)?;
    let GenerationHandle { events, usage } = crate::several_prompts::join(handles, n);
    let journalled = ticket.settle_or_release_when(async move { settlement_of(usage.await) });
    let events = hold_done_until(events, journalled, model);

    let created = now_secs();
    let mut response = match dialect {
        Dialect::Chat => {
            chat::respond(format!("chatcmpl-{request_id}"), created, model_id, &chat, tools, n, events).await?
        }
        Dialect::Messages => {
            let answer = crate::anthropic::Answer {
                id: format!("msg_{request_id}"),
                created,
                model: model_id,
                prompt_tokens,
                context_capped,
            };
            crate::anthropic::respond(answer, &chat, tools, events).await?
        }
        Dialect::Responses => {
            let ids = gantry_api::responses::ResponseIds {
                id: format!("resp_{request_id}"),
                created_at: created,
                model: model_id,
            };
            let request =
                responses_request.ok_or_else(|| ApiError::internal("a Responses request without its parse"))?;
            crate::responses::respond(&state, &key, ids, request, tools, events).await?
        }
        Dialect::Completions => {
            let request = completion.as_ref().ok_or_else(|| ApiError::internal("a completion without its parse"))?;
            let plan = answer_plan.unwrap_or_default();
            let id = format!("cmpl-{request_id}");
            crate::openai::completions::respond(id, created, model_id, request, plan, choices, events).await?
        }
        Dialect::Infill => {
            let answer = crate::infill::InfillAnswer {
                n_ctx: state.models.resolve(&model_id).map_or(0, |spec| spec.config.ctx_size),
                model: model_id,
                n_predict: chat.max_tokens,
                temperature: chat.temperature.unwrap_or(1.0),
                stream: chat.stream,
                plan: answer_plan.unwrap_or_default(),
                probabilities: completion.as_ref().is_some_and(|c| c.logprobs.is_some()),
            };
            crate::infill::respond(answer, stop, events).await?
        }
    };
    crate::openai::rate_limit::apply(&rate, response.headers_mut());
    Ok(response)
}

/// Whose request it is, to the engine: it shares sequences, prompt rows, embedding batches and
/// its queue's bound between tenants, and a tenant's between its keys (by their weights where
/// the engine weighs), and caps each key's sequences.
pub(crate) fn owner_of(key: &KeyInfo) -> gantry_engine::Owner {
    let weight = |w: i64| u32::try_from(w.clamp(1, gantry_accounts::MAX_WEIGHT)).unwrap_or(1);
    gantry_engine::Owner {
        key: key.id as u64,
        key_weight: weight(key.weight),
        tenant: key.tenant_id(),
        tenant_weight: weight(key.tenant_weight),
    }
}

/// Fetches the request's images and puts them into its prompt (decoded, tokenized for the
/// projector, the context checked again with their real size). A model that cannot see gets a
/// clear 400 before any image is fetched. Decoding is preparation: it takes a turn of the
/// key's (`PrepareGate`); fetching, which only waits, does not.
async fn attach_images(
    state: &AppState,
    key_id: i64,
    model: &Lease,
    chat: &ValidatedChat,
    mut generate: GenerateRequest,
) -> Result<GenerateRequest, ApiError> {
    if chat.images.is_empty() {
        return Ok(generate);
    }
    // Checked before any fetch: a request refused anyway sends the server to no URL.
    if !model.model_info().supports_vision {
        return Err(ApiError::invalid_request(
            format!("The model `{}` does not support image inputs; send text content only.", model.id()),
            Some("messages"),
        ));
    }
    let fetched = state.images.load_all(chat.images.iter().map(|p| &p.source)).await?;
    state.images.check_dimensions(&fetched, chat.images.iter().map(|p| p.param.as_str()))?;
    let images = fetched
        .into_iter()
        .zip(&chat.images)
        .map(|(image, part)| ImageInput {
            bytes: image.bytes,
            param: part.param.clone(),
            detail: match part.detail {
                ImageDetail::Auto => gantry_engine::ImageDetail::Auto,
                ImageDetail::Low => gantry_engine::ImageDetail::Low,
                ImageDetail::High => gantry_engine::ImageDetail::High,
            },
        })
        .collect();
    let engine = model.generator();
    let _turn = state.prepare_gate.enter(key_id).await;
    tokio::task::spawn_blocking(move || engine.attach_images(&mut generate, images).map(|()| generate))
        .await
        .map_err(|e| task_failed("image preparation", e))?
        .map_err(IntoApiError::into_api_error)
}

/// Forwards the engine's events, holding the final `Done` (the usage the client is told) until
/// the usage record is on disk, and the lease on the model until the last event. Dropping the
/// returned receiver (client gone) drops the engine's receiver at once, which cancels the
/// request as before.
fn hold_done_until(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    journalled: tokio::sync::oneshot::Receiver<()>,
    model: Lease,
) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Taken here, in the request's task: the trace is not reachable from the spawned one.
    let mut timeline = traces::EngineTimeline::start();
    tokio::spawn(async move {
        // The model stays loaded until the request's events end or its client leaves.
        let _model = model;
        let mut journalled = Some(journalled);
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = tx.closed() => return,
            };
            let Some(event) = event else { return };
            timeline.observe(&event);
            if matches!(event, Event::Done(_)) {
                if let Some(on_disk) = journalled.take() {
                    let _ = on_disk.await;
                }
                timeline.settled();
            }
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    rx
}

/// What the ledger books, from the engine's own usage report, so it is written even when the
/// client disconnects mid-stream. A dropped sender means the engine thread died: the request
/// still settles (as an error, with nothing the engine did not report), clearing its reservation.
/// A batch's line the engine preempted books nothing (`None`): its reservation is released, and
/// the line, run again under the same request id, is billed once, for the run it delivers.
fn settlement_of(usage: Result<Usage, tokio::sync::oneshot::error::RecvError>) -> Option<Settlement> {
    let usage = usage.unwrap_or(Usage { outcome: Outcome::Error, ..Usage::default() });
    let outcome = match usage.outcome {
        Outcome::Completed => Settled::Completed,
        Outcome::Length => Settled::Length,
        Outcome::Cancelled => Settled::Cancelled,
        Outcome::Error => Settled::Error,
        Outcome::Preempted => return None,
    };
    Some(Settlement {
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        completion_tokens: usage.completion_tokens,
        reasoning_tokens: usage.reasoning_tokens,
        outcome,
    })
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
