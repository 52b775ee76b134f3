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

#[tokio::test]
async fn stored_responses_are_not_found_and_continuing_one_is_refused() {
    let h = harness(Arc::new(ScriptedEngine::new(script(), usage(2)))).await;
    let get = Request::get("/v1/responses/resp_1").header("authorization", format!("Bearer {KEY}")).body(Body::empty());
    let (status, text) = h.send(get.unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.contains("does not store responses"));
    let anonymous = Request::get("/v1/responses/resp_1").body(Body::empty()).unwrap();
    assert_eq!(h.send(anonymous).await.0, StatusCode::UNAUTHORIZED);
    let (status, text) = post(&h, json!({"model": "scripted", "input": "x", "previous_response_id": "resp_1"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["param"], "previous_response_id");
    assert_eq!(h.billed_completion_tokens().await, 0);
}
