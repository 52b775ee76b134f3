//! A streamed chat answer as one dialect-neutral sequence of typed steps: the server makes it
//! once from the engine's events (tool calls already read out of the text, logprobs converted,
//! the stop string named), and each dialect renders it: OpenAI's chunks (`chunks.rs`),
//! Messages events (`anthropic::MessageStream`), Responses events (`responses::ResponseStream`).
//! Nothing is read back out of another dialect's JSON.

use serde::Serialize;

use crate::{ApiError, TokenLogprob, Usage};

/// Why a choice ended, as every dialect maps it (Chat Completions' `finish_reason` spells it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn, or a stop string ended it.
    Stop,
    /// `max_tokens` or the context's end cut it (a cancelled choice is reported so too).
    Length,
    /// It ended after calling tools.
    ToolCalls,
}

impl FinishReason {
    /// Chat Completions' `finish_reason`.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// One step of a streamed chat answer. `choice` is the choice's index (`n` > 1 in Chat
/// Completions; the other dialects answer choice 0 only).
#[derive(Debug, Clone, PartialEq)]
pub enum ChatDelta {
    /// How many of the prompt's first tokens were read from the prefix cache; before any output.
    PromptCached { tokens: u32 },
    /// A choice's assistant turn opens. `forced_call`: the output is a forced tool call, so no
    /// text will come.
    TurnStart { choice: u32, forced_call: bool },
    /// Answer text, with its tokens' logprobs when the request asked for them. The text may be
    /// empty: a token with no text of its own (the end of the answer) still has its logprobs.
    Text { choice: u32, text: String, logprobs: Option<Vec<TokenLogprob>> },
    /// Thinking text (a reasoning model's, before its answer).
    Reasoning { choice: u32, text: String },
    /// A tool call opens; `index` counts the choice's calls from 0. Its arguments follow.
    ToolCallStart { choice: u32, index: usize, id: String, name: String },
    /// The next part of call `index`'s arguments (JSON text; the parts concatenate to it).
    ToolCallArguments { choice: u32, index: usize, fragment: String },
    /// A choice ended; `stop_sequence` is the stop string that ended it, if one did.
    Finished { choice: u32, reason: FinishReason, stop_sequence: Option<String> },
    /// Every choice ended: the answer is complete, and this is what it used.
    Done { usage: Usage },
    /// The answer failed; the last step.
    Error(ApiError),
}

/// The last step of an answer for the dialects' stream tests: `prompt_tokens` (of them
/// `cached_tokens` from the cache) and `completion_tokens` (of them `reasoning_tokens` thinking).
#[cfg(test)]
pub(crate) fn done_for_tests(
    prompt_tokens: u32,
    cached_tokens: u32,
    completion_tokens: u32,
    reasoning_tokens: u32,
) -> ChatDelta {
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        prompt_tokens_details: Some(crate::PromptTokensDetails { cached_tokens }),
        completion_tokens_details: Some(crate::CompletionTokensDetails { reasoning_tokens }),
    };
    ChatDelta::Done { usage }
}
