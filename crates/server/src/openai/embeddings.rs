//! `POST /v1/embeddings`: the same path as a chat request, with an embedding model's
//! [`gantry_engine::Embedder`] as its engine: pre-admission → parse → model → tokenize (in the
//! key's preparation turn) → admission (the inputs' tokens against the key's tokens per minute
//! and budget) → embed → settlement → the answer. The settlement is booked by a task of its own
//! that waits for the vectors, so a client that leaves is billed for what was computed, and
//! the answer leaves only once its usage record is written, as chat's final usage does.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gantry_accounts::{Charge, KeyInfo, Outcome, Pass, Settlement};
use gantry_api::completions::PromptInput;
use gantry_api::embeddings::{embedding_list, parse_embedding_request};
use gantry_api::ApiError;
use gantry_engine::EmbedError;

use crate::batches::BatchLine;
use crate::errors::{refusal_response, task_failed, IntoApiError};
use crate::openai::chat;
use crate::openai::models::key_allows;
use crate::prices::BillingTier;
use crate::request_id::{ClientRequestId, RequestId};
use crate::state::AppState;

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    Extension(ClientRequestId(client_request_id)): Extension<ClientRequestId>,
    line: Option<Extension<BatchLine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let line = line.map(|Extension(line)| line);
    let ids = (request_id, client_request_id);
    crate::pipeline::pre_admitted(&state, &key, line.clone().as_ref(), |pass| async {
        embed(&state, &key, ids, line, pass, &headers, &body).await.unwrap_or_else(IntoResponse::into_response)
    })
    .await
}

async fn embed(
    state: &AppState,
    key: &KeyInfo,
    (request_id, client_request_id): (String, Option<String>),
    line: Option<BatchLine>,
    pass: Pass,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    chat::require_json_content_type(headers)?;
    let request = parse_embedding_request(body)?;
    let name = request.model.as_str();
    // A model the key may not use is reported as missing, as OpenAI does.
    let spec = state.models.resolve(name).filter(|spec| key_allows(key, name, spec));
    let spec = spec.ok_or_else(|| ApiError::model_not_found(name))?;
    if !spec.capabilities.embeds() {
        return Err(ApiError::invalid_request(
            format!("The model `{name}` does not give embeddings: it generates text. Name an embedding model (GET /v1/models lists what each model can do)."),
            Some("model"),
        ));
    }
    let model = state.models.acquire(name).await.map_err(IntoApiError::into_api_error)?;
    let engine = model.generator();
    let shape = engine
        .embedding_shape()
        .ok_or_else(|| EmbedError::NotEmbeddingModel { model: name.into() }.into_api_error())?;
    if let Some(d) = request.dimensions.filter(|&d| d != shape.dimensions) {
        return Err(ApiError::invalid_value(
            "dimensions",
            format!(
                "Invalid 'dimensions': the model `{name}` gives vectors of {} dimensions and cannot shorten them, but got {d}.",
                shape.dimensions
            ),
        ));
    }
    let model_id = model.id().to_string();
    let billing = match line {
        Some(_) => BillingTier::Batch,
        None => BillingTier::Service(gantry_api::ServiceTier::Default),
    };
    let price = state.prices.price(name, model.id(), billing);
    let inputs = {
        let _turn = state.prepare_gate.enter(key.id).await;
        let (engine, inputs) = (engine.clone(), request.inputs.clone());
        tokio::task::spawn_blocking(move || {
            inputs
                .into_iter()
                .map(|input| match input {
                    // With the model's special tokens; client text never spells control tokens.
                    PromptInput::Text(text) => engine.tokenize(&text, true, false),
                    PromptInput::Tokens(ids) => ids,
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| task_failed("tokenization", e))?
    };
    gantry_engine::check_embedding_inputs(&inputs, shape.max_input_tokens, engine.model_info().n_vocab)
        .map_err(IntoApiError::into_api_error)?;
    let batch_id = line.map(|line| line.batch_id);
    let metered = Metered { request_id, client_request_id, name: name.to_string(), price, billing, batch_id };
    let (vectors, prompt_tokens, rate) = match run_metered(state, key, pass, model, metered, inputs).await? {
        Ok(done) => done,
        Err(refusal) => return Ok(refusal),
    };
    let mut response =
        Json(embedding_list(&model_id, &vectors, request.encoding_format, prompt_tokens)).into_response();
    crate::openai::rate_limit::apply(&rate, response.headers_mut());
    Ok(response)
}

/// What a metered embedding job is booked under.
pub(crate) struct Metered {
    pub request_id: String,
    pub client_request_id: Option<String>,
    /// The model as the client named it (an alias stays an alias in the ledger).
    pub name: String,
    pub price: gantry_accounts::Price,
    pub billing: BillingTier,
    /// The batch it is a line of, if any.
    pub batch_id: Option<String>,
}

/// Admits `inputs` (their tokens against the key's tokens per minute and budget), embeds them
/// on the model, and settles from a task of its own that waits for the vectors: a client that
/// leaves is billed for what was computed. Gives the vectors, the tokens billed and the rate
/// state for the headers once the record is journalled, or the refusal's response.
pub(crate) async fn run_metered(
    state: &AppState,
    key: &KeyInfo,
    pass: Pass,
    model: crate::pool::Lease,
    metered: Metered,
    inputs: Vec<Vec<i32>>,
) -> Result<Result<(gantry_engine::Embeddings, u64, gantry_accounts::RateStatus), Response>, ApiError> {
    let prompt_tokens = inputs.iter().map(Vec::len).sum::<usize>() as u64;
    let charge = Charge {
        request_id: metered.request_id,
        client_request_id: metered.client_request_id,
        model: metered.name,
        price: metered.price,
        service_tier: metered.billing.as_str(),
        batch_id: metered.batch_id,
        prompt_tokens,
        max_completion_tokens: 0,
    };
    let ticket = match state.meter.admit_passed(pass, key, charge).await {
        Ok(ticket) => ticket,
        Err(refused) => return Ok(Err(refusal_response(key, refused))),
    };
    let rate = ticket.rate();
    let answer = model.embed(crate::pipeline::owner_of(key), inputs);
    let (vectors_tx, vectors_rx) = tokio::sync::oneshot::channel();
    let journalled = ticket.settle_when(async move {
        // Held until the vectors are computed: the model is not unloaded under its job.
        let _model = model;
        let result = answer.await.unwrap_or(Err(EmbedError::Stopped));
        let computed = result.is_ok();
        let _ = vectors_tx.send(result);
        Settlement {
            // At most `MAX_INPUTS` inputs of at most `BATCH_TOKENS` tokens: far below u32::MAX.
            prompt_tokens: if computed { u32::try_from(prompt_tokens).unwrap_or(u32::MAX) } else { 0 },
            cached_tokens: 0,
            completion_tokens: 0,
            reasoning_tokens: 0,
            outcome: if computed { Outcome::Completed } else { Outcome::Error },
        }
    });
    let vectors = vectors_rx.await.unwrap_or(Err(EmbedError::Stopped)).map_err(IntoApiError::into_api_error)?;
    let _ = journalled.await;
    Ok(Ok((vectors, prompt_tokens, rate)))
}
