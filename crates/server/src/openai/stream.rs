//! Streaming as a small state machine: engine events in, OpenAI SSE `data:` payloads out.
//! Kept free of I/O so every transition is unit-tested.

use gantry_api::{ChatCompletionChunk, ChunkChoice, Delta};
use gantry_engine::tools::{ParsedCall, StreamPiece, ToolCallStreamer};
use gantry_engine::{Event, FinishReason, TokenLogprob, Usage};
use serde_json::Value;

use crate::openai::convert::{to_api_logprobs, to_api_usage};
use crate::openai::tool_calls::{call_json, ToolPlan};

/// The engine's next event for a request; a closed channel (the engine thread died) is read as
/// its error, so every stream ends with one.
pub(crate) async fn next_event(events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> Event {
    events.recv().await.unwrap_or_else(|| Event::Error(engine_stopped()))
}

fn engine_stopped() -> gantry_engine::EngineError {
    gantry_engine::EngineError::Crashed("the engine stopped before finishing the request".into())
}

/// What the SSE writer sends next.
#[derive(Debug, PartialEq)]
pub(crate) enum SseFrame {
    /// A `data: {json}` event.
    Data(Value),
    /// The terminating `data: [DONE]`.
    Done,
}

pub(crate) struct ChunkEncoder {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    with_logprobs: bool,
    finished: bool,
    /// With tools, text goes through one streamer per choice so calls leave as `tool_calls`
    /// deltas, never as raw text.
    tools: Option<StreamingTools>,
}

struct StreamingTools {
    streamers: Vec<Option<ToolCallStreamer>>,
    calls: Vec<usize>,
    single: bool,
    /// The output is a forced call: no text comes, so the turn opens without `content`, which
    /// the SDK's accumulated message then reads as `null`, as OpenAI's forced calls do.
    forced: bool,
}

impl ChunkEncoder {
    pub(crate) fn new(id: String, created: u64, model: String, include_usage: bool, with_logprobs: bool) -> Self {
        Self { id, created, model, include_usage, with_logprobs, finished: false, tools: None }
    }

    pub(crate) fn with_tools(mut self, plan: Option<ToolPlan>, n: u32) -> Self {
        self.tools = plan.map(|plan| StreamingTools {
            streamers: (0..n).map(|_| Some(plan.streamer())).collect(),
            calls: vec![0; n as usize],
            single: plan.single,
            forced: plan.forced.is_some(),
        });
        self
    }

    fn content_frame(&self, choice: u32, text: String, logprobs: Option<Vec<TokenLogprob>>) -> SseFrame {
        let delta = Delta { role: None, content: Some(text), ..Delta::default() };
        let logprobs = logprobs.filter(|_| self.with_logprobs).map(to_api_logprobs);
        self.frame(vec![ChunkChoice { index: choice, delta, logprobs, finish_reason: None }], None)
    }

    /// Frames for pieces the tool streamer released (content, or whole calls).
    fn piece_frames(
        &mut self,
        choice: u32,
        pieces: Vec<StreamPiece>,
        mut logprobs: Option<Vec<TokenLogprob>>,
    ) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        for piece in pieces {
            match piece {
                StreamPiece::Content(text) => frames.push(self.content_frame(choice, text, logprobs.take())),
                // As OpenAI streams a call: the first delta names it (id, type, name, empty
                // arguments), the next ones carry the arguments. `index` is the streamer's count.
                StreamPiece::Call { index, name, arguments } => {
                    if let Some(head) = self.call_head(choice, index, name) {
                        frames.push(head);
                        frames.push(self.call_arguments(choice, index, arguments));
                    }
                }
                StreamPiece::CallStart { index, name } => frames.extend(self.call_head(choice, index, name)),
                StreamPiece::CallArguments { index, fragment } => {
                    if !self.tools.as_ref().is_some_and(|t| t.single && index > 0) {
                        frames.push(self.call_arguments(choice, index, fragment));
                    }
                }
            }
        }
        if let Some(lp) = logprobs.filter(|lp| !lp.is_empty()) {
            frames.push(self.content_frame(choice, String::new(), Some(lp)));
        }
        frames
    }

    /// The delta that opens call `index`, unless `parallel_tool_calls: false` drops it.
    fn call_head(&mut self, choice: u32, index: usize, name: String) -> Option<SseFrame> {
        let tools = self.tools.as_mut().expect("pieces come from tools");
        if tools.single && index > 0 {
            return None;
        }
        tools.calls[choice as usize] += 1;
        let head = call_json(&ParsedCall { name, arguments: String::new() }, Some(index));
        let delta = Delta { role: None, content: None, tool_calls: Some(vec![head]), ..Delta::default() };
        Some(self.frame(vec![ChunkChoice { index: choice, delta, logprobs: None, finish_reason: None }], None))
    }

    fn call_arguments(&self, choice: u32, index: usize, arguments: String) -> SseFrame {
        let call = serde_json::json!({"index": index, "function": {"arguments": arguments}});
        let delta = Delta { role: None, content: None, tool_calls: Some(vec![call]), ..Delta::default() };
        self.frame(vec![ChunkChoice { index: choice, delta, logprobs: None, finish_reason: None }], None)
    }

    /// The first chunk of every choice: `delta: {role: "assistant", content: ""}` (without
    /// `content` for a forced call).
    pub(crate) fn opening(&self, n: u32) -> Vec<SseFrame> {
        let content = match &self.tools {
            Some(tools) if tools.forced => None,
            _ => Some(String::new()),
        };
        (0..n)
            .map(|index| {
                let delta = Delta { role: Some("assistant"), content: content.clone(), ..Delta::default() };
                self.frame(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }], None)
            })
            .collect()
    }

    /// Frames for one engine event; empty once the stream has ended.
    pub(crate) fn on_event(&mut self, event: Event) -> Vec<SseFrame> {
        if self.finished {
            return Vec::new();
        }
        match event {
            Event::Delta { choice, text, logprobs } => {
                let pieces = match self.tools.as_mut().and_then(|t| t.streamers[choice as usize].as_mut()) {
                    Some(streamer) => streamer.push(&text),
                    None => return vec![self.content_frame(choice, text, Some(logprobs))],
                };
                self.piece_frames(choice, pieces, Some(logprobs))
            }
            Event::Reasoning { choice, text } => {
                let delta = Delta { reasoning_content: Some(text.clone()), reasoning: Some(text), ..Delta::default() };
                vec![self.frame(vec![ChunkChoice { index: choice, delta, logprobs: None, finish_reason: None }], None)]
            }
            // Chat Completions does not say which stop string ended a choice, and tells the cached
            // part of the prompt in the final usage only.
            Event::StopSequence { .. } | Event::Cached { .. } => Vec::new(),
            Event::Finished { choice, reason } => {
                let streamer = self.tools.as_mut().and_then(|t| t.streamers[choice as usize].take());
                let rest = streamer.map(|s| if reason == FinishReason::Length { s.finish_cut() } else { s.finish() });
                let mut frames = match rest {
                    Some(pieces) => self.piece_frames(choice, pieces, None),
                    None => Vec::new(),
                };
                let called = self.tools.as_ref().is_some_and(|t| t.calls[choice as usize] > 0);
                let reason = if called && reason == FinishReason::Stop { "tool_calls" } else { reason.as_openai() };
                let delta = Delta { role: None, content: None, ..Delta::default() };
                let finish_reason = Some(reason.to_string());
                frames
                    .push(self.frame(vec![ChunkChoice { index: choice, delta, logprobs: None, finish_reason }], None));
                frames
            }
            Event::Done(usage) => {
                self.finished = true;
                let mut frames = Vec::new();
                if self.include_usage {
                    frames.push(self.frame(Vec::new(), Some(usage)));
                }
                frames.push(SseFrame::Done);
                frames
            }
            Event::Error(error) => {
                self.finished = true;
                vec![SseFrame::Data(crate::errors::IntoApiError::into_api_error(error).to_json())]
            }
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    fn frame(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> SseFrame {
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage: usage.map(to_api_usage),
        };
        let mut value = serde_json::to_value(&chunk).expect("chunk serialises");
        // OpenAI sends `"usage": null` on every chunk but the last when usage was asked for.
        if self.include_usage && value.get("usage").is_none() {
            value["usage"] = Value::Null;
        }
        SseFrame::Data(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_engine::FinishReason;

    fn enc(include_usage: bool) -> ChunkEncoder {
        ChunkEncoder::new("chatcmpl-1".into(), 7, "m".into(), include_usage, false)
    }

    fn data(f: &SseFrame) -> &Value {
        match f {
            SseFrame::Data(v) => v,
            SseFrame::Done => panic!("expected data"),
        }
    }

    #[test]
    fn opening_chunk_has_role_and_empty_content() {
        let frames = enc(false).opening(2);
        assert_eq!(frames.len(), 2);
        let v = data(&frames[1]);
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["choices"][0]["index"], 1);
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v["choices"][0]["delta"]["content"], "");
        assert!(v["choices"][0]["finish_reason"].is_null());
    }

    #[test]
    fn full_stream_with_usage() {
        let mut e = enc(true);
        let mut frames = e.opening(1);
        frames.extend(e.on_event(Event::Delta { choice: 0, text: "Hi".into(), logprobs: vec![] }));
        frames.extend(e.on_event(Event::Finished { choice: 0, reason: FinishReason::Length }));
        frames.extend(e.on_event(Event::Done(Usage { prompt_tokens: 5, completion_tokens: 1, ..Usage::default() })));
        assert_eq!(frames.len(), 5);
        assert_eq!(data(&frames[1])["choices"][0]["delta"]["content"], "Hi");
        assert!(data(&frames[1])["usage"].is_null() && data(&frames[1]).get("usage").is_some());
        assert_eq!(data(&frames[2])["choices"][0]["finish_reason"], "length");
        let last = data(&frames[3]);
        assert_eq!(last["choices"].as_array().unwrap().len(), 0);
        assert_eq!(last["usage"]["prompt_tokens"], 5);
        assert_eq!(last["usage"]["completion_tokens"], 1);
        assert_eq!(last["usage"]["total_tokens"], 6);
        assert_eq!(frames[4], SseFrame::Done);
        // All chunks share one id.
        for f in &frames[..4] {
            assert_eq!(data(f)["id"], "chatcmpl-1");
        }
    }

    #[test]
    fn without_include_usage_no_usage_chunk() {
        let mut e = enc(false);
        let frames = e.on_event(Event::Done(Usage::default()));
        assert_eq!(frames, vec![SseFrame::Done]);
    }

    #[test]
    fn error_ends_the_stream_in_openai_shape() {
        let mut e = enc(false);
        let frames = e.on_event(Event::Error(gantry_engine::EngineError::Decode("boom".into())));
        assert_eq!(frames.len(), 1);
        assert_eq!(data(&frames[0])["error"]["message"], "The model failed to decode: boom");
        assert_eq!(data(&frames[0])["error"]["type"], "server_error");
        assert!(e.is_finished());
        assert!(e.on_event(Event::Done(Usage::default())).is_empty());
    }

    #[test]
    fn tool_calls_leave_as_deltas_never_as_text() {
        let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]});
        let chat = gantry_api::parse_chat_request(body.to_string().as_bytes()).unwrap();
        let plan = ToolPlan::from_request(&chat).unwrap();
        let mut e = enc(false).with_tools(plan, 1);
        let mut frames = Vec::new();
        for piece in
            ["<tool_", "call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"]
        {
            frames.extend(e.on_event(Event::Delta { choice: 0, text: piece.into(), logprobs: vec![] }));
        }
        frames.extend(e.on_event(Event::Finished { choice: 0, reason: FinishReason::Stop }));
        let values: Vec<&Value> = frames.iter().map(data).collect();
        assert!(
            values.iter().all(|v| v["choices"][0]["delta"]["content"].as_str().unwrap_or("").is_empty()),
            "{values:?}"
        );
        let call = &values[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], "");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let args = &values[1]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(args["index"], 0);
        assert!(args.get("id").is_none() && args["function"].get("name").is_none());
        assert_eq!(args["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(values.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }
}
