//! A streamed chat answer as the Responses API's semantic events: `response.created`,
//! `response.in_progress`, then per output item `response.output_item.added` … `.done` (a
//! message's `content_part` and `output_text` deltas, or a function call's
//! `function_call_arguments` deltas), then `response.completed` (or `response.incomplete`) with
//! the whole Response. Fed the answer's [`ChatDelta`]s in order; no I/O.

use serde_json::{json, Map, Value};

use crate::responses::response::{
    function_call_item, message_item, reasoning_item, response_object, status_of, ResponseIds,
};
use crate::{ChatDelta, FinishReason, TokenLogprob, Usage};

/// One server-sent event: its `event:` name (the `type`) and `data:` JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseEvent {
    pub event: String,
    pub data: Value,
}

#[derive(Debug)]
enum Open {
    Reasoning {
        index: usize,
        text: String,
    },
    /// `logprobs`: the text's token logprobs so far, when the request included them.
    Message {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Call {
        index: usize,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The state of one translated stream.
#[derive(Debug)]
pub struct ResponseStream {
    ids: ResponseIds,
    echo: Map<String, Value>,
    sequence: u64,
    items: Vec<Value>,
    open: Option<Open>,
    finish_reason: Option<FinishReason>,
    ended: bool,
}

impl ResponseStream {
    /// The stream and its first events: `response.created` and `response.in_progress`.
    pub fn start(ids: ResponseIds, echo: Map<String, Value>) -> (Self, Vec<ResponseEvent>) {
        let mut s = Self { ids, echo, sequence: 0, items: Vec::new(), open: None, finish_reason: None, ended: false };
        let shell = s.object("in_progress", Value::Null, None);
        let events = vec![
            s.event("response.created", json!({"response": &shell})),
            s.event("response.in_progress", json!({"response": shell})),
        ];
        (s, events)
    }

    /// The events for the answer's next step. A Responses request has one choice: other
    /// choices' steps, and what Responses does not say mid-stream, make none.
    pub fn on_delta(&mut self, delta: ChatDelta) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        match delta {
            ChatDelta::Reasoning { choice: 0, text } if !text.is_empty() => self.reasoning_delta(&text, &mut out),
            ChatDelta::Text { choice: 0, text, logprobs } => {
                self.text_delta(text, logprobs.unwrap_or_default(), &mut out);
            }
            ChatDelta::ToolCallStart { choice: 0, id, name, .. } => {
                self.close(&mut out);
                let index = self.items.len();
                let item = function_call_item(&id, &name, "", "in_progress");
                out.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
                self.open = Some(Open::Call { index, call_id: id, name, arguments: String::new() });
            }
            ChatDelta::ToolCallArguments { choice: 0, fragment, .. } => {
                if let (false, Some(Open::Call { index, call_id, arguments, .. })) =
                    (fragment.is_empty(), &mut self.open)
                {
                    arguments.push_str(&fragment);
                    let item_id = format!("fc_{}", call_id.trim_start_matches("call_"));
                    let data = json!({"item_id": item_id, "output_index": *index, "delta": fragment});
                    out.push(self.event("response.function_call_arguments.delta", data));
                }
            }
            ChatDelta::Finished { choice: 0, reason, .. } => self.finish_reason = Some(reason),
            ChatDelta::Done { usage } => return self.finish(&usage),
            ChatDelta::Error(error) => {
                self.ended = true;
                let mut failed = self.object("failed", Value::Null, None);
                failed["error"] = json!({"code": "server_error", "message": error.wire_message()});
                out.push(self.event("response.failed", json!({"response": failed})));
            }
            _ => {}
        }
        out
    }

    /// Answer text: the message item (opened at the first text), its `output_text` part, and
    /// the delta. A token with no text of its own (the end of the answer) has its logprobs
    /// entry all the same.
    fn text_delta(&mut self, text: String, logprobs: Vec<TokenLogprob>, out: &mut Vec<ResponseEvent>) {
        if text.is_empty() {
            if let Some(Open::Message { logprobs: all, .. }) = &mut self.open {
                all.extend(logprobs);
            }
            return;
        }
        if !matches!(self.open, Some(Open::Message { .. })) {
            let id = self.ids.message_id();
            let item = message_item(&id, "", "in_progress");
            let index = self.open_item_with_part(out, &id, item, output_text_part(""));
            self.open = Some(Open::Message { index, text: String::new(), logprobs: Vec::new() });
        }
        if let Some(Open::Message { index, text: so_far, logprobs: all }) = &mut self.open {
            so_far.push_str(&text);
            all.extend(logprobs.iter().cloned());
            let data = json!({"item_id": self.ids.message_id(), "output_index": *index, "content_index": 0,
                              "delta": text, "logprobs": logprobs});
            out.push(self.event("response.output_text.delta", data));
        }
    }

    /// Thinking text: the reasoning item (opened at the first), its `reasoning_text` part, and
    /// the delta.
    fn reasoning_delta(&mut self, text: &str, out: &mut Vec<ResponseEvent>) {
        let id = self.ids.reasoning_id();
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            let item = reasoning_item(&id, "", "in_progress");
            let index = self.open_item_with_part(out, &id, item, json!({"type": "reasoning_text", "text": ""}));
            self.open = Some(Open::Reasoning { index, text: String::new() });
        }
        if let Some(Open::Reasoning { index, text: so_far }) = &mut self.open {
            so_far.push_str(text);
            let data = json!({"item_id": id, "output_index": *index, "content_index": 0, "delta": text});
            out.push(self.event("response.reasoning_text.delta", data));
        }
    }

    /// The closing events once the answer is complete, `response.completed` (or
    /// `.incomplete`) with the whole Response last.
    fn finish(&mut self, usage: &Usage) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        self.ended = true;
        let (status, details) = status_of(self.finish_reason.unwrap_or(FinishReason::Stop));
        // The message the answer ends in is cut with it, as in the collected Response.
        self.close_as(&mut out, status);
        let whole = self.object(status, details, Some(usage));
        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
        out.push(self.event(kind, json!({"response": whole})));
        out
    }

