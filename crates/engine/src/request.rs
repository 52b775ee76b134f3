//! What the server hands the engine, and what the engine streams back.

use tokio::sync::{mpsc, oneshot};

/// Sampling settings of one request, already validated by the API layer.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (deterministic).
    pub temperature: f32,
    pub top_p: f32,
    /// Only the `top_k` highest logits may be drawn; 0: no limit.
    pub top_k: u32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Same seed and same request give the same output; `None` draws a random seed.
    pub seed: Option<u64>,
    /// (token id, bias) pairs, bias in -100..=100 as in OpenAI's API.
    pub logit_bias: Vec<(i32, f32)>,
    /// No end-of-generation token may be drawn (llama-server's and vLLM's `ignore_eos`): each
    /// choice runs to its length or a stop string. `prepare` turns it into `logit_bias` bans.
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// A tokenized prompt ready for generation.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: String,
    /// What is decoded, one entry per position; an image's positions hold negative ids (see
    /// `vision`).
    pub tokens: Vec<i32>,
    /// The images, in order, each over its positions in `tokens`.
    pub images: Vec<crate::model::vision::PromptImage>,
    /// Byte ranges of `text` where a client's string spelled a control token: tokenized as plain
    /// text (see `typed_text`).
    pub typed: Vec<std::ops::Range<usize>>,
}

pub use crate::kv::scope::CacheScope;

/// One generation job: `n` completions of the same prompt.
#[derive(Debug)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub n: u32,
    /// Completion-token limit per choice; the engine also stops at the sequence's context end.
    pub max_tokens: u32,
    /// `max_tokens` as the client sent it (`None`: what the context leaves), for recomputing the
    /// limit once images have their real size.
    pub requested_max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    /// Number of alternatives to report per token (0..=20) when `logprobs` is on.
    pub logprobs: Option<u32>,
    /// Grammar the completion must follow (JSON object or schema).
    pub constraint: Option<crate::constraint::Constraint>,
    /// `tool_choice: "auto"`: free text, until the output starts a tool call; from there on the
    /// call is constrained.
    pub lazy_tools: Option<LazyTools>,
    /// Only prefixes cached under this scope are reused.
    pub cache_scope: CacheScope,
    /// Whose request this is: the queue shares sequences and prompt rows between owners by their
    /// weights, and `max_running_per_key` caps each key (see `scheduler::queue`). Requests left
    /// at the default share one queue.
    pub owner: Owner,
    /// Its lane in the queue (`scheduler::queue`): `Flex` waits behind every other request.
    pub tier: ServiceTier,
    /// Its client reads the output as it is made (a stream). A `Flex` request that does not is
    /// preempted as a batch's line is (its client sees only the end, so it may be told to try
    /// again); one that does runs to its end once started.
    pub streamed: bool,
    /// `constraint` and `lazy_tools` compiled by `prepare` (off the scheduler thread).
    pub grammars: crate::constraint::PreparedGrammars,
    /// The output starts with a thinking block (a reasoning model): how it is handled.
    pub thinking: Option<crate::thinking::ThinkingPlan>,
}

impl GenerateRequest {
    /// Whether its choices need the host's sampler whatever their sampling parameters: several
    /// choices read one prompt's logits, logprobs read them all, a grammar masks them (from the
    /// start, or once a tool call starts), a thinking block's markers are forced, and an image's
    /// rows are decoded apart.
    pub(crate) fn needs_host_sampling(&self) -> bool {
        self.n > 1
            || self.logprobs.is_some()
            || self.constraint.is_some()
            || self.grammars.output.is_some()
            || self.lazy_tools.is_some()
            || self.thinking.is_some()
            || !self.prompt.images.is_empty()
    }
}

/// Grammars for a tool call the model starts on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct LazyTools {
    /// The whole output, once it starts with `{` or `[`: a bare JSON call (or array of calls).
    pub bare: crate::constraint::Constraint,
    /// What follows a `<tool_call>` tag (Qwen/Hermes): the call, `</tool_call>`, maybe more calls.
    pub tagged: crate::constraint::Constraint,
    /// Lark rules defining `fenced_calls`: a ```json fence holding a call, then (when parallel
    /// calls are allowed) more such fences, then the end. A fenced call is constrained by
    /// `start: "<the output before the fence>" fenced_calls` and these rules
    /// (`tools::fenced_grammar`).
    pub fenced_calls_rules: String,
    /// The offered function names: bare or fenced JSON is only constrained as a call once it
    /// starts `{"name": "<one of these>", "arguments": {`.
    pub names: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or a stop string.
    Stop,
    /// max_tokens or the context window.
    Length,
    /// The client went away.
    Cancelled,
}

