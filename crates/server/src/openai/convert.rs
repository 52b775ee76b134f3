//! The engine's usage, logprobs and finish reasons as the API's types, for streamed and
//! collected answers alike.

use gantry_api::{
    ChoiceLogprobs, FinishReason as ApiFinishReason, TokenLogprob as ApiTokenLogprob, TopLogprob as ApiTopLogprob,
    Usage as ApiUsage,
};
use gantry_engine::{FinishReason, TokenLogprob, Usage};

/// Why a choice ended, `called`: whether it made tool calls. A call cut by `max_tokens` keeps
/// the reason `length`, as OpenAI's; a cancelled choice reads as cut.
pub(crate) fn to_api_finish_reason(reason: FinishReason, called: bool) -> ApiFinishReason {
    match reason {
        FinishReason::Stop if called => ApiFinishReason::ToolCalls,
        FinishReason::Stop => ApiFinishReason::Stop,
        FinishReason::Length | FinishReason::Cancelled => ApiFinishReason::Length,
    }
}

pub(crate) fn to_api_usage(u: Usage) -> ApiUsage {
    ApiUsage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details: Some(gantry_api::PromptTokensDetails { cached_tokens: u.cached_tokens }),
        completion_tokens_details: Some(gantry_api::CompletionTokensDetails { reasoning_tokens: u.reasoning_tokens }),
    }
}

pub(crate) fn to_api_logprobs(lp: Vec<TokenLogprob>) -> ChoiceLogprobs {
    ChoiceLogprobs {
        content: lp
            .into_iter()
            .map(|t| ApiTokenLogprob {
                token: t.token,
                logprob: t.logprob,
                bytes: t.bytes,
                top_logprobs: t
                    .top
                    .into_iter()
                    .map(|a| ApiTopLogprob { token: a.token, logprob: a.logprob, bytes: a.bytes })
                    .collect(),
            })
            .collect(),
    }
}
