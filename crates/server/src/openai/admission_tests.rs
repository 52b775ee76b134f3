//! Admission before any work: a request a key may not make is refused before its body is
//! parsed, its prompt prepared or its model loaded. Test-only.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use gantry_accounts::{KeyUpdate, UsageRecord};
use gantry_engine::{Event, FinishReason};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::router_tests::{body, delta, harness, usage, Harness, ScriptedEngine, KEY};

fn engine() -> Arc<ScriptedEngine> {
    let events = vec![delta("ok"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    Arc::new(ScriptedEngine::new(events, usage(1)))
}

async fn limit(h: &Harness, update: KeyUpdate) {
    h.accounts.update_key("router-test", &update).await.unwrap();
}

/// Posts `raw` as a chat request; the status, headers and the body as JSON (`Null` if not).
async fn post(h: &Harness, raw: impl Into<Body>) -> (StatusCode, HeaderMap, Value) {
    let request = Request::post("/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(raw.into())
        .unwrap();
    let response = h.app.clone().oneshot(request).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A body that is expensive to parse and would be refused by validation anyway: 40 tools with
/// 10 KB names.
fn hostile_body() -> String {
    let tools: Vec<Value> = (0..40)
        .map(|i| json!({"type": "function", "function": {"name": format!("{i}{}", "n".repeat(10_000))}}))
        .collect();
    body(json!({"tools": tools})).to_string()
}

#[tokio::test]
async fn a_key_at_its_request_limit_is_refused_before_its_body_is_read() {
    let h = harness(engine()).await;
    limit(&h, KeyUpdate { rpm_limit: Some(Some(1)), ..Default::default() }).await;
    // The minute's one request is a bad body: refused by validation, but counted, as OpenAI does.
    let (status, headers, error) = post(&h, "{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(headers["x-ratelimit-limit-requests"], "1");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    for raw in ["{not json".to_string(), hostile_body(), body(json!({})).to_string()] {
        let (status, headers, error) = post(&h, raw).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
        assert_eq!(error["error"]["code"], "rate_limit_exceeded", "{error}");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
        assert!(headers.contains_key("retry-after"));
    }
    assert_eq!(h.loads.load(Ordering::SeqCst), 0, "no model is loaded for a refused request");
}

#[tokio::test]
async fn a_key_out_of_budget_is_refused_before_its_body_is_read() {
    let h = harness(engine()).await;
    limit(&h, KeyUpdate { budget_tokens: Some(Some(30)), ..Default::default() }).await;
    let key = h.accounts.find_key("router-test").await.unwrap();
    let now = crate::clock::now_ms();
    let spent = UsageRecord {
        request_id: "earlier".into(),
        client_request_id: None,
        key_id: key.id,
        model: "scripted".into(),
        prompt_tokens: 10,
        cached_tokens: 0,
        completion_tokens: 20,
        reasoning_tokens: 0,
        cost_nanos: 0,
        outcome: "completed".into(),
        service_tier: "default".into(),
        batch_id: None,
        started_at_ms: now,
        finished_at_ms: now,
    };
    h.accounts.record_usage(&spent).await.unwrap();
    for raw in [hostile_body(), body(json!({"max_tokens": 1})).to_string()] {
        let (status, _, error) = post(&h, raw).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
        assert_eq!(error["error"]["code"], "insufficient_quota", "{error}");
        assert!(error["error"]["message"].as_str().unwrap().contains("30-token budget"), "{error}");
    }
    // Anthropic's dialect: its 402 `billing_error` (which its SDK does not retry), and its
    // `request-id` header.
    let messages = Request::post("/v1/messages")
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"model": "scripted", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}"#))
        .unwrap();
    let response = h.app.clone().oneshot(messages).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    assert!(response.headers()["request-id"].to_str().unwrap().starts_with("req_"));
    let error: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!((error["type"].as_str(), error["error"]["type"].as_str()), (Some("error"), Some("billing_error")));
    assert_eq!(h.loads.load(Ordering::SeqCst), 0, "no model is loaded for a refused request");
}

#[tokio::test]
async fn an_admitted_request_counts_once_against_the_request_limit() {
    let h = harness(engine()).await;
    limit(&h, KeyUpdate { rpm_limit: Some(Some(2)), tpm_limit: Some(Some(1000)), ..Default::default() }).await;
    let (status, headers, answer) = post(&h, body(json!({"max_tokens": 5})).to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "1");
    // The prompt's 5 words and max_tokens were counted at the full admission.
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "990");
    let (status, headers, answer) = post(&h, body(json!({"max_tokens": 5})).to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    let (status, _, error) = post(&h, body(json!({})).to_string()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
    assert_eq!(h.loads.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn hostile_tools_get_a_400_without_loading_the_model() {
    let h = harness(engine()).await;
    let (status, _, error) = post(&h, hostile_body()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["param"], "tools[0].function.name", "{error}");
    let many: Vec<Value> =
        (0..129).map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}})).collect();
    let (status, _, error) = post(&h, body(json!({"tools": many})).to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["param"], "tools", "{error}");
    assert_eq!(h.loads.load(Ordering::SeqCst), 0);
}
