//! The engine's usage and logprobs as the API's types, for streamed and collected answers alike.

use gantry_api::{ChoiceLogprobs, TokenLogprob as ApiTokenLogprob, TopLogprob as ApiTopLogprob, Usage as ApiUsage};
use gantry_engine::{TokenLogprob, Usage};

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
