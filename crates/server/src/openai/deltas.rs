//! A request's engine events as the dialect-neutral [`ChatDelta`]s every dialect's stream
//! renders (`gantry_api::ChunkEncoder`, `MessageStream`, `ResponseStream`): tool calls read out
//! of the text as they are written, logprobs in the API's types, the stop string named. Kept
//! free of I/O so every transition is unit-tested; [`deltas`] drives it over the channel.

use futures_util::stream::{self, Stream, StreamExt};
use gantry_api::ChatDelta;
use gantry_engine::tools::{new_call_id, StreamPiece, ToolCallStreamer};
use gantry_engine::{Event, FinishReason, TokenLogprob};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::errors::IntoApiError;
use crate::openai::convert::{to_api_finish_reason, to_api_logprobs, to_api_usage};
use crate::openai::tool_calls::ToolPlan;

/// The engine's next event for a request; a closed channel (the engine thread died) is read as
/// its error, so every stream ends with one.
pub(crate) async fn next_event(events: &mut UnboundedReceiver<Event>) -> Event {
    events.recv().await.unwrap_or_else(|| Event::Error(engine_stopped()))
}

fn engine_stopped() -> gantry_engine::EngineError {
    gantry_engine::EngineError::Crashed("the engine stopped before finishing the request".into())
}

/// The request's deltas as they come, ending with its `Done` or `Error`. The receiver moves
/// into the stream: when the client disconnects, axum drops the stream, the receiver closes
/// and the scheduler cancels the request at its next step.
pub(crate) fn deltas(events: UnboundedReceiver<Event>, reader: ChatDeltas) -> impl Stream<Item = ChatDelta> {
    stream::unfold((events, reader), |(mut events, mut reader)| async move {
        if reader.is_finished() {
            return None;
        }
        let deltas = reader.on_event(next_event(&mut events).await);
        Some((stream::iter(deltas), (events, reader)))
    })
    .flatten()
}

/// Reads one request's events into deltas.
pub(crate) struct ChatDeltas {
    with_logprobs: bool,
    /// The request's stop strings, which the engine names by index.
    stops: Vec<String>,
    /// The stop string that ended a choice, told right before that choice finishes.
    matched_stop: Option<(u32, String)>,
    finished: bool,
    /// With tools, text goes through one streamer per choice so calls leave as call deltas,
    /// never as raw text.
    tools: Option<StreamingTools>,
}

struct StreamingTools {
    streamers: Vec<Option<ToolCallStreamer>>,
    calls: Vec<usize>,
    /// `parallel_tool_calls: false`: calls after the first are dropped.
    single: bool,
    /// The output is a forced call: every turn opens saying no text will come.
    forced: bool,
}

impl ChatDeltas {
    /// The reader of a request's `n` choices, which reads calls out of the text when its
    /// `tools` ask for it (not under `tool_choice: "none"`).
    pub(crate) fn for_request(chat: &gantry_api::ValidatedChat, tools: Option<ToolPlan>, n: u32) -> Self {
        Self::new(chat.logprobs, chat.stop.clone()).with_tools(tools.filter(|t| t.parse), n)
    }

