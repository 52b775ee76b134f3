//! `POST /tokenize` and `/detokenize`, in llama-server's shape (`content`, `add_special`,
//! `with_pieces` → `tokens`; `tokens` → `content`) and vLLM's (`prompt`, or `messages` rendered
//! by the chat template, → `tokens`, `count`, `max_model_len`; `tokens` → `prompt`). Their cost
//! is bounded as `count_tokens`' is: each counts against the key's requests per minute, waits
//! for its turn in the key's preparation gate, and a tokenization's tokens count against the
//! key's tokens per minute (a 429 when they do not fit); nothing is booked.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gantry_accounts::KeyInfo;
use gantry_api::ApiError;
use serde_json::{json, Value};

use crate::errors::{refusal_response, task_failed, IntoApiError};
use crate::openai::chat;
use crate::openai::models::key_allows;
use crate::pool::Lease;
use crate::state::AppState;

/// Most token ids `/detokenize` takes: about what the body limit lets through anyway.
const MAX_TOKENS: usize = 1 << 20;

/// `POST /tokenize`.
pub(crate) async fn tokenize(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let counted = async {
        let answer = tokens_of(&state, &key, &headers, &body).await?;
        Ok((answer["count"].as_u64().unwrap_or(0), answer))
    };
    metered_count(&state, &key, counted).await
}

/// A request that counts tokens without generating (`/tokenize`, Anthropic's `count_tokens`):
/// it counts against the key's requests per minute, then `count` runs (a future, so nothing of
/// it runs before that), and the tokens it counted against the key's tokens per minute (a 429
/// when they do not fit); nothing is booked. `count` gives the tokens and the answer's body.
pub(crate) async fn metered_count(
    state: &AppState,
    key: &KeyInfo,
    count: impl std::future::Future<Output = Result<(u64, Value), ApiError>>,
) -> Result<Response, ApiError> {
    let pass = match state.meter.pre_admit(key).await {
        Ok(pass) => pass,
        Err(refused) => return Ok(refusal_response(key, refused)),
    };
    let mut rate = pass.rate();
    let mut response = match count.await {
        Ok((n, answer)) => match state.meter.count_passed_tokens(&pass, key, n).await {
            Ok(counted) => {
                rate = counted;
                Json(answer).into_response()
            }
            Err(refused) => return Ok(refusal_response(key, refused)),
        },
        Err(e) => e.into_response(),
    };
    crate::openai::rate_limit::apply(&rate, response.headers_mut());
    Ok(response)
}

/// `POST /detokenize`.
pub(crate) async fn detokenize(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let pass = match state.meter.pre_admit(&key).await {
        Ok(pass) => pass,
        Err(refused) => return Ok(refusal_response(&key, refused)),
    };
    let rate = pass.rate();
    let mut response = match text_of(&state, &key, &headers, &body).await {
        // llama-server's clients read `content`, vLLM's `prompt`.
        Ok(text) => Json(json!({"content": text, "prompt": text})).into_response(),
        Err(e) => e.into_response(),
    };
    crate::openai::rate_limit::apply(&rate, response.headers_mut());
    Ok(response)
}

fn body_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid_request("The request body must be a JSON object.", None)),
        Err(e) => Err(ApiError::invalid_request(format!("The request body is not valid JSON: {e}"), None)),
    }
}

fn flag(obj: &serde_json::Map<String, Value>, name: &str, default: bool) -> Result<bool, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid_value(name, format!("Invalid type for '{name}': expected a boolean."))),
    }
}

/// The model the request names (or the key's first, as llama-server serves one), loaded once
/// the request holds its preparation turn.
async fn model_of(state: &AppState, key: &KeyInfo, obj: &serde_json::Map<String, Value>) -> Result<Lease, ApiError> {
    let name = match obj.get("model") {
        None | Some(Value::Null) => crate::openai::models::default_model(state, key)?,
        Some(Value::String(s)) if s.is_empty() => crate::openai::models::default_model(state, key)?,
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::invalid_value("model", "Invalid type for 'model': expected a string.")),
    };
    if !state.models.resolve(&name).is_some_and(|spec| key_allows(key, &name, spec)) {
        return Err(ApiError::model_not_found(&name));
    }
    state.models.acquire(&name).await.map_err(IntoApiError::into_api_error)
}

