//! `/v1/responses` through the router with a scripted engine: the translation both ways and
//! the ledger.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gantry_engine::{Event, FinishReason};
use serde_json::{json, Value};

use crate::router_tests::{delta, harness, usage, Harness, ScriptedEngine, KEY};

async fn post(h: &Harness, body: Value) -> (StatusCode, String) {
    let request = Request::post("/v1/responses")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    h.send(request).await
}

fn script() -> Vec<Event> {
    vec![delta("Hel"), delta("lo"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(2))]
}

#[tokio::test]
async fn a_response_is_the_answer_as_an_output_message_billed_as_told() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let (status, text) =
        post(&h, json!({"model": "scripted", "input": "say hello", "instructions": "Be brief."})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((r["object"].as_str(), r["status"].as_str()), (Some("response"), Some("completed")));
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(r["instructions"], "Be brief.");
    assert_eq!(r["usage"]["output_tokens"], 2);
    assert_eq!(h.billed_completion_tokens().await, 2);
}

#[tokio::test]
async fn a_streamed_response_is_the_semantic_event_sequence() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello", "stream": true})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ],
        "{text}"
    );
    let last: Value =
        serde_json::from_str(text.lines().filter_map(|l| l.strip_prefix("data: ")).next_back().unwrap()).unwrap();
    assert_eq!(last["response"]["usage"]["output_tokens"], 2);
    assert_eq!(h.billed_completion_tokens().await, 2);
}

async fn call(h: &Harness, method: &str, path: &str, key: &str) -> (StatusCode, Value) {
    let request = Request::builder().method(method).uri(path).header("authorization", format!("Bearer {key}"));
    let (status, text) = h.send(request.body(Body::empty()).unwrap()).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_stored_response_is_its_keys_alone_to_read_continue_and_delete() {
    let engine = Arc::new(ScriptedEngine::new(script(), usage(2)));
    let h = harness(engine.clone()).await;
    let other = h.accounts.create_key("other").await.unwrap().secret;
    let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello"})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let first: Value = serde_json::from_str(&text).unwrap();
    let id = first["id"].as_str().unwrap().to_string();
    assert_eq!(first["store"], true, "OpenAI's default");
    let (status, got) = call(&h, "GET", &format!("/v1/responses/{id}"), KEY).await;
    assert_eq!((status, &got), (StatusCode::OK, &first));
    let (status, got) = call(&h, "GET", &format!("/v1/responses/{id}"), &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another key: {got}");
    // Its input, listed as the SDK's `responses.input_items.list` reads it; another key's 404.
    let (status, items) = call(&h, "GET", &format!("/v1/responses/{id}/input_items"), KEY).await;
    assert_eq!(status, StatusCode::OK, "{items}");
    assert_eq!(items["data"].as_array().map(Vec::len), Some(1), "the input only, not the output: {items}");
    assert_eq!(items["data"][0]["content"], json!([{"type": "input_text", "text": "say hello"}]));
    assert_eq!(items["first_id"], items["data"][0]["id"]);
    let (status, _) = call(&h, "GET", &format!("/v1/responses/{id}/input_items"), &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, e) = call(&h, "GET", &format!("/v1/responses/{id}/input_items?limit=0"), KEY).await;
    assert_eq!((status, e["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")));
    assert_eq!(call(&h, "DELETE", &format!("/v1/responses/{id}"), &other).await.0, StatusCode::NOT_FOUND);
    // Continued: the stored turn comes first (the scripted prompt counts one token a word).
    let (status, text) =
        post(&h, json!({"model": "scripted", "input": "and again", "previous_response_id": id, "store": false})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let second: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(second["previous_response_id"], id.as_str());
    assert_eq!(second["store"], false);
    assert_eq!(*engine.prompts.lock().unwrap(), [2, 5], "say hello / Hello / and again");
    assert_eq!(
        call(&h, "GET", &format!("/v1/responses/{}", second["id"].as_str().unwrap()), KEY).await.0,
        StatusCode::NOT_FOUND
    );
    let other_key = Request::post("/v1/responses")
        .header("authorization", format!("Bearer {other}"))
        .header("content-type", "application/json")
        .body(Body::from(json!({"model": "scripted", "input": "x", "previous_response_id": id}).to_string()))
        .unwrap();
    let (status, text) = h.send(other_key).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "another key cannot continue it: {text}");
    let (status, deleted) = call(&h, "DELETE", &format!("/v1/responses/{id}"), KEY).await;
    assert_eq!((status, &deleted["deleted"]), (StatusCode::OK, &json!(true)));
    assert_eq!(call(&h, "GET", &format!("/v1/responses/{id}"), KEY).await.0, StatusCode::NOT_FOUND);
    let anonymous = Request::get(format!("/v1/responses/{id}")).body(Body::empty()).unwrap();
    assert_eq!(h.send(anonymous).await.0, StatusCode::UNAUTHORIZED);
}

/// Errors past the translation (tools, the prompt) name the Responses fields, not the chat
/// fields they were translated to.
#[tokio::test]
async fn errors_of_the_shared_path_name_the_responses_fields() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let forced_with_format = json!({"model": "scripted", "input": "x",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "required", "text": {"format": {"type": "json_object"}}});
    let (status, text) = post(&h, forced_with_format).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let e: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(e["error"]["param"], "text.format", "{text}");
    assert!(!text.contains("response_format"), "{text}");
    let long = json!({"model": "scripted", "input": "word ".repeat(5000)});
    let (status, text) = post(&h, long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let e: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (e["error"]["param"].as_str(), e["error"]["code"].as_str()),
        (Some("input"), Some("context_length_exceeded"))
    );
    assert!(!e["error"]["message"].as_str().unwrap().contains("messages"), "{text}");
}

/// A harness whose state `tweak` changed, with the test key's limits set by `limits`.
async fn tweaked(tweak: impl FnOnce(&mut crate::state::AppState), limits: gantry_accounts::KeyUpdate) -> Harness {
    let engine = Arc::new(ScriptedEngine::new(script(), usage(2)));
    let options = crate::router::RouterOptions::default();
    let h = crate::router_tests::harness_tweaked(engine, None, options, crate::router::Routes::All, tweak).await;
    h.accounts.update_key("router-test", &limits).await.unwrap();
    h
}

fn error_of(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap_or(Value::Null)["error"].clone()
}

/// Reading, listing and deleting stored responses are requests like any other: a key past its
/// requests per minute gets 429 for them too.
#[tokio::test]
async fn reads_of_stored_responses_count_against_the_keys_requests_per_minute() {
    let limits = gantry_accounts::KeyUpdate { rpm_limit: Some(Some(3)), ..Default::default() };
    let h = tweaked(|_| {}, limits).await;
    for path in ["/v1/responses/resp_a", "/v1/responses/resp_a/input_items"] {
        assert_eq!(call(&h, "GET", path, KEY).await.0, StatusCode::NOT_FOUND);
    }
    assert_eq!(call(&h, "DELETE", "/v1/responses/resp_a", KEY).await.0, StatusCode::NOT_FOUND);
    for (method, path) in [
        ("GET", "/v1/responses/resp_a"),
        ("GET", "/v1/responses/resp_a/input_items"),
        ("DELETE", "/v1/responses/resp_a"),
    ] {
        let (status, e) = call(&h, method, path, KEY).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{method} {path}: {e}");
        assert_eq!(e["error"]["code"], "rate_limit_exceeded", "{e}");
    }
}

/// A bad body continuing a conversation is refused for what is wrong with it, before the
/// stored conversation it names is looked for.
#[tokio::test]
async fn a_bad_body_is_refused_before_its_conversation_is_read() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let body = json!({"model": "scripted", "input": "x", "previous_response_id": "resp_gone", "temperature": "hot"});
    let (status, text) = post(&h, body).await;
    assert_eq!((status, error_of(&text)["param"].as_str()), (StatusCode::BAD_REQUEST, Some("temperature")), "{text}");
}