    pub(crate) fn new(with_logprobs: bool, stops: Vec<String>) -> Self {
        Self { with_logprobs, stops, matched_stop: None, finished: false, tools: None }
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

    /// Every choice's turn opening, before the engine's first event.
    pub(crate) fn opening(&self, n: u32) -> Vec<ChatDelta> {
        let forced_call = self.tools.as_ref().is_some_and(|t| t.forced);
        (0..n).map(|choice| ChatDelta::TurnStart { choice, forced_call }).collect()
    }

    fn text(&self, choice: u32, text: String, logprobs: Option<Vec<TokenLogprob>>) -> ChatDelta {
        let logprobs = logprobs.filter(|_| self.with_logprobs).map(|lp| to_api_logprobs(lp).content);
        ChatDelta::Text { choice, text, logprobs }
    }

    /// Deltas for pieces the tool streamer released (content, or calls). The event's logprobs
    /// ride its first content, or else a text delta of their own.
    fn piece_deltas(
        &mut self,
        choice: u32,
        pieces: Vec<StreamPiece>,
        mut logprobs: Option<Vec<TokenLogprob>>,
    ) -> Vec<ChatDelta> {
        let mut deltas = Vec::new();
        for piece in pieces {
            match piece {
                StreamPiece::Content(text) => deltas.push(self.text(choice, text, logprobs.take())),
                StreamPiece::Call { index, name, arguments } => {
                    if let Some(start) = self.call_start(choice, index, name) {
                        deltas.push(start);
                        deltas.push(ChatDelta::ToolCallArguments { choice, index, fragment: arguments });
                    }
                }
                StreamPiece::CallStart { index, name } => deltas.extend(self.call_start(choice, index, name)),
                StreamPiece::CallArguments { index, fragment } => {
                    if !self.tools.as_ref().is_some_and(|t| t.single && index > 0) {
                        deltas.push(ChatDelta::ToolCallArguments { choice, index, fragment });
                    }
                }
            }
        }
        if let Some(lp) = logprobs.filter(|lp| !lp.is_empty()) {
            deltas.push(self.text(choice, String::new(), Some(lp)));
        }
        deltas
    }

    /// The delta that opens call `index`, unless `parallel_tool_calls: false` drops it.
    fn call_start(&mut self, choice: u32, index: usize, name: String) -> Option<ChatDelta> {
        let tools = self.tools.as_mut().expect("pieces come from tools");
        if tools.single && index > 0 {
            return None;
        }
        tools.calls[choice as usize] += 1;
        Some(ChatDelta::ToolCallStart { choice, index, id: new_call_id(), name })
    }

    /// Deltas for one engine event; none once the stream has ended.
    pub(crate) fn on_event(&mut self, event: Event) -> Vec<ChatDelta> {
        if self.finished {
            return Vec::new();
        }
        match event {
            Event::Cached { tokens } => vec![ChatDelta::PromptCached { tokens }],
            Event::Delta { choice, text, logprobs } => {
                let pieces = match self.tools.as_mut().and_then(|t| t.streamers[choice as usize].as_mut()) {
                    Some(streamer) => streamer.push(&text),
                    None => return vec![self.text(choice, text, Some(logprobs))],
                };
                self.piece_deltas(choice, pieces, Some(logprobs))
            }
            Event::Reasoning { choice, text } => vec![ChatDelta::Reasoning { choice, text }],
            Event::StopSequence { choice, index } => {
                self.matched_stop = self.stops.get(index as usize).map(|stop| (choice, stop.clone()));
                Vec::new()
            }
            Event::Finished { choice, reason } => {
                let streamer = self.tools.as_mut().and_then(|t| t.streamers[choice as usize].take());
                let rest = streamer.map(|s| if reason == FinishReason::Length { s.finish_cut() } else { s.finish() });
                let mut deltas = match rest {
                    Some(pieces) => self.piece_deltas(choice, pieces, None),
                    None => Vec::new(),
                };
                let called = self.tools.as_ref().is_some_and(|t| t.calls[choice as usize] > 0);
                let reason = to_api_finish_reason(reason, called);
                let stop_sequence = self.matched_stop.take().filter(|(c, _)| *c == choice).map(|(_, stop)| stop);
                deltas.push(ChatDelta::Finished { choice, reason, stop_sequence });
                deltas
            }
            Event::Done(usage) => {
                self.finished = true;
                vec![ChatDelta::Done { usage: to_api_usage(usage) }]
            }
            Event::Error(error) => {
                self.finished = true;
                vec![ChatDelta::Error(error.into_api_error())]
            }
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::{ChunkEncoder, ChunkFrame};
    use gantry_engine::Usage;
    use serde_json::Value;

    /// The reader and Chat Completions' encoder together: engine events in, chunks out.
    struct Chunks {
        reader: ChatDeltas,
        encoder: ChunkEncoder,
    }

    impl Chunks {
        fn with_tools(self, plan: Option<ToolPlan>, n: u32) -> Self {
            Self { reader: self.reader.with_tools(plan, n), ..self }
        }

        fn opening(&self, n: u32) -> Vec<ChunkFrame> {
            self.reader.opening(n).into_iter().flat_map(|d| self.encoder.encode(d)).collect()
        }

        fn on_event(&mut self, event: Event) -> Vec<ChunkFrame> {
            self.reader.on_event(event).into_iter().flat_map(|d| self.encoder.encode(d)).collect()
        }

        fn is_finished(&self) -> bool {
            self.reader.is_finished()
        }
    }

    fn enc(include_usage: bool) -> Chunks {
        let encoder = ChunkEncoder::new("chatcmpl-1".into(), 7, "m".into(), include_usage);
        Chunks { reader: ChatDeltas::new(false, Vec::new()), encoder }
    }

    fn data(f: &ChunkFrame) -> &Value {
        match f {
            ChunkFrame::Data(v) => v,
            ChunkFrame::Done => panic!("expected data"),
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
        assert_eq!(frames[4], ChunkFrame::Done);
        // All chunks share one id.
        for f in &frames[..4] {
            assert_eq!(data(f)["id"], "chatcmpl-1");
        }
    }

    #[test]
    fn without_include_usage_no_usage_chunk() {
        let mut e = enc(false);
        let frames = e.on_event(Event::Done(Usage::default()));
        assert_eq!(frames, vec![ChunkFrame::Done]);
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

    #[test]
    fn the_stop_string_is_named_with_its_choices_finish_and_the_cache_told_first() {
        let mut reader = ChatDeltas::new(false, vec!["X".into(), "END".into()]);
        assert_eq!(reader.on_event(Event::Cached { tokens: 3 }), [ChatDelta::PromptCached { tokens: 3 }]);
        assert!(reader.on_event(Event::StopSequence { choice: 0, index: 1 }).is_empty());
        let finished = reader.on_event(Event::Finished { choice: 0, reason: FinishReason::Stop });
        let stop_sequence = Some("END".to_string());
        assert_eq!(
            finished,
            [ChatDelta::Finished { choice: 0, reason: gantry_api::FinishReason::Stop, stop_sequence }]
        );
        let cancelled = reader.on_event(Event::Finished { choice: 1, reason: FinishReason::Cancelled });
        let reason = gantry_api::FinishReason::Length;
        assert_eq!(cancelled, [ChatDelta::Finished { choice: 1, reason, stop_sequence: None }]);
    }
}
