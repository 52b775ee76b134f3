//! The Response object: built from a collected chat answer, or from a stream's items.

use serde_json::{json, Map, Value};

use crate::{ChatCompletionResponse, FinishReason, Usage};

/// What names a Response: its id (`resp_…`), creation time and model.
#[derive(Debug, Clone)]
pub struct ResponseIds {
    pub id: String,
    pub created_at: u64,
    pub model: String,
}

impl ResponseIds {
    /// The id of the output message item (one per response).
    pub(crate) fn message_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    /// The id of the reasoning item (one per response, before its message).
    pub(crate) fn reasoning_id(&self) -> String {
        format!("rs_{}", self.id.trim_start_matches("resp_"))
    }
}

/// `status` and `incomplete_details` for why the answer ended.
pub(crate) fn status_of(finish_reason: FinishReason) -> (&'static str, Value) {
    if finish_reason == FinishReason::Length {
        ("incomplete", json!({"reason": "max_output_tokens"}))
    } else {
        ("completed", Value::Null)
    }
}

/// The Response's `usage`. Nothing is billed as a cache write (the Messages dialect says
/// `cache_creation_input_tokens: 0` alike): the SDK requires the field.
pub(crate) fn usage_json(u: &Usage) -> Value {
    let cached = u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.completion_tokens_details.map_or(0, |d| d.reasoning_tokens)},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

/// A reasoning item: the model's thinking, as reasoning text (no summary is made).
pub(crate) fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "reasoning", "id": id, "status": status, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

/// A function call item; its item id is the call id with `fc_` for `call_`.
pub(crate) fn function_call_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    let id = format!("fc_{}", call_id.trim_start_matches("call_"));
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

/// The whole object, `echo` holding the request's repeated fields.
pub(crate) fn response_object(
    ids: &ResponseIds,
    echo: &Map<String, Value>,
    status: &str,
    incomplete_details: Value,
    output: Vec<Value>,
    usage: Option<&Usage>,
) -> Value {
    let mut r = Map::new();
    r.insert("id".into(), ids.id.clone().into());
    r.insert("object".into(), "response".into());
    r.insert("created_at".into(), ids.created_at.into());
    r.insert("status".into(), status.into());
    r.insert("error".into(), Value::Null);
    r.insert("incomplete_details".into(), incomplete_details);
    r.insert("model".into(), ids.model.clone().into());
    r.insert("output".into(), output.into());
    r.insert("usage".into(), usage.map_or(Value::Null, usage_json));
    for (k, v) in echo {
        r.insert(k.clone(), v.clone());
    }
    Value::Object(r)
}

/// The Response for a collected chat answer (its first choice: a Responses request has one).
pub fn response_from_chat(ids: &ResponseIds, echo: &Map<String, Value>, chat: &ChatCompletionResponse) -> Value {
    let choice = chat.choices.first();
    let finish = choice.map_or(FinishReason::Stop, |c| c.finish_reason);
    let (status, details) = status_of(finish);
    let mut output = Vec::new();
    if let Some(thinking) = choice.and_then(|c| c.message.reasoning.as_deref()) {
        output.push(reasoning_item(&ids.reasoning_id(), thinking, "completed"));
    }
    if let Some(text) = choice.and_then(|c| c.message.content.as_deref()).filter(|t| !t.is_empty()) {
        let mut item = message_item(&ids.message_id(), text, status);
        if let Some(lp) = choice.and_then(|c| c.logprobs.as_ref()) {
            item["content"][0]["logprobs"] = serde_json::to_value(&lp.content).unwrap_or_default();
        }
        output.push(item);
    }
    for call in choice.and_then(|c| c.message.tool_calls.as_deref()).unwrap_or_default() {
        output.push(function_call_item(&call.id, &call.name, &call.arguments, "completed"));
    }
    response_object(ids, echo, status, details, output, Some(&chat.usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::response::one_choice_for_tests as chat;

    fn ids() -> ResponseIds {
        ResponseIds { id: "resp_abc".into(), created_at: 7, model: "m".into() }
    }

    #[test]
    fn a_text_answer_is_one_message_item_with_usage() {
        let echo = Map::from_iter([("tools".to_string(), json!([]))]);
        let r = response_from_chat(&ids(), &echo, &chat(Some("Hi"), None, FinishReason::Stop));
        assert_eq!((r["object"].as_str(), r["status"].as_str()), (Some("response"), Some("completed")));
        assert_eq!(r["output"][0]["id"], "msg_abc");
        assert_eq!(r["output"][0]["content"][0]["text"], "Hi");
        assert_eq!(r["usage"]["input_tokens_details"], json!({"cached_tokens": 6, "cache_write_tokens": 0}));
        assert_eq!(r["usage"]["total_tokens"], 14);
        assert_eq!(r["tools"], json!([]));
        let cut = response_from_chat(&ids(), &echo, &chat(Some("Hi"), None, FinishReason::Length));
        assert_eq!(cut["status"], "incomplete");
        assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");
    }

    #[test]
    fn thinking_is_a_reasoning_item_before_the_message() {
        let mut c = chat(Some("4"), None, FinishReason::Stop);
        c.choices[0].message.reasoning = Some("Add.".into());
        c.usage.completion_tokens_details = Some(crate::CompletionTokensDetails { reasoning_tokens: 3 });
        let r = response_from_chat(&ids(), &Map::new(), &c);
        assert_eq!(
            r["output"][0],
            json!({"type": "reasoning", "id": "rs_abc", "status": "completed", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "Add."}]})
        );
        assert_eq!(r["output"][1]["type"], "message");
        assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
    }

    #[test]
    fn calls_are_function_call_items() {
        let call = crate::ToolCall { id: "call_9".into(), name: "f".into(), arguments: "{\"a\":1}".into() };
        let r = response_from_chat(&ids(), &Map::new(), &chat(None, Some(vec![call]), FinishReason::ToolCalls));
        assert_eq!(
            r["output"],
            json!([{"type": "function_call", "id": "fc_9", "call_id": "call_9", "name": "f", "arguments": "{\"a\":1}", "status": "completed"}])
        );
    }
}
