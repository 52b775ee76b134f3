//! Chat Completions' rendering of a streamed answer: each [`ChatDelta`] as the
//! `chat.completion.chunk` JSON OpenAI sends (or its error body), then `[DONE]`.

use serde_json::Value;

use crate::{ChatCompletionChunk, ChatDelta, ChoiceLogprobs, ChunkChoice, Delta, ToolCall, Usage};

/// What the SSE writer sends next.
#[derive(Debug, PartialEq)]
pub enum ChunkFrame {
    /// A `data: {json}` event.
    Data(Value),
    /// The terminating `data: [DONE]`.
    Done,
}

/// The chunks of one answer: the identity every chunk repeats, and whether the client asked
/// for the usage chunk (`stream_options.include_usage`).
#[derive(Debug)]
pub struct ChunkEncoder {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    service_tier: crate::ServiceTier,
}

impl ChunkEncoder {
    pub fn new(id: String, created: u64, model: String, include_usage: bool) -> Self {
        Self { id, created, model, include_usage, service_tier: crate::ServiceTier::Default }
    }

    /// Every chunk reports the tier the request ran in, as OpenAI's do.
    pub fn in_tier(self, service_tier: crate::ServiceTier) -> Self {
        Self { service_tier, ..self }
    }

    /// The frames of one step; none for what Chat Completions does not say (the cached part of
    /// the prompt, which the final usage tells; the stop string that ended a choice).
    pub fn encode(&self, delta: ChatDelta) -> Vec<ChunkFrame> {
        let (choice, delta, logprobs, finish_reason) = match delta {
            ChatDelta::PromptCached { .. } => return Vec::new(),
            // The first chunk of every choice: `{role: "assistant", content: ""}`, without
            // `content` for a forced call, which the SDK's accumulated message then reads as
            // `null`, as OpenAI's forced calls do.
            ChatDelta::TurnStart { choice, forced_call } => {
                let content = (!forced_call).then(String::new);
                (choice, Delta { role: Some("assistant"), content, ..Delta::default() }, None, None)
            }
            ChatDelta::Text { choice, text, logprobs } => {
                let logprobs = logprobs.map(|content| ChoiceLogprobs { content });
                (choice, Delta { content: Some(text), ..Delta::default() }, logprobs, None)
            }
            ChatDelta::Reasoning { choice, text } => {
                let delta = Delta { reasoning_content: Some(text.clone()), reasoning: Some(text), ..Delta::default() };
                (choice, delta, None, None)
            }
            // As OpenAI streams a call: the first delta names it (id, type, name, empty
            // arguments), the next ones carry the arguments.
            ChatDelta::ToolCallStart { choice, index, id, name } => {
                let call = ToolCall { id, name, arguments: String::new() };
                let mut head = serde_json::to_value(call).expect("a call serialises");
                head["index"] = index.into();
                (choice, Delta { tool_calls: Some(vec![head]), ..Delta::default() }, None, None)
            }
            ChatDelta::ToolCallArguments { choice, index, fragment } => {
                let call = serde_json::json!({"index": index, "function": {"arguments": fragment}});
                (choice, Delta { tool_calls: Some(vec![call]), ..Delta::default() }, None, None)
            }
            ChatDelta::Finished { choice, reason, .. } => (choice, Delta::default(), None, Some(reason)),
            ChatDelta::Done { usage } => {
                let mut frames = Vec::new();
                if self.include_usage {
                    frames.push(self.frame(Vec::new(), Some(usage)));
                }
                frames.push(ChunkFrame::Done);
                return frames;
            }
            ChatDelta::Error(error) => return vec![ChunkFrame::Data(error.to_json())],
        };
        vec![self.frame(vec![ChunkChoice { index: choice, delta, logprobs, finish_reason }], None)]
    }

    fn frame(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> ChunkFrame {
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            service_tier: Some(self.service_tier.as_str()),
            choices,
            usage,
        };
        let mut value = serde_json::to_value(&chunk).expect("chunk serialises");
        // OpenAI sends `"usage": null` on every chunk but the last when usage was asked for.
        if self.include_usage && value.get("usage").is_none() {
            value["usage"] = Value::Null;
        }
        ChunkFrame::Data(value)
    }
}
