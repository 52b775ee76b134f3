//! The one step that turns a chat request into a [`GenerateRequest`], checking everything only
//! the engine knows: its slots, the model's vocabulary and context, the chat template and the
//! grammars. Each refusal is a typed [`PrepareError`] the server maps to an OpenAI 400, so a
//! client mistake is never discovered later inside the scheduler, where it could only be a 500.

use serde_json::Value as Json;

use crate::constraint::Constraint;
use crate::model::template::TemplateError;
use crate::request::{CacheScope, GenerateRequest, LazyTools, Prompt, SamplingParams};

/// A chat request as the engine needs it: the API layer has validated the shapes and ranges.
#[derive(Debug, Clone)]
pub struct ChatInput {
    /// Messages as the chat template reads them.
    pub messages: Vec<Json>,
    /// Tool definitions as the chat template reads them.
    pub tools: Option<Vec<Json>>,
    pub n: u32,
    /// `None` lets the completion run to the end of the context.
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    pub logprobs: Option<u32>,
    /// Grammar the whole completion follows, and the request parameter it came from
    /// (`response_format`, or `tools` for a forced call), named when it does not compile.
    pub constraint: Option<(Constraint, &'static str)>,
    /// Grammars of a call the model may start on its own (`tool_choice: "auto"`).
    pub lazy_tools: Option<LazyTools>,
    /// With `auto` tools and a `response_format`, `constraint` is the answer-or-call union and
    /// this is the `response_format`'s own grammar: an answer the model did not start as a call
    /// is held to it, so a format never turns an answer into a call.
    pub answer_constraint: Option<Constraint>,
    /// Who may share cached prefixes with this request (see `CacheScope`).
    pub cache_scope: CacheScope,
    /// Whether and how long a reasoning model thinks (ignored by other models).
    pub thinking: crate::thinking::Thinking,
}

/// Why the engine refuses a request before queueing it: always the client's to fix.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("{}", context_message(.limit, .prompt_tokens, .max_tokens))]
    ContextLength { limit: u32, prompt_tokens: u32, max_tokens: Option<u32> },
    #[error("Invalid 'n': this server runs at most {slots} sequences at once (its --parallel setting), so n may be at most {slots}, but got {n}.")]
    TooManyChoices { n: u32, slots: u32 },
    #[error("Invalid 'n': one API key runs at most {cap} sequences at once on this server (its --max-running-per-key setting), so n may be at most {cap}, but got {n}.")]
    TooManyChoicesPerKey { n: u32, cap: u32 },
    #[error("Invalid 'logit_bias': token id {token} is outside the model's vocabulary (0..{n_vocab}).")]
    LogitBias { token: i32, n_vocab: i32 },
    #[error("Invalid schema for {param}: {reason}")]
    Grammar { param: &'static str, reason: String },
    #[error("The chat template rejected these messages: {0}")]
    Template(#[from] TemplateError),
    #[error("{0}")]
    Image(#[from] crate::model::vision::ImageError),
    /// A completion's prompt (`/v1/completions`, `/infill`) that cannot be built.
    #[error("{0}")]
    RawPrompt(#[from] crate::model::raw_prompt::RawPromptError),
    /// A text request to an embedding model.
    #[error(
        "This model is an embedding model: it generates no text. Send it to /v1/embeddings, or name a chat model."
    )]
    NotGenerative,
}

fn context_message(limit: &u32, prompt_tokens: &u32, max_tokens: &Option<u32>) -> String {
    match max_tokens {
        Some(m) => format!(
            "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
            u64::from(*prompt_tokens) + u64::from(*m)
        ),
        None => format!(
            "This model's maximum context length is {limit} tokens. However, your messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        ),
    }
}

/// What bounds a request on this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Max tokens of one sequence, prompt plus completion.
    pub ctx_size: u32,
    /// Sequences decoded together: every choice of a request needs its own.
    pub slots: u32,
    /// Sequences one key may run at once (`--max-running-per-key`): a request of more choices
    /// would take every sequence from the other keys for its whole length.
    pub per_key: Option<u32>,
    pub n_vocab: i32,
}

impl Limits {
    /// The checks that need no tokenization, so a hopeless request costs no template rendering.
    pub fn check_request(&self, input: &ChatInput) -> Result<(), PrepareError> {
        // All choices of a request run side by side, one sequence each; more than the slots
        // would wait forever.
        if input.n > self.slots {
            return Err(PrepareError::TooManyChoices { n: input.n, slots: self.slots });
        }
        if let Some(cap) = self.per_key.filter(|&cap| input.n > cap) {
            return Err(PrepareError::TooManyChoicesPerKey { n: input.n, cap });
        }
        if let Some(&(token, _)) = input.sampling.logit_bias.iter().find(|(t, _)| *t < 0 || *t >= self.n_vocab) {
            return Err(PrepareError::LogitBias { token, n_vocab: self.n_vocab });
        }
        Ok(())
    }

    /// The completion-token limit per choice: `max_tokens`, or what the prompt leaves of the
    /// context when it is unset. Refuses a request that cannot fit.
    pub fn completion_budget(&self, prompt_tokens: u32, max_tokens: Option<u32>) -> Result<u32, PrepareError> {
        let too_long = PrepareError::ContextLength { limit: self.ctx_size, prompt_tokens, max_tokens };
        match max_tokens {
            Some(m) if prompt_tokens.saturating_add(m) > self.ctx_size => Err(too_long),
            Some(m) => Ok(m),
            None if prompt_tokens >= self.ctx_size => Err(too_long),
            None => Ok(self.ctx_size - prompt_tokens),
        }
    }
}

impl ChatInput {
    /// The request to submit, once the prompt is tokenized and the budget known.
    pub fn into_request(self, prompt: Prompt, max_tokens: u32) -> GenerateRequest {
        GenerateRequest {
            prompt,
            n: self.n,
            max_tokens,
            requested_max_tokens: self.max_tokens,
            stop: self.stop,
            sampling: self.sampling,
            logprobs: self.logprobs,
            constraint: self.constraint.map(|(c, _)| c),
            lazy_tools: self.lazy_tools,
            cache_scope: self.cache_scope,
            owner: crate::request::Owner::default(),
            tier: crate::request::ServiceTier::Default,
            streamed: false,
            grammars: Default::default(),
            thinking: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(n: u32, logit_bias: Vec<(i32, f32)>) -> ChatInput {
        ChatInput {
            messages: Vec::new(),
            tools: None,
            n,
            max_tokens: None,
            stop: Vec::new(),
            sampling: SamplingParams { logit_bias, ..SamplingParams::default() },
            logprobs: None,
            constraint: None,
            lazy_tools: None,
            answer_constraint: None,
            cache_scope: CacheScope::default(),
            thinking: Default::default(),
        }
    }

    const LIMITS: Limits = Limits { ctx_size: 100, slots: 4, per_key: None, n_vocab: 1000 };

    #[test]
    fn n_beyond_the_slots_is_refused_up_front() {
        assert!(LIMITS.check_request(&input(4, vec![])).is_ok());
        let e = LIMITS.check_request(&input(5, vec![])).unwrap_err();
        assert!(matches!(e, PrepareError::TooManyChoices { n: 5, slots: 4 }), "{e:?}");
        assert!(e.to_string().contains("at most 4, but got 5"), "{e}");
        // Beyond the per-key cap: it would hold the other keys' sequences for its whole length.
        let capped = Limits { per_key: Some(2), ..LIMITS };
        assert!(capped.check_request(&input(2, vec![])).is_ok());
        let e = capped.check_request(&input(3, vec![])).unwrap_err();
        assert!(matches!(e, PrepareError::TooManyChoicesPerKey { n: 3, cap: 2 }), "{e:?}");
        assert!(e.to_string().contains("--max-running-per-key"), "{e}");
    }

    #[test]
    fn logit_bias_ids_must_be_in_the_vocabulary() {
        assert!(LIMITS.check_request(&input(1, vec![(0, 1.0), (999, -100.0)])).is_ok());
        for token in [-1, 1000] {
            let e = LIMITS.check_request(&input(1, vec![(5, 1.0), (token, 1.0)])).unwrap_err();
            assert!(matches!(e, PrepareError::LogitBias { token: t, n_vocab: 1000 } if t == token), "{e:?}");
        }
    }

    #[test]
    fn completion_budget_fills_or_refuses_the_context() {
        assert_eq!(LIMITS.completion_budget(30, None).unwrap(), 70);
        assert_eq!(LIMITS.completion_budget(30, Some(70)).unwrap(), 70);
        assert_eq!(LIMITS.completion_budget(99, None).unwrap(), 1);
        let e = LIMITS.completion_budget(30, Some(71)).unwrap_err();
        assert!(matches!(e, PrepareError::ContextLength { limit: 100, prompt_tokens: 30, max_tokens: Some(71) }));
        assert!(e.to_string().contains("you requested 101 tokens (30 in the messages, 71 in the completion)"), "{e}");
        let e = LIMITS.completion_budget(100, None).unwrap_err();
        assert!(e.to_string().contains("your messages resulted in 100 tokens"), "{e}");
        // No overflow on absurd max_tokens.
        assert!(LIMITS.completion_budget(30, Some(u32::MAX)).is_err());
    }
}
