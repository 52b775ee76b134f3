//! State of one admitted request inside the scheduler: its prompt, its choices (one llama.cpp
//! sequence each) and the channels back to its owner.

pub(crate) mod answer_gate;
pub(crate) mod held_output;
pub(crate) mod phase;
pub(crate) mod produce;
pub mod stop_strings;
pub(crate) mod thinking;
pub(crate) mod tool_watch;

use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::constraint::PreparedGrammars;
use crate::error::EngineError;
use crate::faults::{Fault, FaultPoint};
use crate::kv::seq_id::SeqId;
use crate::model::vision::PromptImage;
use crate::model::LoadedModel;
use crate::request::{CacheScope, Event, FinishReason, GenerateRequest, LazyTools, Outcome, Usage};
use crate::scheduler::request::held_output::Held;
pub(crate) use crate::scheduler::request::phase::{ChoiceState, Phase};
use crate::scheduler::request::stop_strings::TextAssembler;
use crate::scheduler::request::thinking::block::ChoiceThinking;
pub(crate) use crate::scheduler::request::tool_watch::ToolWatch;
use crate::scheduler::sample::sampler::{build_sampler, Sampler};
use crate::speculation::shared_drafts::DraftFamilies;
use crate::speculation::{Drafter, Speculate, SpeculationConfig};

pub(crate) struct Choice {
    pub index: u32,
    pub seq_id: SeqId,
    pub sampler: Sampler,
    pub text: TextAssembler,
    pub generated: u32,
    /// Position the next fed token takes in this sequence.
    pub pos: i32,
    /// Waiting, a token to feed at the next step, or finished.
    pub state: ChoiceState,
    pub drafter: Drafter,
    /// When this choice last produced a token, for latency metrics.
    pub last_token_at: Option<Instant>,
    /// Watching for a tool call to constrain (`tool_choice: "auto"`); `None` once it started
    /// or when the request has no tools.
    pub tool_watch: Option<ToolWatch>,
    /// Sampled under a grammar right now (`response_format`, a forced call, or a call the model
    /// started): stop strings do not apply, since cutting the text would break the JSON.
    pub constrained: bool,
    /// Sampled by its sequence's chain on the device (see `sample::device`), not `sampler`.
    pub on_device: bool,
    /// Inside a reasoning model's thinking block (see `thinking`); `None` once it closed.
    pub thinking: Option<ChoiceThinking>,
    /// The thinking just closed: the answer's leading whitespace is not shown.
    pub answer_unstarted: bool,
    /// The token fed before the next one (the prompt's last, then the last produced).
    pub last_token: i32,
    /// Output held back while it may still be a call (see `answer_gate`).
    pub held: Option<Held>,
}

pub(crate) struct ActiveRequest {
    pub prompt: Vec<i32>,
    /// The prompt's images, in order: each is evaluated in one piece (see `vision`).
    pub images: Vec<PromptImage>,
    /// Where it is: reading its prompt, waiting for a prefix, decoding, finished.
    pub phase: Phase,
    /// Steps in a row its prompt read nothing (see `prompt_turns`).
    pub prompt_waits: u32,
    /// Only prefixes and answers cached under this scope are reused (see `CacheScope`).
    pub scope: CacheScope,
    pub choices: Vec<Choice>,
    pub max_tokens: u32,
    pub logprobs: Option<u32>,
    seeded: bool,
    /// Greedy under `--deterministic-greedy`: computed apart from other sequences, in fixed
    /// prompt chunks, reusing no cache and verifying no drafts (see `deterministic`).
    pub isolated: bool,
    pub submitted_at: Instant,
    pub usage: Usage,
    events: mpsc::UnboundedSender<Event>,
    usage_tx: Option<oneshot::Sender<Usage>>,
    pub(crate) lazy_tools: Option<LazyTools>,
    /// Tests only: a panic planned in this request's step (see `faults`).
    pub fault: Fault,
    /// Whose request it is, for fair sharing (see `queue`).
    pub owner: crate::request::Owner,
    /// Its lane in the queue.
    pub tier: crate::request::ServiceTier,
    /// Its client reads the output as it is made: not preempted (see `is_preemptible`).
    streamed: bool,
    /// The tool-call grammars `prepare` compiled (the output's is in the choices' samplers).
    pub(crate) grammars: PreparedGrammars,
}

