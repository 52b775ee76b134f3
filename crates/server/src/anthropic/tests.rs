//! `/v1/messages` through the router with a scripted engine: the translation both ways, the
//! ledger, and errors in Anthropic's shape.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gantry_engine::{Event, FinishReason};
use serde_json::{json, Value};

use crate::router_tests::{delta, harness, usage, Harness, ScriptedEngine, KEY};

async fn post(h: &Harness, path: &str, key: Option<&str>, body: Value) -> (StatusCode, String) {
    let mut request =
        Request::post(path).header("content-type", "application/json").header("anthropic-version", "2023-06-01");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    h.send(request.body(Body::from(body.to_string())).unwrap()).await
}

fn message(extra: Value) -> Value {
    let mut b = json!({"model": "scripted", "max_tokens": 16, "messages": [{"role": "user", "content": "say hello to the test"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn script() -> Vec<Event> {
    vec![
        delta("Hel"),
        delta("lo"),
        Event::StopSequence { choice: 0, index: 1 },
        Event::Finished { choice: 0, reason: FinishReason::Stop },
        Event::Done(usage(2)),
    ]
}

#[tokio::test]
async fn a_message_is_answered_as_anthropic_does_and_billed_as_told() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let (status, text) = post(&h, "/v1/messages", Some(KEY), message(json!({"stop_sequences": ["X", "END"]}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let m: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(m["type"], "message");
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["content"], json!([{"type": "text", "text": "Hello"}]));
    assert_eq!((m["stop_reason"].as_str(), m["stop_sequence"].as_str()), (Some("stop_sequence"), Some("END")));
    assert_eq!(m["usage"]["input_tokens"], 5);
    assert_eq!(m["usage"]["output_tokens"], 2);
    assert_eq!(h.billed_completion_tokens().await, 2);
}

#[tokio::test]
async fn a_streamed_message_is_the_event_sequence_the_sdk_expects() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let (status, text) =
        post(&h, "/v1/messages", Some(KEY), message(json!({"stream": true, "stop_sequences": ["X", "END"]}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    let data: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let end = &data[6];
    assert_eq!(end["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "END"}));
    assert_eq!(end["usage"]["output_tokens"], 2);
    assert!(!text.contains("[DONE]"));
    assert_eq!(h.billed_completion_tokens().await, 2);
}

#[tokio::test]
async fn errors_leave_in_anthropics_shape_with_their_status() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let cases = [
        (None, message(json!({})), 401, "authentication_error"),
        (Some("sk-gantry-not-a-real-key-000000000000000"), message(json!({})), 401, "authentication_error"),
        (
            Some(KEY),
            json!({"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
        ),
        (Some(KEY), message(json!({"model": "nope"})), 404, "not_found_error"),
    ];
    for (key, body, status, kind) in cases {
        let (got, text) = post(&h, "/v1/messages", key, body.clone()).await;
        assert_eq!(got.as_u16(), status, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "error", "{text}");
        assert_eq!(v["error"]["type"], kind, "{text}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{text}");
    }
    // Chat Completions keeps OpenAI's shape.
    let (got, text) = h.chat(json!({"model": "scripted"})).await;
    assert_eq!(got, StatusCode::BAD_REQUEST);
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"]["message"].is_string());
}

#[tokio::test]
async fn count_tokens_counts_the_prompt_and_bills_nothing() {
    let engine = Arc::new(ScriptedEngine::new(script(), usage(2)));
    let h = harness(engine).await;
    let body =
        json!({"model": "scripted", "messages": [{"role": "user", "content": "one two three"}], "system": "four five"});
    let (status, text) = post(&h, "/v1/messages/count_tokens", Some(KEY), body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({"input_tokens": 5}));
    assert_eq!(h.billed_completion_tokens().await, 0);
}

#[tokio::test]
async fn one_key_one_limit_across_the_three_apis_and_429s_in_each_shape() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let update = gantry_accounts::KeyUpdate { rpm_limit: Some(Some(3)), ..Default::default() };
    h.accounts.update_key("router-test", &update).await.unwrap();
    let (status, text) = h.chat(crate::router_tests::body(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let responses = Request::post("/v1/responses")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Body::from(json!({"model": "scripted", "input": "say hello"}).to_string()))
        .unwrap();
    assert_eq!(h.send(responses).await.0, StatusCode::OK);
    assert_eq!(post(&h, "/v1/messages", Some(KEY), message(json!({}))).await.0, StatusCode::OK);
    // The minute's three requests are spent, whichever API made them.
    let (status, text) = post(&h, "/v1/messages", Some(KEY), message(json!({}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("rate_limit_error")));
    let (status, text) = h.chat(crate::router_tests::body(json!({}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(h.billed_completion_tokens().await, 6, "three answers of two tokens, one ledger");
}

/// An error quoting a huge value (a 70k-character model name) still arrives whole, in
/// Anthropic's shape: errors are capped, not dropped.
#[tokio::test]
async fn an_error_quoting_a_huge_value_keeps_anthropics_shape() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let (status, text) = post(&h, "/v1/messages", Some(KEY), message(json!({"model": "m".repeat(70_000)}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    let e: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{err}: {text:.200}"));
    assert_eq!(
        (e["type"].as_str(), e["error"]["type"].as_str()),
        (Some("error"), Some("not_found_error")),
        "{text:.300}"
    );
    assert!(text.len() < 4096, "{}", text.len());
}

/// The auth scheme's name is case-insensitive; the key may also come as Bearer on this route.
#[tokio::test]
async fn a_bearer_key_in_any_case_is_taken() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let request = Request::post("/v1/messages")
            .header("content-type", "application/json")
            .header("authorization", format!("{scheme} {KEY}"))
            .body(Body::from(message(json!({})).to_string()))
            .unwrap();
        let (status, text) = h.send(request).await;
        assert_eq!(status, StatusCode::OK, "{scheme}: {text}");
    }
    let (status, text) = post(&h, "/v1/messages", None, message(json!({}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(text.contains("x-api-key"), "{text}");
}

/// `message_start` opens once the engine says how much of the prompt was cached, and splits the
/// prompt as the `message_delta` at the end does: clients that read usage from either agree.
#[tokio::test]
async fn a_stream_splits_cached_input_tokens_from_its_start() {
    let mut events = vec![Event::Cached { tokens: 3 }];
    events.extend(script());
    let cached = gantry_engine::Usage { cached_tokens: 3, ..usage(2) };
    if let Some(Event::Done(u)) = events.last_mut() {
        *u = cached;
    }
    let h = harness(Arc::new(ScriptedEngine::new(events, cached))).await;
    let (status, text) = post(&h, "/v1/messages", Some(KEY), message(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let data: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let start = &data[0]["message"]["usage"];
    let delta = &data.iter().find(|d| d["type"] == "message_delta").unwrap()["usage"];
    for usage in [start, delta] {
        assert_eq!(
            (usage["input_tokens"].as_u64(), usage["cache_read_input_tokens"].as_u64()),
            (Some(2), Some(3)),
            "{text}"
        );
    }
}

/// A prompt longer than the model's context is counted all the same, as Anthropic counts it;
/// only a message to run gets the context-length 400.
#[tokio::test]
async fn count_tokens_counts_a_prompt_beyond_the_context() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let long = vec!["word"; 100].join(" ");
    let body = json!({"model": "scripted", "messages": [{"role": "user", "content": long}]});
    let (status, text) = post(&h, "/v1/messages/count_tokens", Some(KEY), body.clone()).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()), (StatusCode::OK, json!({"input_tokens": 100})));
    let (status, text) = post(&h, "/v1/messages", Some(KEY), message(json!({"messages": body["messages"]}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
}

/// Errors past the translation name the Messages fields, not the chat fields.
#[tokio::test]
async fn errors_of_the_shared_path_name_the_messages_fields() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let forced_with_format = message(json!({
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}));
    let (status, text) = post(&h, "/v1/messages", Some(KEY), forced_with_format).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("output_config.format") && !text.contains("response_format"), "{text}");
}

/// `max_tokens` beyond what the context leaves is a ceiling, as at Anthropic: the answer runs to
/// the context's end and says so (`model_context_window_exceeded`), streamed or not; within the
/// context, a cut answer is `max_tokens` as ever.
#[tokio::test]
async fn max_tokens_past_the_context_stops_at_its_end() {
    let cut = vec![delta("Hel"), Event::Finished { choice: 0, reason: FinishReason::Length }, Event::Done(usage(1))];
    let h = harness(Arc::new(ScriptedEngine::new(cut, usage(1)))).await;
    // The scripted engine's context is 64 tokens; Claude Code sends 32,000.
    let (status, text) = post(&h, "/v1/messages", Some(KEY), message(json!({"max_tokens": 32000}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["stop_reason"], "model_context_window_exceeded", "{v}");
    let (status, text) =
        post(&h, "/v1/messages", Some(KEY), message(json!({"max_tokens": 32000, "stream": true}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains(r#""stop_reason":"model_context_window_exceeded""#), "{text}");
    let (_, text) = post(&h, "/v1/messages", Some(KEY), message(json!({"max_tokens": 5}))).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["stop_reason"], "max_tokens", "{text}");
    // A prompt beyond the context is still refused.
    let long = message(json!({"messages": [{"role": "user", "content": "word ".repeat(100)}]}));
    assert_eq!(post(&h, "/v1/messages", Some(KEY), long).await.0, StatusCode::BAD_REQUEST);
}

/// Anthropic's SDK (`models.list`, `models.retrieve`) gets its own shape; OpenAI's clients, which
/// send no `anthropic-version`, keep theirs.
#[tokio::test]
async fn models_answer_anthropics_sdk_in_its_shape() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let get = |path: &str, anthropic: bool| {
        let mut request = Request::get(path).header("x-api-key", KEY);
        if anthropic {
            request = request.header("anthropic-version", "2023-06-01");
        }
        request.body(Body::empty()).unwrap()
    };
    let (status, text) = h.send(get("/v1/models", true)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["data"][0]["type"], "model", "{list}");
    assert_eq!((list["first_id"].as_str(), list["has_more"].as_bool()), (Some("scripted"), Some(false)));
    assert!(list["data"][0]["created_at"].as_str().unwrap().ends_with('Z'), "{list}");
    let (_, text) = h.send(get("/v1/models/scripted", true)).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["display_name"], "scripted", "{text}");
    let (_, text) = h.send(get("/v1/models", false)).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["object"], "list", "{text}");
}

/// Counting a prompt's tokens counts them against the key's tokens per minute.
#[tokio::test]
async fn count_tokens_counts_against_the_tokens_per_minute() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let limits = gantry_accounts::KeyUpdate { tpm_limit: Some(Some(8)), ..Default::default() };
    h.accounts.update_key("router-test", &limits).await.unwrap();
    // Five words, five tokens: they fit once, not twice.
    let (status, text) = post(&h, "/v1/messages/count_tokens", Some(KEY), message(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = post(&h, "/v1/messages/count_tokens", Some(KEY), message(json!({}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    let e: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(e["error"]["type"], "rate_limit_error", "Anthropic's shape: {text}");
}

/// A count waiting for its key's preparation turn holds no model: nothing is loaded for it
/// until its turn comes.
#[tokio::test]
async fn count_tokens_waits_for_its_turn_without_a_model() {
    let gate = crate::openai::prepare_gate::PrepareGate::new(4, 1);
    let held = gate.clone();
    let engine = Arc::new(ScriptedEngine::new(script(), usage(2)));
    let options = crate::router::RouterOptions::default();
    let h = crate::router_tests::harness_tweaked(engine, None, options, crate::router::Routes::All, move |state| {
        state.prepare_gate = held
    })
    .await;
    let key_id = h.accounts.find_key("router-test").await.unwrap().id;
    let turn = gate.enter(key_id).await;
    let request = post(&h, "/v1/messages/count_tokens", Some(KEY), message(json!({})));
    tokio::pin!(request);
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut request).await;
    assert!(early.is_err(), "{early:?}");
    assert_eq!(h.loads.load(std::sync::atomic::Ordering::SeqCst), 0, "no model was taken while it waited");
    drop(turn);
    let (status, text) = request.await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(h.loads.load(std::sync::atomic::Ordering::SeqCst), 1);
}
