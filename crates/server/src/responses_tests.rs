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