impl ActiveRequest {
    /// A batch's line (`ServiceTier::Batch`): preempted for, and sitting out steps of,
    /// interactive work.
    pub(crate) fn is_batch_line(&self) -> bool {
        self.tier == crate::request::ServiceTier::Batch
    }

    /// Stopped (`Ending::Preempted`) when interactive work waits for its sequences: a batch's
    /// line, or a `flex` request whose client sees nothing before its end, so that it can be
    /// run again from the start. A streamed one runs to its end once started.
    pub(crate) fn is_preemptible(&self) -> bool {
        use crate::request::ServiceTier;
        match self.tier {
            ServiceTier::Batch => true,
            ServiceTier::Flex => !self.streamed,
            ServiceTier::Default | ServiceTier::Priority => false,
        }
    }

    /// Fails (with the reason) only if the request's grammar does not compile, which the server
    /// checks before queueing. The usage report's sender is attached once it started
    /// ([`Self::report_usage_to`]), so a request that fails to start still has it to answer.
    pub(crate) fn new(
        request: GenerateRequest,
        events: mpsc::UnboundedSender<Event>,
        submitted_at: Instant,
        seq_ids: Vec<SeqId>,
        model: &LoadedModel,
        ctx_size: u32,
        speculation: SpeculationConfig,
    ) -> Result<Self, String> {
        // `prepare` compiled the grammar: each choice only instantiates a matcher from it. Where
        // the model decides between answer and call (`answer_gate`: `prepare` compiles the
        // answer's grammar only for a model with a tag token), no grammar starts.
        let fault = Fault::from_prompt(&request.prompt.text);
        fault.check(FaultPoint::Starting, 0);
        let gated = request.grammars.answer.is_some();
        let mut grammars = Vec::with_capacity(seq_ids.len());
        for _ in &seq_ids {
            let matcher = match (&request.grammars.output, &request.constraint) {
                _ if gated => None,
                (Some(compiled), _) => Some(compiled.matcher()),
                (None, Some(constraint)) => Some(model.constraint_matcher(constraint, request.cache_scope, &[])),
                (None, None) => None,
            };
            match matcher.transpose() {
                Ok(g) => grammars.push(g),
                Err(e) => return Err(e),
            }
        }
        let window = request.max_tokens.min(ctx_size) as i32;
        let speculation = speculation.for_request(&request.sampling);
        let family =
            DraftFamilies::family(request.cache_scope, request.constraint.as_ref(), request.lazy_tools.as_ref());
        // Under a grammar the drafter quotes values from the prompt from their first token on.
        let unspaced = (request.constraint.is_some() && speculation.mode != Speculate::Off)
            .then(|| model.unspaced(&request.prompt.tokens));
        let json = unspaced.is_some().then(|| model.json_marks());
        let choices = seq_ids
            .into_iter()
            .zip(grammars)
            .enumerate()
            .map(|(i, (seq_id, grammar))| {
                let mut drafter = Drafter::new(&request.prompt.tokens, speculation);
                drafter.join_family(family);
                if let Some(unspaced) = &unspaced {
                    drafter.quote_unspaced(unspaced.clone());
                }
                if let Some(marks) = &json {
                    drafter.draft_json_layout(marks.clone());
                }
                // A thinking block comes first: the answer's grammar waits for its end.
                let (grammar, thinking) = match &request.thinking {
                    Some(plan) => (None, Some(ChoiceThinking::new(plan, grammar))),
                    None => (grammar.map(|m| drafter.follow_grammar(m)), None),
                };
                let mut sampler = build_sampler(&request.sampling, crate::units::count_u32(i), window, grammar);
                if let Some(plan) = &request.thinking {
                    sampler.force(&plan.open);
                }
                Choice {
                    index: crate::units::count_u32(i),
                    seq_id,
                    sampler,
                    text: TextAssembler::new(request.stop.clone()),
                    generated: 0,
                    pos: 0,
                    state: ChoiceState::Waiting,
                    drafter,
                    last_token_at: None,
                    tool_watch: request.lazy_tools.as_ref().map(|_| ToolWatch::new()),
                    constrained: request.constraint.is_some() && thinking.is_none() && !gated,
                    on_device: false,
                    thinking,
                    answer_unstarted: false,
                    last_token: request.prompt.tokens.last().copied().unwrap_or_default(),
                    held: None,
                }
            })
            .collect();
        let prompt_tokens = crate::units::count_u32(request.prompt.tokens.len());
        let mut req = Self {
            prompt: request.prompt.tokens,
            images: request.prompt.images,
            phase: Phase::Prefilling { read: 0 },
            prompt_waits: 0,
            scope: request.cache_scope,
            choices,
            max_tokens: request.max_tokens,
            logprobs: request.logprobs,
            seeded: request.sampling.seed.is_some(),
            isolated: false,
            submitted_at,
            usage: Usage { prompt_tokens, ..Usage::default() },
            events,
            usage_tx: None,
            lazy_tools: request.lazy_tools,
            fault,
            owner: request.owner,
            tier: request.tier,
            streamed: request.streamed,
            grammars: PreparedGrammars { output: None, ..request.grammars },
        };
        // With thinking first, the gate is armed once the thinking closes (see `thinking`).
        if gated && req.choices.iter().all(|c| c.thinking.is_none()) {
            (0..req.choices.len()).for_each(|i| req.arm_gate(i, model));
        }
        Ok(req)
    }

