//! Reranking (`POST /v1/rerank`, `/rerank`) in the shape Jina, Cohere, vLLM and llama-server
//! share: a `query`, `documents` (strings, or objects with a `text`), `top_n` and
//! `return_documents`; the answer lists `results` of `index` and `relevance_score`, best first.

use serde_json::{json, Value};

use crate::completions::{body_object, request_object};
use crate::fields::{check_array_len, get, opt_bool, opt_int, type_error};
use crate::ApiError;

/// Most documents one request may rank.
pub const MAX_DOCUMENTS: usize = 1000;

/// A rerank request, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RerankRequest {
    /// Empty when the client named none (llama.cpp's clients): the server picks one.
    pub model: String,
    pub query: String,
    pub documents: Vec<String>,
    /// How many results to return, best first; all when absent.
    pub top_n: Option<usize>,
    /// Each result carries its document's text (`document.text`).
    pub return_documents: bool,
}

const KNOWN_FIELDS: &[&str] = &["model", "query", "documents", "top_n", "return_documents", "user"];

/// Parses and validates a rerank request body. `null` is absent.
pub fn parse_rerank_request(body: &[u8]) -> Result<RerankRequest, ApiError> {
    let value = request_object(body, KNOWN_FIELDS)?;
    let obj = body_object(&value)?;
    let model = match get(obj, "model") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("model", "a string", other)),
    };
    let query = match get(obj, "query") {
        None => return Err(ApiError::invalid_value("query", "Missing required parameter: 'query'.")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(ApiError::invalid_value("query", "Invalid 'query': empty string."))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("query", "a string", other)),
    };
    let documents = match get(obj, "documents") {
        None => return Err(ApiError::invalid_value("documents", "Missing required parameter: 'documents'.")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid_value("documents", "Invalid 'documents': empty array."))
        }
        Some(Value::Array(items)) => {
            check_array_len("documents", items, MAX_DOCUMENTS)?;
            items.iter().enumerate().map(|(i, d)| document_text(i, d)).collect::<Result<Vec<_>, _>>()?
        }
        Some(other) => return Err(type_error("documents", "an array", other)),
    };
    let top_n = opt_int(obj, "top_n", 1, i64::MAX)?.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let return_documents = opt_bool(obj, "return_documents")?.unwrap_or(true);
    Ok(RerankRequest { model, query, documents, top_n, return_documents })
}

/// A document as a string, or an object with a `text` string (Cohere's and Jina's form).
fn document_text(i: usize, d: &Value) -> Result<String, ApiError> {
    let param = format!("documents[{i}]");
    match d {
        Value::String(s) => Ok(s.clone()),
        Value::Object(o) => match o.get("text") {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ApiError::invalid_value(&param, format!("Invalid '{param}': an object needs a 'text' string."))),
        },
        other => Err(type_error(&param, "a string or an object with 'text'", other)),
    }
}

/// The answer: the documents' scores (a logistic of each pair's logit, in 0–1 as
/// sentence-transformers' `CrossEncoder` gives them), best first, `top_n` of them.
pub fn rerank_results(id: &str, model: &str, request: &RerankRequest, logits: &[f32], prompt_tokens: u64) -> Value {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Best first; equal scores keep the documents' order.
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(request.top_n.unwrap_or(usize::MAX));
    let results: Vec<Value> = order
        .into_iter()
        .map(|i| {
            let score = 1.0 / (1.0 + (-f64::from(logits[i])).exp());
            let mut result = json!({"index": i, "relevance_score": score});
            if request.return_documents {
                result["document"] = json!({"text": request.documents[i]});
            }
            result
        })
        .collect();
    json!({
        "id": id,
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<RerankRequest, ApiError> {
        parse_rerank_request(v.to_string().as_bytes())
    }

    #[test]
    fn documents_are_strings_or_texts_and_the_model_may_be_left_out() {
        let r = parse(json!({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1})).unwrap();
        assert_eq!(r.model, "");
        assert_eq!(r.documents, ["a", "b"]);
        assert_eq!((r.top_n, r.return_documents), (Some(1), true));
        let r = parse(json!({"model": "m", "query": "q", "documents": ["a"], "return_documents": false})).unwrap();
        assert_eq!((r.model.as_str(), r.return_documents), ("m", false));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let param = |v: Value| parse(v).unwrap_err().param;
        assert_eq!(param(json!({"documents": ["a"]})).as_deref(), Some("query"));
        assert_eq!(param(json!({"query": " ", "documents": ["a"]})).as_deref(), Some("query"));
        assert_eq!(param(json!({"query": "q"})).as_deref(), Some("documents"));
        assert_eq!(param(json!({"query": "q", "documents": []})).as_deref(), Some("documents"));
        assert_eq!(param(json!({"query": "q", "documents": [1]})).as_deref(), Some("documents[0]"));
        assert_eq!(param(json!({"query": "q", "documents": [{"title": "x"}]})).as_deref(), Some("documents[0]"));
        assert_eq!(param(json!({"query": "q", "documents": ["a"], "top_n": 0})).as_deref(), Some("top_n"));
        assert_eq!(param(json!({"query": "q", "documents": ["a"], "rank_fields": []})).as_deref(), Some("rank_fields"));
        let many = vec!["d"; MAX_DOCUMENTS + 1];
        assert_eq!(param(json!({"query": "q", "documents": many})).as_deref(), Some("documents"));
    }

    #[test]
    fn results_are_best_first_cut_to_top_n_with_scores_in_0_1() {
        let request = parse(json!({"query": "q", "documents": ["a", "b", "c"], "top_n": 2})).unwrap();
        let v = rerank_results("rerank-1", "m", &request, &[-1.0, 2.0, 0.0], 9);
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!((results[0]["index"].as_u64(), results[1]["index"].as_u64()), (Some(1), Some(2)));
        assert!((results[0]["relevance_score"].as_f64().unwrap() - 0.880_797).abs() < 1e-5);
        assert_eq!(results[1]["relevance_score"], 0.5);
        assert_eq!(results[0]["document"], json!({"text": "b"}));
        assert_eq!(v["usage"], json!({"prompt_tokens": 9, "total_tokens": 9}));
        let bare = RerankRequest { return_documents: false, top_n: None, ..request };
        let v = rerank_results("rerank-1", "m", &bare, &[0.0, 0.0, 0.0], 9);
        assert_eq!(v["results"].as_array().unwrap().len(), 3);
        assert!(v["results"][0].get("document").is_none());
        assert_eq!(v["results"][2]["index"], 2, "ties keep the documents' order");
    }
}
