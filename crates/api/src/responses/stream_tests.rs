//! OpenAI Responses streaming: message, function-call and reasoning items with their deltas, an
//! error that fails the response, and a cut answer ending `incomplete` as when collected.

use serde_json::{json, Map};

use super::*;
use crate::chat_delta::done_for_tests as done;
use crate::ApiError;

fn text(text: &str) -> ChatDelta {
    ChatDelta::Text { choice: 0, text: text.into(), logprobs: None }
}

fn finished(reason: FinishReason) -> ChatDelta {
    ChatDelta::Finished { choice: 0, reason, stop_sequence: None }
}

fn start() -> (ResponseStream, Vec<ResponseEvent>) {
    ResponseStream::start(ResponseIds { id: "resp_1".into(), created_at: 5, model: "m".into() }, Map::new())
}

fn names(events: &[ResponseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

#[test]
fn text_streams_as_one_message_item_and_completes_with_usage() {
    let (mut s, opening) = start();
    assert_eq!(names(&opening), ["response.created", "response.in_progress"]);
    assert_eq!(opening[0].data["response"]["status"], "in_progress");
    assert!(s.on_delta(ChatDelta::TurnStart { choice: 0, forced_call: false }).is_empty());
    let first = s.on_delta(text("Hel"));
    assert_eq!(
        names(&first),
        ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    );
    s.on_delta(text("lo"));
    s.on_delta(finished(FinishReason::Stop));
    let end = s.on_delta(done(3, 0, 2, 0));
    assert_eq!(
        names(&end),
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    );
    assert_eq!(end[0].data["text"], "Hello");
    let whole = &end[3].data["response"];
    assert_eq!(whole["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(whole["usage"]["output_tokens"], 2);
    let numbers: Vec<u64> =
        opening.iter().chain(&first).chain(&end).filter_map(|e| e.data["sequence_number"].as_u64()).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
}

#[test]
fn a_call_is_a_function_call_item_with_argument_deltas() {
    let (mut s, _) = start();
    let added = s.on_delta(ChatDelta::ToolCallStart { choice: 0, index: 0, id: "call_7".into(), name: "f".into() });
    assert_eq!(added[0].data["item"]["type"], "function_call");
    assert_eq!(added[0].data["item"]["id"], "fc_7");
    let args = ChatDelta::ToolCallArguments { choice: 0, index: 0, fragment: "{\"a\":1}".into() };
    assert_eq!(names(&s.on_delta(args)), ["response.function_call_arguments.delta"]);
    s.on_delta(finished(FinishReason::Length));
    let end = s.on_delta(done(3, 0, 4, 0));
    assert_eq!(
        names(&end),
        ["response.function_call_arguments.done", "response.output_item.done", "response.incomplete"]
    );
    assert_eq!(end[0].data["arguments"], "{\"a\":1}");
    assert_eq!(end[2].data["response"]["incomplete_details"]["reason"], "max_output_tokens");
}

#[test]
fn an_error_fails_the_response() {
    let (mut s, _) = start();
    let events = s.on_delta(ChatDelta::Error(ApiError::internal("boom")));
    assert_eq!(names(&events), ["response.failed"]);
    assert_eq!(events[0].data["response"]["error"], json!({"code": "server_error", "message": "boom"}));
    assert!(s.on_delta(done(3, 0, 0, 0)).is_empty());
}

#[test]
fn thinking_streams_as_a_reasoning_item_before_the_message() {
    let (mut s, _) = start();
    let first = s.on_delta(ChatDelta::Reasoning { choice: 0, text: "Add".into() });
    assert_eq!(
        names(&first),
        ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
    );
    assert_eq!(first[0].data["item"]["type"], "reasoning");
    assert_eq!(first[1].data["part"], json!({"type": "reasoning_text", "text": ""}));
    assert_eq!(first[2].data["delta"], "Add");
    let answer = s.on_delta(text("4"));
    assert_eq!(
        names(&answer)[..3],
        ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
    );
    assert_eq!(answer[2].data["item"]["content"], json!([{"type": "reasoning_text", "text": "Add"}]));
    assert_eq!(answer[3].data["output_index"], 1, "the message follows the reasoning item");
    let end = s.on_delta(done(3, 0, 5, 4));
    let whole = &end.last().unwrap().data["response"];
    assert_eq!(whole["output"][0]["id"], "rs_1");
    assert_eq!(whole["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
}

#[test]
fn a_message_cut_by_max_output_tokens_ends_incomplete_as_when_collected() {
    let (mut s, _) = start();
    s.on_delta(text("Once upon"));
    s.on_delta(finished(FinishReason::Length));
    let end = s.on_delta(done(3, 0, 2, 0));
    assert_eq!(names(&end).last(), Some(&"response.incomplete"));
    let item_done = end.iter().find(|e| e.event == "response.output_item.done").unwrap();
    assert_eq!(item_done.data["item"]["status"], "incomplete");
    let whole = &end.last().unwrap().data["response"];
    assert_eq!(
        (whole["status"].as_str(), whole["output"][0]["status"].as_str()),
        (Some("incomplete"), Some("incomplete"))
    );
    assert_eq!(whole["incomplete_details"]["reason"], "max_output_tokens");
}

#[test]
fn logprobs_asked_for_ride_the_deltas_and_the_finished_message() {
    let (mut s, _) = start();
    let lp =
        |t: &str| TokenLogprob { token: t.into(), logprob: -0.5, bytes: t.as_bytes().to_vec(), top_logprobs: vec![] };
    let lp_json = |t: &str| json!({"token": t, "logprob": -0.5, "bytes": t.as_bytes(), "top_logprobs": []});
    let with_lp = |t: &str| ChatDelta::Text { choice: 0, text: t.into(), logprobs: Some(vec![lp(t)]) };
    let first = s.on_delta(with_lp("Hi"));
    assert_eq!(first[2].data["logprobs"], json!([lp_json("Hi")]));
    s.on_delta(with_lp(""));
    s.on_delta(finished(FinishReason::Stop));
    let end = s.on_delta(done(3, 0, 2, 0));
    assert_eq!(end[0].data["logprobs"], json!([lp_json("Hi"), lp_json("")]), "the end token's entry too, as in Chat");
    let whole = &end.last().unwrap().data["response"];
    assert_eq!(whole["output"][0]["content"][0]["logprobs"].as_array().map(Vec::len), Some(2));
}
