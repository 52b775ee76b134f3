//! `POST /v1/rerank` and `/rerank`: a cross-encoder (a GGUF with rank pooling) scores each
//! (query, document) pair, on the embeddings path (`openai::embeddings::run_metered`): the
//! same first gate, preparation turn, admission on the pairs' tokens, fair batches in the
//! `Embedder` and settlement. A document too long for the model is cut to fit, as Cohere's and
//! Jina's rerank APIs truncate; the tokens billed are those scored.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gantry_accounts::{KeyInfo, Pass};
use gantry_api::rerank::{parse_rerank_request, rerank_results};
use gantry_api::ApiError;

use crate::errors::{task_failed, IntoApiError};
use crate::openai::chat;
use crate::openai::embeddings::{run_metered, Metered};
use crate::openai::models::key_allows;
use crate::request_id::{ClientRequestId, RequestId};
use crate::state::AppState;

/// `POST /v1/rerank`, `/rerank`.
pub(crate) async fn rerank(
    State(state): State<AppState>,
    Extension(key): Extension<KeyInfo>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    Extension(ClientRequestId(client_request_id)): Extension<ClientRequestId>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ids = (request_id, client_request_id);
    crate::pipeline::pre_admitted(&state, &key, None, |pass| async {
        ranked(&state, &key, ids, pass, &headers, &body).await.unwrap_or_else(IntoResponse::into_response)
    })
    .await
}

async fn ranked(
    state: &AppState,
    key: &KeyInfo,
    (request_id, client_request_id): (String, Option<String>),
    pass: Pass,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    chat::require_json_content_type(headers)?;
    let request = parse_rerank_request(body)?;
    // llama.cpp's clients name no model: the first reranker the key may use.
    let name = if request.model.is_empty() {
        let spec = state.models.specs().iter().find(|s| s.capabilities.ranks() && key_allows(key, &s.id, s));
        spec.map(|s| s.id.clone()).ok_or_else(|| crate::openai::models::no_model_named("reranker"))?
    } else {
        request.model.clone()
    };
    let spec = state.models.resolve(&name).filter(|spec| key_allows(key, &name, spec));
    let spec = spec.ok_or_else(|| ApiError::model_not_found(&name))?;
    if !spec.capabilities.ranks() {
        return Err(ApiError::invalid_request(
            format!("The model `{name}` does not rerank: it is not a cross-encoder (its GGUF declares no rank pooling). Name a reranker (GET /v1/models lists what each model can do)."),
            Some("model"),
        ));
    }
    let model = state.models.acquire(&name).await.map_err(IntoApiError::into_api_error)?;
    let engine = model.generator();
    let limit = engine.embedding_shape().map_or(0, |s| s.max_input_tokens);
    let model_id = model.id().to_string();
    let billing = crate::prices::BillingTier::Service(gantry_api::ServiceTier::Default);
    let price = state.prices.price(&name, &model_id, billing);
    let (query_only, pairs) = {
        let _turn = state.prepare_gate.enter(key.id).await;
        let (engine, query, documents) = (engine.clone(), request.query.clone(), request.documents.clone());
        tokio::task::spawn_blocking(move || {
            let pair = |d: &str| engine.ranking_input(&query, d).unwrap_or_default();
            (pair("").len(), documents.iter().map(|d| pair(d)).collect::<Vec<_>>())
        })
        .await
        .map_err(|e| task_failed("tokenization", e))?
    };
    if query_only >= limit {
        let mut e = ApiError::invalid_value(
            "query",
            format!(
                "The query takes {query_only} of this model's {limit} tokens per pair, leaving no room for a document."
            ),
        );
        e.code = Some("context_length_exceeded".into());
        return Err(e);
    }
    let pairs = pairs.into_iter().map(|p| fit(p, limit)).collect();
    let metered = Metered {
        request_id: request_id.clone(),
        client_request_id,
        name: name.clone(),
        price,
        billing,
        batch_id: None,
    };
    let (scores, prompt_tokens, rate) = match run_metered(state, key, pass, model, metered, pairs).await? {
        Ok(done) => done,
        Err(refusal) => return Ok(refusal),
    };
    let logits: Vec<f32> = scores.iter().map(|s| s.first().copied().unwrap_or(f32::NEG_INFINITY)).collect();
    let answer = rerank_results(&format!("rerank-{request_id}"), &model_id, &request, &logits, prompt_tokens);
    let mut response = Json(answer).into_response();
    crate::openai::rate_limit::apply(&rate, response.headers_mut());
    Ok(response)
}

/// `pair` cut to `limit` tokens: the document's tail goes, its closing token (the last) stays.
fn fit(mut pair: Vec<i32>, limit: usize) -> Vec<i32> {
    if pair.len() > limit && limit > 0 {
        let last = pair[pair.len() - 1];
        pair.truncate(limit - 1);
        pair.push(last);
    }
    pair
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pair_too_long_loses_its_documents_tail_and_keeps_its_end() {
        assert_eq!(super::fit(vec![2, 5, 3, 7, 8, 9, 3], 5), [2, 5, 3, 7, 3]);
        assert_eq!(super::fit(vec![2, 5, 3], 5), [2, 5, 3]);
    }

    #[test]
    fn no_reranker_for_the_key_is_a_404_that_says_so() {
        let e = crate::openai::models::no_model_named("reranker");
        assert_eq!((e.status.as_u16(), e.code.as_deref()), (404, Some("model_not_found")));
        assert!(e.message.contains("no reranker") && !e.message.contains("``"), "{}", e.message);
    }
}
