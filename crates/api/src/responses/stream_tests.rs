use serde_json::{json, Map, Value};

use super::*;

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": null})
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
    let first = s.on_chunk(&chunk(json!({"content": "Hel"}), None));
    assert_eq!(
        names(&first),
        ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    );
    s.on_chunk(&chunk(json!({"content": "lo"}), None));
    s.on_chunk(&chunk(json!({}), Some("stop")));
    s.on_chunk(&json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}));
    let end = s.finish();
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
    let head = json!({"tool_calls": [{"index": 0, "id": "call_7", "type": "function", "function": {"name": "f", "arguments": ""}}]});
    let added = s.on_chunk(&chunk(head, None));
    assert_eq!(added[0].data["item"]["type"], "function_call");
    assert_eq!(added[0].data["item"]["id"], "fc_7");
    let args = json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":1}"}}]});
    assert_eq!(names(&s.on_chunk(&chunk(args, None))), ["response.function_call_arguments.delta"]);
    s.on_chunk(&chunk(json!({}), Some("length")));
    let end = s.finish();
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
    let events = s.on_chunk(&json!({"error": {"message": "boom", "type": "server_error"}}));
    assert_eq!(names(&events), ["response.failed"]);
    assert_eq!(events[0].data["response"]["error"]["message"], "boom");
    assert!(s.finish().is_empty());
}

#[test]
fn thinking_streams_as_a_reasoning_item_before_the_message() {
    let (mut s, _) = start();
    let first = s.on_chunk(&chunk(json!({"reasoning_content": "Add", "reasoning": "Add"}), None));
    assert_eq!(
        names(&first),
        ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
    );
    assert_eq!(first[0].data["item"]["type"], "reasoning");
    assert_eq!(first[1].data["part"], json!({"type": "reasoning_text", "text": ""}));
    assert_eq!(first[2].data["delta"], "Add");
    let answer = s.on_chunk(&chunk(json!({"content": "4"}), None));
    assert_eq!(
        names(&answer)[..3],
        ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
    );
    assert_eq!(answer[2].data["item"]["content"], json!([{"type": "reasoning_text", "text": "Add"}]));
    assert_eq!(answer[3].data["output_index"], 1, "the message follows the reasoning item");
    s.on_chunk(&json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                                                  "completion_tokens_details": {"reasoning_tokens": 4}}}));
    let end = s.finish();
    let whole = &end.last().unwrap().data["response"];
    assert_eq!(whole["output"][0]["id"], "rs_1");
    assert_eq!(whole["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
}

#[test]
fn a_message_cut_by_max_output_tokens_ends_incomplete_as_when_collected() {
    let (mut s, _) = start();
    s.on_chunk(&chunk(json!({"content": "Once upon"}), None));
    s.on_chunk(&chunk(json!({}), Some("length")));
    let end = s.finish();
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
    let lp = |t: &str| json!({"token": t, "logprob": -0.5, "bytes": t.as_bytes(), "top_logprobs": []});
    let with_lp = |delta: Value, lps: Vec<Value>| json!({"choices": [{"index": 0, "delta": delta, "logprobs": {"content": lps}, "finish_reason": null}]});
    let first = s.on_chunk(&with_lp(json!({"content": "Hi"}), vec![lp("Hi")]));
    assert_eq!(first[2].data["logprobs"], json!([lp("Hi")]));
    s.on_chunk(&with_lp(json!({"content": ""}), vec![lp("")]));
    s.on_chunk(&chunk(json!({}), Some("stop")));
    let end = s.finish();
    assert_eq!(end[0].data["logprobs"], json!([lp("Hi"), lp("")]), "the end token's entry too, as in Chat");
    let whole = &end.last().unwrap().data["response"];
    assert_eq!(whole["output"][0]["content"][0]["logprobs"].as_array().map(Vec::len), Some(2));
}
