//! Planning a step: which batch lines sit it out ([`SittingOut`]), what the running requests
//! bring to the planner (each decoding choice's token and the drafts its drafter offers, each
//! prompt still being read and how far it may be), the planner's decision, committed
//! (`commit`).

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;

use crate::faults::FaultPoint;
use crate::kv::seq_id::SeqId;
use crate::scheduler::request::{ActiveRequest, Choice, Phase};
use crate::scheduler::step::buffers::emptied;
use crate::scheduler::step::commit::{commit, Committing, PlannedStep};
use crate::scheduler::step::deterministic;
use crate::scheduler::step::plan::rows::PendingPrompt;
use crate::scheduler::step::plan::{self, DecodingChoice, PromptToRead, StepInputs};
use crate::scheduler::step::prompt_turns::PromptDeficits;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::speculation::{Chain, Speculate};

/// The most a batch's lines may add to the time of a step that decodes interactive requests;
/// past it they sit the step out (`Scheduler::sit_out_batch_lines`).
const BATCH_SLOWDOWN: f64 = 0.10;
/// How long batch lines hold off after interactive work was last seen: a client answered sends
/// its next request within it, which then finds no batch step in its way.
const BATCH_HOLD_OFF: Duration = Duration::from_millis(100);

impl Scheduler {
    /// Decides which batch lines (`ServiceTier::Batch`) sit this step out, so that interactive
    /// work computes as it would alone: all of them when an interactive request reads its prompt
    /// (its time to first token is the prompt's steps); when their rows would make a step of
    /// interactive decoding more than `BATCH_SLOWDOWN` slower by the measured step costs
    /// (`StepCost`: on a CPU a row costs about as much as another, on a GPU little); and, with
    /// no interactive row, for `BATCH_HOLD_OFF` after interactive work was last seen (then
    /// [`SittingOut::held_off_until`] tells `run` to wait). A line another request waits to
    /// copy a prefix from never sits out, so that request is not held up too.
    pub(in crate::scheduler) fn sit_out_batch_lines(&mut self) -> SittingOut {
        let is_line = ActiveRequest::is_batch_line;
        let rows = |r: &ActiveRequest| match r.phase {
            Phase::Prefilling { read } => (r.prompt.len() - read).min(self.cfg.batch_size as usize),
            _ => r.choices.iter().filter(|c| c.ready().is_some()).count(),
        };
        let now = Instant::now();
        if self.waiting.standard_waits() || self.active.iter().any(|r| !is_line(r)) {
            self.interactive_at = Some(now);
        }
        // No batch line is running: none sits out.
        if !self.active.iter().any(is_line) {
            return SittingOut::default();
        }
        let interactive_reads = self.active.iter().any(|r| !is_line(r) && matches!(r.phase, Phase::Prefilling { .. }));
        let interactive: usize = self.active.iter().filter(|r| !is_line(r)).map(rows).sum();
        let lines: usize = self.active.iter().filter(|r| is_line(r)).map(rows).sum();
        let hold_off = self.interactive_at.map(|at| at + BATCH_HOLD_OFF).filter(|&until| until > now);
        let costly = || match (self.step_cost.predict(interactive + lines), self.step_cost.predict(interactive)) {
            (Some(with), Some(without)) => with > without * (1.0 + BATCH_SLOWDOWN),
            _ => true,
        };
        let sit_out = lines > 0
            && match interactive {
                0 => hold_off.is_some(),
                _ => interactive_reads || costly(),
            };
        SittingOut {
            lines: sit_out,
            awaited: self.active.iter().filter_map(|r| r.awaited_prefix().map(|(from, _)| from)).collect(),
            held_off_until: hold_off.filter(|_| sit_out && interactive == 0),
        }
    }

    /// Plans the step: the running requests offer their tokens, drafts and prompt chunks
    /// ([`Self::offer_drafts`], [`step_inputs`]), the pure planner decides (`plan::plan_step`),
    /// and the decision is committed to the requests, the queue and the KV mirror (`commit`).
    pub(in crate::scheduler) fn plan(&mut self, ctx: &mut LlamaContext<'_>, sitting: &SittingOut) -> PlannedStep {
        let mut offers = self.offer_drafts(ctx, sitting);
        let decoding = emptied(&mut self.buffers.decoding);
        let inputs = step_inputs(&mut self.active, &self.cfg, &self.prompt_deficits, &mut offers, decoding, sitting);
        self.buffers.offers = offers;
        let last = std::mem::take(&mut self.buffers.decision);
        let mut decision = plan::plan_step(inputs, &self.step_cost, &mut self.acceptance, last);
        self.buffers.decoding = std::mem::take(&mut decision.spent_inputs);
        let to = Committing {
            active: &mut self.active,
            waiting: &mut self.waiting,
            deficits: &mut self.prompt_deficits,
            kv: &mut self.kv,
            quantum: prompt_quantum(&self.cfg),
        };
        commit(decision, to, sitting, emptied(&mut self.buffers.committed))
    }

