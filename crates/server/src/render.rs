//! `POST /v1/chat/completions/render` and `/v1/completions/render`, as vLLM serves them: the
//! token ids a request would decode, without generating. A chat request is rendered exactly as
//! the chat path prepares it (its template, with its tools); a completions request's prompts
//! (each with its `suffix` as a FIM prompt) one object each. An inference gateway's prefix-aware
//! routing (llm-d's KV-cache indexer) reads them, and so can anyone inspecting a prompt.
//!
//! Bounded as `/tokenize` is (`tokenize::metered_count`): the key's requests per minute, its
//! preparation turn, and the rendered tokens against its tokens per minute; nothing is booked.
//! Images are refused: their positions depend on the image, which rendering does not fetch.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use gantry_accounts::KeyInfo;
use gantry_api::ApiError;
use gantry_engine::GenerateRequest;
use serde_json::{json, Value};

use crate::errors::IntoApiError;
use crate::openai::chat;
use crate::openai::models::key_allows;
use crate::openai::tool_calls::ToolPlan;
use crate::pool::Lease;
use crate::request_id::RequestId;
use crate::state::AppState;
use crate::tokenize::metered_count;

/// `POST /v1/chat/completions/render`: one object, vLLM's `GenerateRequest`.
pub(crate) async fn chat_render(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Extension(RequestId(id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let rendered = async {
        chat::require_json_content_type(&headers)?;
        let chat = gantry_api::parse_chat_request(&body)?;
        if let Some(image) = chat.images.first() {
            return Err(ApiError::invalid_value(
                &image.param,
                "Rendering does not take images: send the messages without them.",
            ));
        }
        let tools = ToolPlan::from_request(&chat)?;
        let _turn = state.prepare_gate.enter(key.id).await;
        let model = generating_model(&state, &key, &chat.model).await?;
        let scope = gantry_engine::CacheScope(key.cache_scope_id());
        let job = match chat::prepare_or_refusal(&model, &chat, tools.as_ref(), scope).await? {
            Ok(job) => job,
            Err(refused) => return Err(refused.into_api_error()),
        };
        Ok((job.prompt.tokens.len() as u64, rendered(&format!("chatcmpl-{id}"), model.id(), &job)))
    };
    metered_count(&state, &key, rendered).await
}

/// `POST /v1/completions/render`: one object per prompt, in order.
pub(crate) async fn completions_render(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Extension(RequestId(id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let rendered = async {
        chat::require_json_content_type(&headers)?;
        let request = gantry_api::completions::parse_completion_request(&body)?;
        let _turn = state.prepare_gate.enter(key.id).await;
        let model = generating_model(&state, &key, &request.chat.model).await?;
        let scope = gantry_engine::CacheScope(key.cache_scope_id());
        let jobs = crate::openai::completions::prepare(&model, &request, scope).await?.jobs;
        let tokens = jobs.iter().map(|j| j.prompt.tokens.len() as u64).sum();
        let each = jobs.iter().enumerate().map(|(i, job)| rendered(&format!("cmpl-{id}-{i}"), model.id(), job));
        Ok((tokens, Value::Array(each.collect())))
    };
    metered_count(&state, &key, rendered).await
}

/// The model `name`, if the key may use it and it generates, loaded for the rendering.
async fn generating_model(state: &AppState, key: &KeyInfo, name: &str) -> Result<Lease, ApiError> {
    let Some(spec) = state.models.resolve(name).filter(|spec| key_allows(key, name, spec)) else {
        return Err(ApiError::model_not_found(name));
    };
    if !spec.capabilities.generates() {
        return Err(gantry_engine::PrepareError::NotGenerative.into_api_error());
    }
    state.models.acquire(name).await.map_err(IntoApiError::into_api_error)
}

/// vLLM's `GenerateRequest` of a prepared job: its token ids and what it would sample with.
fn rendered(request_id: &str, model: &str, job: &GenerateRequest) -> Value {
    let s = &job.sampling;
    json!({
        "request_id": request_id,
        "model": model,
        "token_ids": job.prompt.tokens,
        "features": null,
        "sampling_params": {
            "n": job.n,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "seed": s.seed,
            "stop": job.stop,
            "max_tokens": job.max_tokens,
            "logprobs": job.logprobs,
        },
    })
}