async fn tokens_of(state: &AppState, key: &KeyInfo, headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    chat::require_json_content_type(headers)?;
    let obj = body_object(body)?;
    // vLLM's chat form: the template renders the messages, as a chat request's prompt.
    let chat_request = if obj.contains_key("messages") {
        let mut request = obj.clone();
        request.entry("model").or_insert_with(|| Value::String("-".into()));
        request.insert("max_tokens".into(), json!(1));
        let mut chat = gantry_api::parse_chat_request(Value::Object(request).to_string().as_bytes())?;
        if obj.get("model").and_then(Value::as_str).is_none_or(str::is_empty) {
            chat.model = crate::openai::models::default_model(state, key)?;
        }
        Some(chat)
    } else {
        None
    };
    let _turn = state.prepare_gate.enter(key.id).await;
    let model = model_of(state, key, &obj).await?;
    let max_model_len = state.models.resolve(model.id()).map_or(0, |spec| spec.config.ctx_size);
    let tokens: Vec<i32> = if let Some(chat) = chat_request {
        let scope = gantry_engine::CacheScope(key.cache_scope_id());
        match chat::prepare_or_refusal(&model, &chat, None, scope).await? {
            Ok(generate) => generate.prompt.tokens,
            Err(refused) => return Err(refused.into_api_error()),
        }
    } else {
        let (text, param) = match (obj.get("content"), obj.get("prompt")) {
            (Some(Value::String(s)), _) => (s.clone(), "content"),
            (_, Some(Value::String(s))) => (s.clone(), "prompt"),
            _ => {
                return Err(ApiError::invalid_value(
                    "content",
                    "Send 'content' (or 'prompt', or 'messages') to tokenize.",
                ))
            }
        };
        // llama-server adds no BOS unless asked; vLLM adds the special tokens by default.
        let add_special = match param {
            "content" => flag(&obj, "add_special", false)?,
            _ => flag(&obj, "add_special_tokens", true)?,
        };
        let parse_special = flag(&obj, "parse_special", true)?;
        let engine = model.generator();
        tokio::task::spawn_blocking(move || engine.tokenize(&text, add_special, parse_special))
            .await
            .map_err(|e| task_failed("tokenization", e))?
    };
    let engine = model.generator();
    let listed: Vec<Value> = if flag(&obj, "with_pieces", false)? {
        tokens.iter().map(|&t| json!({"id": t, "piece": engine.detokenize(&[t])})).collect()
    } else {
        tokens.iter().map(|&t| json!(t)).collect()
    };
    Ok(json!({"tokens": listed, "count": tokens.len(), "max_model_len": max_model_len, "token_strs": null}))
}

async fn text_of(state: &AppState, key: &KeyInfo, headers: &HeaderMap, body: &[u8]) -> Result<String, ApiError> {
    chat::require_json_content_type(headers)?;
    let obj = body_object(body)?;
    let tokens: Vec<i32> = match obj.get("tokens") {
        Some(Value::Array(ids)) if ids.len() <= MAX_TOKENS => ids
            .iter()
            .map(|t| {
                t.as_i64()
                    .and_then(|t| i32::try_from(t).ok())
                    .ok_or_else(|| ApiError::invalid_value("tokens", "Invalid 'tokens': token ids are integers."))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::invalid_value("tokens", "Invalid 'tokens': array too long.")),
        _ => {
            return Err(ApiError::invalid_value(
                "tokens",
                "Missing required parameter: 'tokens' (an array of token ids).",
            ))
        }
    };
    let _turn = state.prepare_gate.enter(key.id).await;
    let model = model_of(state, key, &obj).await?;
    let n_vocab = model.model_info().n_vocab;
    if let Some(t) = tokens.iter().find(|&&t| t < 0 || t >= n_vocab) {
        return Err(ApiError::invalid_value(
            "tokens",
            format!("Invalid token id {t}: outside the model's vocabulary (0..{n_vocab})."),
        ));
    }
    let engine = model.generator();
    tokio::task::spawn_blocking(move || engine.detokenize(&tokens)).await.map_err(|e| task_failed("detokenization", e))
}