    /// Ends the open item: its `.done` events, and it joins the output.
    fn close(&mut self, out: &mut Vec<ResponseEvent>) {
        self.close_as(out, "completed");
    }

    /// Ends the open item, a message with `message_status` (`incomplete` when the answer was cut).
    fn close_as(&mut self, out: &mut Vec<ResponseEvent>, message_status: &str) {
        match self.open.take() {
            None => {}
            Some(Open::Reasoning { index, text }) => {
                let id = self.ids.reasoning_id();
                let part = json!({"type": "reasoning_text", "text": text});
                let item = reasoning_item(&id, &text, "completed");
                let done = json!({"text": text});
                self.close_item_with_part(out, &id, index, ("response.reasoning_text.done", done), part, item);
            }
            Some(Open::Message { index, text, logprobs }) => {
                let id = self.ids.message_id();
                let mut item = message_item(&id, &text, message_status);
                item["content"][0]["logprobs"] = json!(logprobs);
                let done = json!({"text": text, "logprobs": logprobs});
                let mut part = output_text_part(&text);
                part["logprobs"] = json!(logprobs);
                self.close_item_with_part(out, &id, index, ("response.output_text.done", done), part, item);
            }
            Some(Open::Call { index, call_id, name, arguments }) => {
                let item = function_call_item(&call_id, &name, &arguments, "completed");
                let data = json!({"item_id": item["id"], "output_index": index, "name": name, "arguments": arguments});
                out.push(self.event("response.function_call_arguments.done", data));
                out.push(self.event("response.output_item.done", json!({"output_index": index, "item": &item})));
                self.items.push(item);
            }
        }
    }

    /// Opens an item of one content part (a message's text, a reasoning item's) at the next
    /// output index, closing the open one: `output_item.added` (the item, its content still
    /// empty) and `content_part.added`. Returns the item's index.
    fn open_item_with_part(&mut self, out: &mut Vec<ResponseEvent>, id: &str, mut item: Value, part: Value) -> usize {
        self.close(out);
        let index = self.items.len();
        item["content"] = json!([]);
        out.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
        let added = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
        out.push(self.event("response.content_part.added", added));
        index
    }

    /// Ends an item of one content part: the part's own `.done` event (`done`: its kind and
    /// fields), `content_part.done` and `output_item.done`; the item joins the output.
    fn close_item_with_part(
        &mut self,
        out: &mut Vec<ResponseEvent>,
        id: &str,
        index: usize,
        (kind, fields): (&str, Value),
        part: Value,
        item: Value,
    ) {
        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
        let mut done = at.clone();
        for (k, v) in fields.as_object().into_iter().flatten() {
            done[k] = v.clone();
        }
        out.push(self.event(kind, done));
        let mut part_done = at;
        part_done["part"] = part;
        out.push(self.event("response.content_part.done", part_done));
        out.push(self.event("response.output_item.done", json!({"output_index": index, "item": &item})));
        self.items.push(item);
    }

    fn object(&self, status: &str, details: Value, usage: Option<&Usage>) -> Value {
        response_object(&self.ids, &self.echo, status, details, self.items.clone(), usage)
    }

    fn event(&mut self, kind: &str, mut data: Value) -> ResponseEvent {
        data["type"] = kind.into();
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        ResponseEvent { event: kind.to_string(), data }
    }
}

/// A message's `output_text` part.
fn output_text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
