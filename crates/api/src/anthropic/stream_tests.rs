//! Anthropic Messages streaming: text, tool use and thinking as content blocks between their
//! start and stop events, and an error as an `error` event.

use serde_json::json;

use super::*;
use crate::ApiError;

fn text(text: &str) -> ChatDelta {
    ChatDelta::Text { choice: 0, text: text.into(), logprobs: None }
}

fn finished(reason: FinishReason, stop_sequence: Option<&str>) -> ChatDelta {
    ChatDelta::Finished { choice: 0, reason, stop_sequence: stop_sequence.map(str::to_owned) }
}

fn done(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> ChatDelta {
    crate::chat_delta::done_for_tests(prompt_tokens, cached_tokens, completion_tokens, 0)
}

fn call_start(index: usize, id: &str, name: &str) -> ChatDelta {
    ChatDelta::ToolCallStart { choice: 0, index, id: id.into(), name: name.into() }
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
    assert!(s.on_delta(ChatDelta::TurnStart { choice: 0, forced_call: false }).is_empty());
    assert!(s.on_delta(text("")).is_empty());
    let first = s.on_delta(text("Hel"));
    assert_eq!(names(&first), ["content_block_start", "content_block_delta"]);
    assert_eq!(first[1].data["delta"], json!({"type": "text_delta", "text": "Hel"}));
    assert_eq!(names(&s.on_delta(text("lo"))), ["content_block_delta"]);
    assert!(s.on_delta(finished(FinishReason::Stop, Some("END"))).is_empty());
    let end = s.on_delta(done(12, 2, 8));
    assert_eq!(names(&end), ["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(end[1].data["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "END"}));
    assert_eq!(end[1].data["usage"]["input_tokens"], 4);
    assert_eq!(end[1].data["usage"]["cache_read_input_tokens"], 8);
    assert_eq!(end[1].data["usage"]["output_tokens"], 2);
    assert!(s.on_delta(done(12, 2, 8)).is_empty(), "a stream ends once");
}

#[test]
fn calls_stream_as_tool_use_blocks_with_input_json_deltas() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    s.on_delta(text("Let me check."));
    let events = s.on_delta(call_start(0, "call_1", "get_weather"));
    assert_eq!(names(&events), ["content_block_stop", "content_block_start"]);
    assert_eq!(events[1].data["index"], 1);
    assert_eq!(
        events[1].data["content_block"],
        json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}})
    );
    let args = ChatDelta::ToolCallArguments { choice: 0, index: 0, fragment: "{\"city\": \"Paris\"}".into() };
    let events = s.on_delta(args);
    assert_eq!(events[0].data["delta"], json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Paris\"}"}));
    assert!(s.on_delta(ChatDelta::ToolCallArguments { choice: 0, index: 0, fragment: String::new() }).is_empty());
    assert_eq!(names(&s.on_delta(call_start(1, "call_2", "get_time"))), ["content_block_stop", "content_block_start"]);
    s.on_delta(finished(FinishReason::ToolCalls, None));
    let end = s.on_delta(done(3, 9, 0));
    assert_eq!(end[0].data["index"], 2);
    assert_eq!(end[1].data["delta"]["stop_reason"], "tool_use");
    assert_eq!(end[1].data["usage"]["output_tokens"], 9);
}

#[test]
fn an_error_ends_the_stream_with_an_error_event() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    let events = s.on_delta(ChatDelta::Error(ApiError::internal("engine died")));
    assert_eq!(names(&events), ["error"]);
    assert_eq!(events[0].data, json!({"type": "error", "error": {"type": "api_error", "message": "engine died"}}));
    assert!(s.on_delta(text("x")).is_empty());
    assert!(s.on_delta(done(3, 0, 0)).is_empty());
}

#[test]
fn thinking_streams_as_a_signed_thinking_block_before_the_text() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    let first = s.on_delta(ChatDelta::Reasoning { choice: 0, text: "Add".into() });
    assert_eq!(names(&first), ["content_block_start", "content_block_delta"]);
    assert_eq!(first[0].data["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
    assert_eq!(first[1].data["delta"], json!({"type": "thinking_delta", "thinking": "Add"}));
    assert_eq!(names(&s.on_delta(ChatDelta::Reasoning { choice: 0, text: " up.".into() })), ["content_block_delta"]);
    let text = s.on_delta(text("4"));
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

#[test]
fn only_the_first_choice_is_told() {
    let (mut s, _) = MessageStream::start("msg_1", "m", 3, 0);
    assert!(s.on_delta(ChatDelta::Text { choice: 1, text: "other".into(), logprobs: None }).is_empty());
    assert!(s
        .on_delta(ChatDelta::Finished { choice: 1, reason: FinishReason::Length, stop_sequence: None })
        .is_empty());
    s.on_delta(finished(FinishReason::Stop, None));
    let end = s.on_delta(done(3, 1, 0));
    assert_eq!(end[0].data["delta"]["stop_reason"], "end_turn");
}