    /// Asks each decoding choice's drafter for the drafts it could feed, which the planner then
    /// cuts: by sequence (`SeqId::index`). A drafter runs its grammar on the choice's own output:
    /// a panic there ends that request alone.
    fn offer_drafts(&mut self, ctx: &mut LlamaContext<'_>, sitting: &SittingOut) -> Vec<Option<Chain>> {
        let taking_part = self.active.iter().filter(|r| decodes(r, sitting));
        let decoding = taking_part.flat_map(|r| &r.choices).filter(|c| c.ready().is_some()).count();
        let lookups = plan::lookups_allowed(decoding);
        let ctx_size = self.cfg.ctx_size as i32;
        let mut panicked = Vec::new();
        let mut offers = emptied(&mut self.buffers.offers);
        offers.resize_with(self.cfg.parallel as usize, || None);
        for (r, req) in self.active.iter_mut().enumerate().filter(|(_, req)| decodes(req, sitting)) {
            let shared = &self.shared;
            let offers = &mut offers;
            let offered = std::panic::catch_unwind(AssertUnwindSafe(|| {
                for c in req.choices.iter_mut().filter(|c| c.ready().is_some()) {
                    req.fault.check(FaultPoint::Drafting, req.usage.completion_tokens);
                    let limit = draft_limit(req.max_tokens, req.isolated, c, ctx_size);
                    let chain = c.drafter.chain(limit, if lookups { limit } else { 0 }, shared.of(c.drafter.family()));
                    offers[c.seq_id.index()] = Some(chain);
                }
            }));
            if let Err(payload) = offered {
                panicked.push((r, crate::error::panic_message(payload.as_ref())));
            }
        }
        self.end_panicked(ctx, panicked);
        offers
    }
}

/// The batch lines that sit this step out (`Scheduler::sit_out_batch_lines`): every stage that
/// gives rows asks it, so `offer_drafts`, `step_inputs` and `commit` agree.
#[derive(Debug, Default)]
pub(crate) struct SittingOut {
    /// Batch lines sit this step out.
    lines: bool,
    /// Sequences other requests wait to copy a prefix from: a line holding one never sits out.
    awaited: Vec<SeqId>,
    /// Only batch lines have rows, and they hold off until then: `run` waits for a job until
    /// then rather than spin.
    pub held_off_until: Option<Instant>,
}

impl SittingOut {
    /// Whether `req` skips this step.
    pub(crate) fn sits_out(&self, req: &ActiveRequest) -> bool {
        self.lines && req.is_batch_line() && !req.choices.iter().any(|c| self.awaited.contains(&c.seq_id))
    }
}

/// Whether `req` reads its prompt this step, as far as the budget goes: still prefilling, and not
/// waiting to copy a prefix another sequence is computing. `step_inputs` and `commit` must agree.
pub(super) fn reads_prompt(req: &ActiveRequest, sitting: &SittingOut) -> bool {
    matches!(req.phase, Phase::Prefilling { .. }) && !sitting.sits_out(req)
}

/// Whether `req`'s decoding choices feed their tokens this step (a batch's line may sit it out).
/// `step_inputs` and `commit` must agree.
pub(super) fn decodes(req: &ActiveRequest, sitting: &SittingOut) -> bool {
    !sitting.sits_out(req)
}

/// Most drafts decoding choice `c` could use now: verifying `k` drafts produces up to `k + 1`
/// tokens, and the last draft must sit inside the context (after the token fed at `c.pos`).
/// Isolated requests verify none.
fn draft_limit(max_tokens: u32, isolated: bool, c: &Choice, ctx_size: i32) -> usize {
    if isolated {
        return 0;
    }
    let produce_left = max_tokens.saturating_sub(c.generated) as usize;
    let room = (ctx_size - (c.pos + 1)).max(0) as usize;
    produce_left.saturating_sub(1).min(room)
}

/// The prompt rows a key with a prompt waiting is owed each step (`prompt_turns`): what one
/// long prompt may read while streams decode, or, without that cap, a whole batch.
fn prompt_quantum(cfg: &SchedulerConfig) -> usize {
    cfg.prompt_rows_while_decoding.unwrap_or(cfg.batch_size as usize)
}

/// What the running requests bring to this step, for the planner: each decoding choice's token
/// and the drafts it was offered (taken out of `Choice::drafts`), each prompt still being read.
fn step_inputs<'a>(
    active: &'a mut [ActiveRequest],
    cfg: &SchedulerConfig,
    deficits: &'a PromptDeficits,
    offers: &mut [Option<Chain>],
    mut decoding: Vec<DecodingChoice>,
    sitting: &SittingOut,
) -> StepInputs<'a> {
    let ctx_size = cfg.ctx_size as i32;
    let chunk = deterministic::chunk_size(cfg.batch_size, cfg.parallel);
    // The fixed prompt chunks of isolated requests are held back from drafts.
    let reserved: usize = active
        .iter()
        .filter(|r| r.isolated && reads_prompt(r, sitting))
        .map(|r| deterministic::chunk_end(r.read(), chunk, r.text_end(r.read())) - r.read())
        .sum();
    for req in active.iter_mut().filter(|r| decodes(r, sitting)) {
        for c in req.choices.iter_mut() {
            let Some(token) = c.ready() else { continue };
            decoding.push(DecodingChoice {
                token,
                pos: c.pos,
                seq: c.seq_id,
                limit: draft_limit(req.max_tokens, req.isolated, c, ctx_size),
                offered: offers[c.seq_id.index()].take().unwrap_or_default(),
                constrained: c.constrained,
            });
        }
    }
    let active: &'a [ActiveRequest] = active;
    let prompts = active
        .iter()
        .filter(|r| reads_prompt(r, sitting))
        .map(|r| PromptToRead {
            seq: r.choices[0].seq_id,
            prompt: &r.prompt,
            pending: PendingPrompt { prefilled: r.read(), text_end: r.text_end(r.read()), isolated: r.isolated },
            owner: r.owner,
            waited: r.prompt_waits,
        })
        .collect();
    StepInputs {
        batch_size: cfg.batch_size as usize,
        chunk,
        reserved,
        weigh_drafts: cfg.speculation.mode == Speculate::Auto,
        prompt_rows_while_decoding: cfg.prompt_rows_while_decoding,
        decoding,
        prompts,
        deficits,
    }
}
