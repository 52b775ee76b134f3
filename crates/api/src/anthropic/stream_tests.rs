use serde_json::{json, Value};

use super::*;

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": null})
}

fn names(events: &[StreamEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.event).collect()
}

#[test]
fn text_streams_as_one_block_between_start_and_stop() {
    let (mut s, opening) = MessageStream::start("msg_1", "m", 12, 8);
    assert_eq!(names(&opening), ["message_start", "ping"]);
    let opened = &opening[0].data["message"]["usage"];
    assert_eq!((opened["input_tokens"].as_u64(), opened["cache_read_input_tokens"].as_u64()), (Some(4), Some(8)));
    assert!(s.on_chunk(&chunk(json!({"role": "assistant", "content": ""}), None)).is_empty());
    let first = s.on_chunk(&chunk(json!({"content": "Hel"}), None));
    assert_eq!(names(&first), ["content_block_start", "content_block_delta"]);
    assert_eq!(first[1].data["delta"], json!({"type": "text_delta", "text": "Hel"}));
    assert_eq!(names(&s.on_chunk(&chunk(json!({"content": "lo"}), None))), ["content_block_delta"]);
    assert!(s.on_chunk(&chunk(json!({}), Some("stop"))).is_empty());
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
                                                "prompt_tokens_details": {"cached_tokens": 8}}});
    assert!(s.on_chunk(&usage).is_empty());
    let end = s.finish(Some("END"));
    assert_eq!(names(&end), ["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(end[1].data["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "END"}));
    assert_eq!(end[1].data["usage"]["input_tokens"], 4);
    assert_eq!(end[1].data["usage"]["cache_read_input_tokens"], 8);
    assert_eq!(end[1].data["usage"]["output_tokens"], 2);
    assert!(s.finish(None).is_empty(), "a stream ends once");
}

#[test]
fn calls_stream_as_tool_use_blocks_with_input_json_deltas() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    s.on_chunk(&chunk(json!({"content": "Let me check."}), None));
    let head = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]});
    let events = s.on_chunk(&chunk(head, None));
    assert_eq!(names(&events), ["content_block_stop", "content_block_start"]);
    assert_eq!(events[1].data["index"], 1);
    assert_eq!(
        events[1].data["content_block"],
        json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}})
    );
    let args = json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Paris\"}"}}]});
    let events = s.on_chunk(&chunk(args, None));
    assert_eq!(events[0].data["delta"], json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Paris\"}"}));
    let second = json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                                         "function": {"name": "get_time", "arguments": ""}}]});
    assert_eq!(names(&s.on_chunk(&chunk(second, None))), ["content_block_stop", "content_block_start"]);
    s.on_chunk(&chunk(json!({}), Some("tool_calls")));
    let end = s.finish(None);
    assert_eq!(end[0].data["index"], 2);
    assert_eq!(end[1].data["delta"]["stop_reason"], "tool_use");
    assert_eq!(end[1].data["usage"], json!({"output_tokens": 0}), "no usage chunk came");
}

#[test]
fn an_error_ends_the_stream_with_an_error_event() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    let events = s.on_chunk(&json!({"error": {"message": "engine died", "type": "server_error"}}));
    assert_eq!(names(&events), ["error"]);
    assert_eq!(events[0].data["error"], json!({"type": "api_error", "message": "engine died"}));
    assert!(s.on_chunk(&chunk(json!({"content": "x"}), None)).is_empty());
    assert!(s.finish(None).is_empty());
}

#[test]
fn thinking_streams_as_a_signed_thinking_block_before_the_text() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    let first = s.on_chunk(&chunk(json!({"reasoning_content": "Add", "reasoning": "Add"}), None));
    assert_eq!(names(&first), ["content_block_start", "content_block_delta"]);
    assert_eq!(first[0].data["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
    assert_eq!(first[1].data["delta"], json!({"type": "thinking_delta", "thinking": "Add"}));
    assert_eq!(names(&s.on_chunk(&chunk(json!({"reasoning_content": " up."}), None))), ["content_block_delta"]);
    let text = s.on_chunk(&chunk(json!({"content": "4"}), None));
    assert_eq!(
        names(&text),
        ["content_block_delta", "content_block_stop", "content_block_start", "content_block_delta"]
    );
    let signature = crate::anthropic::response::signature("Add up.");
    assert_eq!(
        text[0].data,
        json!({"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "signature_delta", "signature": signature}})
    );
    assert_eq!(text[2].data["index"], 1);
}
