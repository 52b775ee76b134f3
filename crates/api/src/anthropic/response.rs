//! A collected chat answer as a Messages `message`.

use serde_json::{json, Value};

use crate::{ChatCompletionResponse, FinishReason, ToolCall, Usage};

/// Anthropic's `stop_reason` for why the answer ended; `stop_sequence` is the stop sequence
/// that ended the text, if one did.
pub fn stop_reason(finish_reason: FinishReason, stop_sequence: Option<&str>) -> &'static str {
    match finish_reason {
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::Stop if stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop => "end_turn",
    }
}

/// Messages usage: `input_tokens` are the prompt tokens not read from the cache, which
/// `cache_read_input_tokens` counts (Anthropic's split; the three add up to the prompt).
pub fn usage_json(usage: &Usage) -> Value {
    let cached = usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    json!({
        "input_tokens": usage.prompt_tokens.saturating_sub(cached),
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    })
}

/// The `message` for the first choice of `chat` (a Messages request has one).
pub fn message_from_chat(id: &str, chat: &ChatCompletionResponse, stop_sequence: Option<&str>) -> Value {
    let mut content = Vec::new();
    let (finish_reason, message) = match chat.choices.first() {
        Some(c) => (c.finish_reason, Some(&c.message)),
        None => (FinishReason::Stop, None),
    };
    if let Some(thinking) = message.and_then(|m| m.reasoning.as_deref()) {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": signature(thinking)}));
    }
    if let Some(text) = message.and_then(|m| m.content.as_deref()).filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in message.and_then(|m| m.tool_calls.as_deref()).unwrap_or_default() {
        content.push(tool_use_block(call));
    }
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": chat.model,
        "content": content,
        "stop_reason": stop_reason(finish_reason, stop_sequence),
        "stop_sequence": stop_sequence,
        "usage": usage_json(&chat.usage),
    })
}

/// A thinking block's `signature`: Anthropic's is an opaque check that the thinking came from
/// the model unchanged. Gantry shows the same thinking to no one who could tamper with it for
/// its own gain (thinking sent back is only prompt text), so this is an opaque digest of the
/// text (FNV-1a, hex), which clients store and send back as they do Anthropic's.
pub(crate) fn signature(thinking: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in thinking.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("gantry-{h:016x}")
}

/// A call's id as Anthropic spells its own (`toolu_…`): the chat path's `call_…`, renamed. The
/// client sends it back in its `tool_use` and `tool_result` blocks alike, so they still match.
pub(crate) fn tool_use_id(chat_id: &str) -> String {
    chat_id.strip_prefix("call_").map_or_else(|| chat_id.to_owned(), |rest| format!("toolu_{rest}"))
}

/// A tool call as a `tool_use` block. Its input is the arguments' object; a call cut short by
/// `max_tokens` has unparsable arguments, and is given an empty input (its `stop_reason` says
/// `max_tokens`).
fn tool_use_block(call: &ToolCall) -> Value {
    let input =
        serde_json::from_str::<Value>(&call.arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": tool_use_id(&call.id), "name": call.name, "input": input})
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::response::one_choice_for_tests as chat;

    #[test]
    fn text_answers_carry_the_stop_reason_and_anthropics_usage_split() {
        let m = message_from_chat("msg_1", &chat(Some("Hi"), None, FinishReason::Stop), None);
        assert_eq!(m["content"], json!([{"type": "text", "text": "Hi"}]));
        assert_eq!(m["stop_reason"], "end_turn");
        assert_eq!(m["stop_sequence"], Value::Null);
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 4, "output_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 6})
        );
        let m = message_from_chat("msg_1", &chat(Some("Hi"), None, FinishReason::Stop), Some("END"));
        assert_eq!((m["stop_reason"].as_str(), m["stop_sequence"].as_str()), (Some("stop_sequence"), Some("END")));
        assert_eq!(
            message_from_chat("x", &chat(Some("Hi"), None, FinishReason::Length), None)["stop_reason"],
            "max_tokens"
        );
    }

    #[test]
    fn thinking_comes_first_as_a_thinking_block() {
        let mut c = chat(Some("4"), None, FinishReason::Stop);
        c.choices[0].message.reasoning = Some("2 + 2.".into());
        let m = message_from_chat("msg_1", &c, None);
        assert_eq!(
            m["content"],
            json!([{"type": "thinking", "thinking": "2 + 2.", "signature": signature("2 + 2.")},
                   {"type": "text", "text": "4"}])
        );
        assert_ne!(signature("a"), signature("b"));
    }

    #[test]
    fn calls_become_tool_use_blocks_with_their_arguments_as_input() {
        let call = ToolCall { id: "call_1".into(), name: "f".into(), arguments: "{\"a\": 1}".into() };
        let m = message_from_chat("msg_1", &chat(Some(""), Some(vec![call]), FinishReason::ToolCalls), None);
        assert_eq!(m["content"], json!([{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]));
        assert_eq!(m["stop_reason"], "tool_use");
        let cut = ToolCall { id: "call_2".into(), name: "f".into(), arguments: "{\"a\": ".into() };
        let m = message_from_chat("msg_1", &chat(None, Some(vec![cut]), FinishReason::Length), None);
        assert_eq!(m["content"][0]["input"], json!({}));
        assert_eq!(m["stop_reason"], "max_tokens");
    }
}