/// The conversation is read in the request's preparation turn: while the key's turns are
/// taken, a continuing request waits without reading anything.
#[tokio::test]
async fn a_conversation_is_read_only_in_the_requests_preparation_turn() {
    let gate = crate::openai::prepare_gate::PrepareGate::new(4, 1);
    let held = gate.clone();
    let h = tweaked(move |state| state.prepare_gate = held, Default::default()).await;
    let key_id = h.accounts.find_key("router-test").await.unwrap().id;
    let turn = gate.enter(key_id).await;
    let body = json!({"model": "scripted", "input": "x", "previous_response_id": "resp_gone"});
    let request = post(&h, body);
    tokio::pin!(request);
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut request).await;
    assert!(early.is_err(), "answered before its turn, so the conversation was read before it: {early:?}");
    drop(turn);
    let (status, text) = request.await;
    assert_eq!(
        (status, error_of(&text)["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("previous_response_id")),
        "{text}"
    );
}

#[tokio::test]
async fn below_the_disk_floor_no_response_is_stored_and_the_request_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let watched = dir.path().to_path_buf();
    let h = tweaked(
        move |state| {
            state.response_storage.watched_dir = Some(watched);
            state.response_storage.min_free_bytes = u64::MAX;
        },
        Default::default(),
    )
    .await;
    let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello"})).await;
    let e = error_of(&text);
    assert_eq!((status.as_u16(), e["param"].as_str()), (507, Some("store")), "{text}");
    assert_eq!(e["code"], "insufficient_storage");
    let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello", "store": false})).await;
    assert_eq!(status, StatusCode::OK, "store: false is served: {text}");
}

#[tokio::test]
async fn a_response_past_the_ceiling_is_answered_but_not_stored() {
    let h = tweaked(|state| state.response_storage.max_response_bytes = 100, Default::default()).await;
    let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello"})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["store"], false, "the answer says it was not kept");
    let id = r["id"].as_str().unwrap();
    assert_eq!(call(&h, "GET", &format!("/v1/responses/{id}"), KEY).await.0, StatusCode::NOT_FOUND);
    // Streamed, the final event says so.
    let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello", "stream": true})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let last: Value =
        serde_json::from_str(text.lines().filter_map(|l| l.strip_prefix("data: ")).next_back().unwrap()).unwrap();
    assert_eq!(last["response"]["store"], false, "{last}");
}

#[tokio::test]
async fn a_key_past_its_quota_keeps_its_newest_responses() {
    let quota = gantry_accounts::StoredQuota { rows: 2, bytes: 1 << 20 };
    let h = tweaked(move |state| state.response_storage.quota = quota, Default::default()).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, text) = post(&h, json!({"model": "scripted", "input": "say hello"})).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let r: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(r["store"], true);
        ids.push(r["id"].as_str().unwrap().to_string());
        // Rows are ordered by their creation time in milliseconds.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut found = Vec::new();
    for id in &ids {
        found.push(call(&h, "GET", &format!("/v1/responses/{id}"), KEY).await.0);
    }
    assert_eq!(found, [StatusCode::NOT_FOUND, StatusCode::OK, StatusCode::OK]);
}
