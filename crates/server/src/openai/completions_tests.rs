//! `/v1/completions` and `/infill` over a scripted engine: several prompts' jobs joined into one
//! answer and one ledger row, `echo`, the stream's chunks, the FIM stop rule's line break given
//! back, and llama-server's answer shape.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gantry_engine::{Event, FinishReason};
use serde_json::{json, Value};

use crate::router_tests::{delta, harness, usage, Harness, ScriptedEngine, KEY};

async fn post(h: &Harness, path: &str, body: Value) -> (StatusCode, String) {
    let request = Request::post(path)
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    h.send(request).await
}

fn hello() -> Vec<Event> {
    vec![delta("Hel"), delta("lo"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(2))]
}

#[tokio::test]
async fn each_prompt_is_a_job_and_the_request_one_answer_and_one_booking() {
    let engine = Arc::new(ScriptedEngine::new(hello(), usage(2)));
    let h = harness(engine.clone()).await;
    let (status, text) =
        post(&h, "/v1/completions", json!({"model": "scripted", "prompt": ["a b", "c"], "echo": true})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["object"], "text_completion");
    let texts: Vec<(u64, &str)> = reply["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(texts, vec![(0, "a bHello"), (1, "cHello")], "echoed prompt, then the answer");
    assert_eq!(reply["choices"][1]["finish_reason"], "stop");
    // Both jobs' usage, summed, is what the client hears and the ledger books.
    assert_eq!(reply["usage"]["prompt_tokens"], 10);
    assert_eq!(reply["usage"]["completion_tokens"], 4);
    assert_eq!(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(*engine.prompts.lock().unwrap(), vec![2, 1]);
    assert_eq!(h.billed_completion_tokens().await, 4);
}

#[tokio::test]
async fn a_stream_is_text_completion_chunks_then_usage_then_done() {
    let h = harness(Arc::new(ScriptedEngine::new(hello(), usage(2)))).await;
    let body = json!({"model": "scripted", "prompt": "x", "stream": true, "stream_options": {"include_usage": true}});
    let (status, text) = post(&h, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"), "{text}");
    let joined: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(joined, "Hello");
    let last = chunks.last().unwrap();
    assert_eq!((last["choices"].as_array().unwrap().len(), &last["usage"]["completion_tokens"]), (0, &json!(2)));
}

#[tokio::test]
async fn a_middle_cut_by_the_fim_stop_rule_keeps_its_last_line_break() {
    let events = vec![
        delta("    y = 1"),
        // The rule's stop strings come after the request's own (none here).
        Event::StopSequence { choice: 0, index: 0 },
        Event::Finished { choice: 0, reason: FinishReason::Stop },
        Event::Done(usage(3)),
    ];
    let h = harness(Arc::new(ScriptedEngine::new(events, usage(3)))).await;
    let body = json!({"model": "scripted", "prompt": "def f():\n", "suffix": "    return y\n"});
    let (status, text) = post(&h, "/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["choices"][0]["text"], "    y = 1\n");

    // The same on /infill, in llama-server's shape, on the key's first model (none named).
    let body = json!({"input_prefix": "def f():\n", "input_suffix": "    return y\n", "n_predict": 8});
    let (status, text) = post(&h, "/infill", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["content"], "    y = 1\n");
    assert_eq!((reply["stop"].as_bool(), reply["stop_type"].as_str()), (Some(true), Some("word")));
    assert_eq!((reply["tokens_predicted"].as_u64(), reply["tokens_evaluated"].as_u64()), (Some(3), Some(5)));
    assert_eq!(reply["model"], "scripted");
}

#[tokio::test]
async fn refusals_are_openais_400s_before_the_engine() {
    let engine = Arc::new(ScriptedEngine::new(hello(), usage(2)));
    let h = harness(engine.clone()).await;
    for (body, param) in [
        (json!({"model": "scripted", "prompt": "x", "response_format": {"type": "json_object"}}), "response_format"),
        (json!({"model": "scripted", "prompt": "x", "best_of": 2}), "best_of"),
        (json!({"model": "scripted"}), "prompt"),
    ] {
        let (status, text) = post(&h, "/v1/completions", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["param"], param, "{text}");
    }
    assert!(engine.prompts.lock().unwrap().is_empty(), "nothing reached the engine");
}

#[tokio::test]
async fn a_prompt_beyond_the_context_is_named_as_a_prompt() {
    let h = harness(Arc::new(ScriptedEngine::new(hello(), usage(2)))).await;
    let long = "word ".repeat(100);
    let (status, text) =
        post(&h, "/v1/completions", json!({"model": "scripted", "prompt": long, "max_tokens": 10})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (&error["error"]["code"], &error["error"]["param"]),
        (&json!("context_length_exceeded"), &json!("prompt"))
    );
    assert!(
        error["error"]["message"].as_str().unwrap().contains("100 in your prompt; 10 for the completion"),
        "{text}"
    );
}
