//! A streamed chat answer as Messages events: `message_start`, then per content block
//! `content_block_start` / `_delta` / `_stop` (text, or a `tool_use` whose input arrives as
//! `input_json_delta`s), then `message_delta` with the stop reason and usage, and
//! `message_stop`. Fed the answer's [`ChatDelta`]s in order; no I/O.

use serde_json::{json, Value};

use crate::anthropic::response::{stop_reason, tool_use_id};
use crate::{ChatDelta, FinishReason, Usage};

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
    finish_reason: Option<FinishReason>,
    /// The stop string that ended the answer, if one did.
    stop_sequence: Option<String>,
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
        let stream = Self {
            open: None,
            thought: String::new(),
            next_index: 0,
            finish_reason: None,
            stop_sequence: None,
            ended: false,
        };
        (stream, vec![event("message_start", json!({"type": "message_start", "message": message})), ping()])
    }

    /// The events for the answer's next step. A Messages request has one choice: other
    /// choices' steps, and what Messages does not say mid-stream, make none.
    pub fn on_delta(&mut self, delta: ChatDelta) -> Vec<StreamEvent> {
        if self.ended {
            return Vec::new();
        }
        let mut out = Vec::new();
        match delta {
            ChatDelta::Reasoning { choice: 0, text } if !text.is_empty() => {
                let head = json!({"type": "thinking", "thinking": "", "signature": ""});
                self.open_block(Block::Thinking, head, &mut out);
                self.thought.push_str(&text);
                let delta = json!({"type": "thinking_delta", "thinking": text});
                out.push(self.block_delta(delta));
            }
            ChatDelta::Text { choice: 0, text, .. } if !text.is_empty() => {
                self.open_block(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                out.push(self.block_delta(json!({"type": "text_delta", "text": text})));
            }
            ChatDelta::ToolCallStart { choice: 0, id, name, .. } => {
                let head = json!({"type": "tool_use", "id": tool_use_id(&id), "name": name, "input": {}});
                self.open_block(Block::ToolUse, head, &mut out);
            }
            ChatDelta::ToolCallArguments { choice: 0, fragment, .. } => {
                if let (false, Some((_, Block::ToolUse))) = (fragment.is_empty(), self.open) {
                    out.push(self.block_delta(json!({"type": "input_json_delta", "partial_json": fragment})));
                }
            }
            ChatDelta::Finished { choice: 0, reason, stop_sequence } => {
                self.finish_reason = Some(reason);
                self.stop_sequence = stop_sequence;
            }
            ChatDelta::Done { usage } => return self.finish(&usage),
            ChatDelta::Error(error) => {
                self.ended = true;
                out.push(event("error", crate::anthropic::error_body(&error)));
            }
            _ => {}
        }
        out
    }

    /// A `content_block_delta` of the open block.
    fn block_delta(&self, delta: Value) -> StreamEvent {
        let index = self.next_index - 1;
        event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}))
    }

    /// The closing events once the answer is complete: the last block's stop, `message_delta`
    /// with the stop reason and the usage, and `message_stop`.
    fn finish(&mut self, usage: &Usage) -> Vec<StreamEvent> {
        self.ended = true;
        let mut out = Vec::new();
        self.close(&mut out);
        let stop_sequence = self.stop_sequence.as_deref();
        let reason = stop_reason(self.finish_reason.unwrap_or(FinishReason::Stop), stop_sequence);
        let usage = crate::anthropic::usage_json(usage);
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
