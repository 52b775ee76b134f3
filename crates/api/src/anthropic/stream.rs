//! A streamed chat answer as Messages events: `message_start`, then per content block
//! `content_block_start` / `_delta` / `_stop` (text, or a `tool_use` whose input arrives as
//! `input_json_delta`s), then `message_delta` with the stop reason and usage, and
//! `message_stop`. Fed the chat stream's chunks in order; no I/O.

use serde_json::{json, Value};

use crate::anthropic::response::stop_reason;
use crate::Usage;

/// One server-sent event: its `event:` name and `data:` JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    pub event: &'static str,
    pub data: Value,
}

fn event(event: &'static str, data: Value) -> StreamEvent {
    StreamEvent { event, data }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// The state of one translated stream.
#[derive(Debug)]
pub struct MessageStream {
    open: Option<(usize, Block)>,
    /// The open thinking block's text so far, for its signature.
    thought: String,
    next_index: usize,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    ended: bool,
}

impl MessageStream {
    /// The stream and its first events: `message_start` (the prompt's tokens split as
    /// Anthropic does: `cached_tokens` read from the cache, the rest as input tokens; the
    /// `message_delta` at the end says the same) and a `ping`.
    pub fn start(id: &str, model: &str, prompt_tokens: u32, cached_tokens: u32) -> (Self, Vec<StreamEvent>) {
        let cached = cached_tokens.min(prompt_tokens);
        let message = json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens - cached, "output_tokens": 0,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached},
        });
        let stream =
            Self { open: None, thought: String::new(), next_index: 0, finish_reason: None, usage: None, ended: false };
        (stream, vec![event("message_start", json!({"type": "message_start", "message": message})), ping()])
    }

    /// The events for one chat chunk (or error body) of the chat stream.
    pub fn on_chunk(&mut self, chunk: &Value) -> Vec<StreamEvent> {
        if self.ended {
            return Vec::new();
        }
        let mut out = Vec::new();
        if let Some(error) = chunk.get("error") {
            self.ended = true;
            let message = error.get("message").and_then(Value::as_str).unwrap_or("the request failed");
            let kind = if error.get("type").and_then(Value::as_str) == Some("server_error") {
                "api_error"
            } else {
                "invalid_request_error"
            };
            out.push(event("error", json!({"type": "error", "error": {"type": kind, "message": message}})));
            return out;
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(Usage::from_json(usage));
        }
        // A Messages request has one choice.
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.iter().find(|c| c["index"] == 0)) else {
            return out;
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["reasoning_content"].as_str().filter(|t| !t.is_empty()) {
            let head = json!({"type": "thinking", "thinking": "", "signature": ""});
            self.open_block(Block::Thinking, head, &mut out);
            self.thought.push_str(text);
            let index = self.next_index - 1;
            out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": text}}),
            ));
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.open_block(Block::Text, json!({"type": "text", "text": ""}), &mut out);
            let index = self.next_index - 1;
            out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
            ));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            if let Some(id) = call.get("id") {
                let head = json!({"type": "tool_use", "id": super::response::tool_use_id(id), "name": call["function"]["name"], "input": {}});
                self.open_block(Block::ToolUse, head, &mut out);
            }
            let fragment = call["function"]["arguments"].as_str().unwrap_or("");
            if let (false, Some((index, Block::ToolUse))) = (fragment.is_empty(), self.open) {
                out.push(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                ));
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_string());
        }
        out
    }

    /// The closing events once the chat stream ended (its `[DONE]`): the last block's stop,
    /// `message_delta` with the stop reason and the usage, and `message_stop`.
    pub fn finish(&mut self, stop_sequence: Option<&str>) -> Vec<StreamEvent> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        let mut out = Vec::new();
        self.close(&mut out);
        let reason = stop_reason(self.finish_reason.as_deref().unwrap_or("stop"), stop_sequence);
        let usage = self.usage.map_or_else(|| json!({"output_tokens": 0}), |u| crate::anthropic::usage_json(&u));
        out.push(event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_sequence}, "usage": usage}),
        ));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }

    /// Opens a block of `kind`, closing the open one, except that text (or thinking) continues
    /// an open block of its kind. Every call opens a new `tool_use` block.
    fn open_block(&mut self, kind: Block, content_block: Value, out: &mut Vec<StreamEvent>) {
        if matches!(self.open, Some((_, open)) if open == kind && kind != Block::ToolUse) {
            return;
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, kind));
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": content_block}),
        ));
    }

    /// Closes the open block; a thinking block gets its signature first, as Anthropic's does.
    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        if let Some((index, Block::Thinking)) = self.open {
            let signature = crate::anthropic::response::signature(&std::mem::take(&mut self.thought));
            out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": signature}}),
            ));
        }
        if let Some((index, _)) = self.open.take() {
            out.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        }
    }
}

fn ping() -> StreamEvent {
    event("ping", json!({"type": "ping"}))
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