impl FinishReason {
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::Cancelled => "length",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    /// The token's id in the model's vocabulary (llama.cpp's `/infill` reports it).
    pub id: i32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// The log-probability of one sampled token and its most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token's id in the model's vocabulary.
    pub id: i32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

/// Token counts of a finished (or cancelled) request: what the customer is billed for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// The completion tokens spent thinking (inside the model's thinking block, its markers
    /// included): billed as completion tokens, reported apart.
    pub reasoning_tokens: u32,
    pub outcome: Outcome,
}

/// How a request ended, for the usage ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Outcome {
    /// Every choice stopped on its own (end of generation, stop string, tool call).
    #[default]
    Completed,
    /// A choice hit max_tokens or the context window.
    Length,
    /// The client went away first.
    Cancelled,
    /// The engine failed or shut down mid-request.
    Error,
    /// A batch's line or an unstreamed `flex` request stopped for waiting interactive work
    /// before it finished: nothing of it was delivered, and its owner runs it again.
    Preempted,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
            Outcome::Preempted => "preempted",
        }
    }
}

/// Streamed from the engine to the request's owner, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// How many of the prompt's first tokens came from the prefix cache, once the request's
    /// sequence holds them: sent once, before any text, so a stream can say it as it opens
    /// (Anthropic's `message_start` carries the cached split). The usage at the end agrees.
    Cached { tokens: u32 },
    /// New text (possibly empty, when held back for a stop string) and its tokens' logprobs.
    Delta { choice: u32, text: String, logprobs: Vec<TokenLogprob> },
    /// New thinking text (a reasoning model's, before its answer), without logprobs.
    Reasoning { choice: u32, text: String },
    /// The stop string (its index in the request's `stop`, empty ones left out) that ended
    /// `choice`; sent right before that choice's `Finished`.
    StopSequence { choice: u32, index: u32 },
    /// A choice ended; no more deltas follow for it.
    Finished { choice: u32, reason: FinishReason },
    /// All choices ended. Always the last event unless an error occurred.
    Done(Usage),
    /// Generation failed; the last event. The usage channel still reports what was generated.
    Error(crate::error::EngineError),
}

/// The receiving side of a submitted request. Dropping `events` cancels the request at the
/// next scheduler step; `usage` still reports what was generated until then.
pub struct GenerationHandle {
    pub events: mpsc::UnboundedReceiver<Event>,
    pub usage: oneshot::Receiver<Usage>,
}

/// Whose request it is, for weighted fair sharing (`scheduler::queue`): tenants share the server
/// by their weights, and a tenant's keys share what it gets by theirs, so a tenant's many keys
/// together get its one weight. The server fills it from the API key; ids are opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The API key (its id).
    pub key: u64,
    /// Its share among its tenant's keys, at least 1.
    pub key_weight: u32,
    /// The tenant the key belongs to (an opaque id: keys of one tenant name have the same).
    pub tenant: u64,
    /// The tenant's share among tenants, at least 1.
    pub tenant_weight: u32,
}

impl Owner {
    /// Key `key` of the one default tenant, both weighing 1.
    pub fn key(key: u64) -> Self {
        Self { key, key_weight: 1, tenant: 0, tenant_weight: 1 }
    }
}

impl Default for Owner {
    fn default() -> Self {
        Self::key(0)
    }
}

/// The service tier a request runs in (OpenAI's `service_tier`, as the server resolved it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ServiceTier {
    /// Ahead of its own key's other requests.
    Priority,
    #[default]
    Default,
    /// Only on sequences no other request waits for: idle capacity, sold cheaper. Unless it is
    /// `streamed`, stopped as `Batch` is (its client told to try again).
    Flex,
    /// A batch's line: waits as `Flex` does, and is stopped (`Outcome::Preempted`) when a
    /// `Default` or `Priority` request waits for its sequence. Nothing of it reaches a client
    /// before it ends, so its owner can run it again from the start.
    Batch,
}