    /// Where the usage report goes when the request ends.
    pub(crate) fn report_usage_to(&mut self, tx: oneshot::Sender<Usage>) {
        self.usage_tx = Some(tx);
    }

    /// Most prompt tokens that may come from the cache: the last one is always decoded, since
    /// its logits start the completion.
    ///
    /// A seeded request reuses nothing: logits of a prompt computed in one piece differ in the
    /// last bits from those of a prompt resumed from the cache, and at temperature > 0 that can
    /// change a sampled token. Same seed and same request must give the same output.
    pub(crate) fn reusable_len(&self) -> usize {
        if self.seeded || self.isolated {
            return 0;
        }
        self.whole_images(self.prompt.len().saturating_sub(1))
    }

    /// The longest prefix of the first `len` prompt positions that holds no part of an image:
    /// an image's cells are only ever computed, shared or kept together.
    pub(crate) fn whole_images(&self, len: usize) -> usize {
        match self.images.iter().find(|im| im.start < len && len < im.start + im.len) {
            Some(im) => im.start,
            None => len,
        }
    }

    /// The image starting at prompt position `pos`, if one does.
    pub(crate) fn image_at(&self, pos: usize) -> Option<&PromptImage> {
        self.images.iter().find(|im| im.start == pos)
    }

    /// Where prompt text from `pos` on ends: at the next image, or the prompt's end.
    pub(crate) fn text_end(&self, pos: usize) -> usize {
        self.images.iter().map(|im| im.start).find(|&s| s >= pos).unwrap_or(self.prompt.len())
    }

    pub(crate) fn seq_ids(&self) -> Vec<SeqId> {
        self.choices.iter().map(|c| c.seq_id).collect()
    }

    pub(crate) fn client_gone(&self) -> bool {
        self.events.is_closed()
    }

    /// Tells the owner how much of the prompt the cache held (`Event::Cached`), once it is settled.
    pub(crate) fn announce_cached(&self) {
        let _ = self.events.send(Event::Cached { tokens: self.usage.cached_tokens });
    }

    /// Ends the request: the owner gets `Done` (or the error) and the usage report.
    pub(crate) fn complete(mut self, error: Option<EngineError>) -> Usage {
        let reasons = || self.choices.iter().filter_map(Choice::finished);
        self.usage.outcome = if error == Some(EngineError::Preempted) {
            Outcome::Preempted
        } else if error.is_some() {
            Outcome::Error
        } else if reasons().any(|r| r == FinishReason::Cancelled) {
            Outcome::Cancelled
        } else if reasons().any(|r| r == FinishReason::Length) {
            Outcome::Length
        } else {
            Outcome::Completed
        };
        let event = match error {
            Some(e) => Event::Error(e),
            None => Event::Done(self.usage),
        };
        let _ = self.events.send(event);
        if let Some(tx) = self.usage_tx.take() {
            let _ = tx.send(self.usage);
        }
        self.usage
    }
}

impl Drop for ActiveRequest {
    /// A request dropped without `complete` (a panic unwound past the step holding it) still
    /// ends its stream and reports the tokens it generated, so they are billed.
    fn drop(&mut self) {
        if let Some(tx) = self.usage_tx.take() {
            self.usage.outcome = Outcome::Error;
            let _ = self.events.send(Event::Error(EngineError::Crashed("the request was lost mid-step".into())));
            let _ = tx.send(self.usage);
        }
    }
}
