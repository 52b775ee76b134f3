//! The step planner: a function from what the running requests bring to a step (each decoding
//! choice's token and the drafts its drafter offers, each prompt still being read) to the step's
//! rows, under the step's token budget, with only the drafts worth verifying fed. `gather.rs`
//! asks the requests for the inputs and `commit.rs` commits the decision to them and to the KV
//! mirror; nothing here touches llama.cpp or a request, so it is unit-tested alone (`tests.rs`).
//!
//! The rules, in order:
//! - every decoding choice's token first, so no stream stalls;
//! - then, choice by choice, its drafts: at most what the budget leaves (`Budget`: lookups only
//!   while few streams decode), and under `Speculate::Auto` only as many as the measured step
//!   cost says pay for themselves (`StepCost::best_draft`, with each lookup run's learned
//!   acceptance);
//! - then prompt chunks in what is left (`prompt_chunk_end`): isolated ones first, then by key
//!   in deficit round-robin (`prompt_turns`), within a key a prompt that waited long first,
//!   then the shortest rest first (`prompt_order`), so a long prompt never holds a short one
//!   back and short ones never starve a long one; on a CPU at most `prompt_rows_while_decoding`
//!   of them while choices decode, so a step stays short (a prompt whose rest fits in two such
//!   caps is read whole all the same).

pub(crate) mod rows;

use crate::kv::seq_id::SeqId;
use crate::request::Owner;
use crate::speculation::step_cost::StepCost;
use crate::speculation::{AcceptanceByKind, AcceptanceKind, Chain, Lookup, MAX_DRAFTING_STREAMS};

use self::rows::{prompt_chunk_end, Budget, PendingPrompt, RowKind, StepPlan};
use crate::scheduler::step::prompt_turns::{PromptDeficits, AGED_AFTER_STEPS};

/// A choice that decodes this step.
#[derive(Debug, Clone)]
pub(crate) struct DecodingChoice {
    /// The token it feeds, at `pos` of `seq`.
    pub token: i32,
    pub pos: i32,
    pub seq: SeqId,
    /// Most drafts it could ever use now: one fewer than the tokens it may still produce
    /// (verifying `k` drafts produces up to `k + 1`), and no further than its context.
    pub limit: usize,
    /// The drafts its drafter offers (at most `limit`; lookups only where [`lookups_allowed`]).
    pub offered: Chain,
    /// Sampled under a grammar: its lookups use the constrained acceptance estimates.
    pub constrained: bool,
}

/// A request whose prompt is still being read into `seq`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromptToRead<'a> {
    pub seq: SeqId,
    pub prompt: &'a [i32],
    pub pending: PendingPrompt,
    /// Whose prompt it is: prompt rows are shared by owners' weights (`prompt_turns`).
    pub owner: Owner,
    /// Steps in a row its prompt read nothing.
    pub waited: u32,
}

/// Everything a step is planned from.
#[derive(Debug)]
pub(crate) struct StepInputs<'a> {
    /// Rows the batch holds.
    pub batch_size: usize,
    /// The fixed prompt chunk of isolated requests (`deterministic::chunk_size`).
    pub chunk: usize,
    /// Rows held for isolated requests' prompt chunks, which drafts may not take.
    pub reserved: usize,
    /// Weigh each draft against the measured step cost (`Speculate::Auto`); otherwise every
    /// offered draft that fits the budget is fed.
    pub weigh_drafts: bool,
    /// Most rows prompts other than isolated ones may take while choices decode.
    pub prompt_rows_while_decoding: Option<usize>,
    /// In request order, each request's choices in order.
    pub decoding: Vec<DecodingChoice>,
    /// In request order.
    pub prompts: Vec<PromptToRead<'a>>,
    /// Each key's account of prompt rows (`prompt_turns`).
    pub deficits: &'a PromptDeficits,
}

/// What the planner decided.
#[derive(Debug, Default)]
pub(crate) struct StepDecision {
    pub plan: StepPlan,
    /// Per decoding choice (input order): the index of its token among `plan.decode`; its
    /// drafts' rows follow it.
    pub token_rows: Vec<usize>,
    /// Per decoding choice: the drafts it feeds.
    pub drafts: Vec<Chain>,
    /// Per prompt (input order): where this step's chunk ends, `None` when it reads none.
    pub prompt_ends: Vec<Option<usize>>,
    /// The inputs' vector of decoding choices, emptied, for the next step (`StepBuffers`).
    pub spent_inputs: Vec<DecodingChoice>,
}

impl StepDecision {
    /// Empties every vector, keeping their room.
    fn clear(&mut self) {
        let StepDecision { plan, token_rows, drafts, prompt_ends, spent_inputs } = self;
        plan.decode.clear();
        plan.prompt.clear();
        token_rows.clear();
        drafts.clear();
        prompt_ends.clear();
        spent_inputs.clear();
    }
}

/// Whether lookup drafts may be fed while `decoding` choices decode: with more streams, a step
/// is already as large as the machine runs efficiently, and the cores are better spent on the
/// streams than on guesses.
pub(crate) fn lookups_allowed(decoding: usize) -> bool {
    decoding <= MAX_DRAFTING_STREAMS
}

/// Plans one step into `decision` (the last step's, emptied here, so its vectors serve again).
/// `acceptance` learns that a lookup was declined (a draft not worth feeding), so an estimate
/// that stopped drafting drifts back to its prior and gets probed again.
pub(crate) fn plan_step(
    inputs: StepInputs<'_>,
    cost: &StepCost,
    acceptance: &mut AcceptanceByKind,
    mut decision: StepDecision,
) -> StepDecision {
    let StepInputs {
        batch_size,
        chunk,
        reserved,
        weigh_drafts,
        prompt_rows_while_decoding,
        mut decoding,
        prompts,
        deficits,
    } = inputs;
    decision.clear();
    // Isolated prompts' fixed chunks are exempt: rows were held for them. So is a prompt whose
    // rest fits in two such caps (read whole, it makes one longer step instead of two), unless
    // its key is overdrawn while another key waits (below).
    let cap = match prompt_rows_while_decoding {
        Some(cap) if !decoding.is_empty() => cap,
        _ => usize::MAX,
    };
    let mut prompt_rows_left = cap;
    let mut budget = Budget::new(batch_size, decoding.len(), reserved, lookups_allowed(decoding.len()));
    // Positions this step computes logits for so far, counting every decoding choice's token.
    let mut outputs = decoding.len();
    for choice in decoding.drain(..) {
        let row = decision.plan.push_decode(choice.token, choice.pos, choice.seq, RowKind::Token);
        budget.take_token();
        let (room, lookup_room) = budget.draft_room(choice.limit);
        let mut chain = choice.offered;
        chain.fit(room, lookup_room);
        let forced = chain.forced_prefix();
        if weigh_drafts && chain.tokens.len() > forced {
            let chance = |l: &Lookup| acceptance[AcceptanceKind::of(l.source, choice.constrained)].chance(l.matched);
            let k = cost.best_draft(outputs, forced, chain.tokens.len(), |k| chain.expected_tokens(k, chance));
            if let Some(first) = chain.lookups.first().filter(|l| l.start >= k) {
                acceptance[AcceptanceKind::of(first.source, choice.constrained)].declined(first.matched);
            }
            chain.truncate(k);
        }
        outputs += chain.tokens.len();
        for (i, &draft) in chain.tokens.iter().enumerate() {
            decision.plan.push_decode(draft, choice.pos + crate::units::llama_pos(i + 1), choice.seq, RowKind::Draft);
        }
        budget.take_drafts(chain.tokens.len(), chain.forced_within(chain.tokens.len()));
        decision.token_rows.push(row);
        decision.drafts.push(chain);
    }
    // Chunks are sized in `prompt_order`, their rows planned in request order (which `commit`
    // walks to find where each prompt's last row is).
    decision.prompt_ends.resize(prompts.len(), None);
    // With another key's prompt waiting, a key that read more than it was owed gets no more
    // whole short prompts past the cap until its account recovers: its stream of them would
    // otherwise take most of every step from the other key's long one.
    let first_key = prompts.iter().find(|p| !p.pending.isolated).map(|p| p.owner.key);
    let contended = prompts.iter().any(|p| !p.pending.isolated && Some(p.owner.key) != first_key);
    for i in prompt_order(&prompts, deficits) {
        let p = &prompts[i];
        let overdrawn = contended && deficits.of(p.owner.key) < 0;
        let exempt = p.pending.isolated || (p.pending.rest() <= cap.saturating_mul(2) && !overdrawn);
        let left = if exempt { budget.left() } else { budget.left().min(prompt_rows_left) };
        let end = if left == 0 { None } else { prompt_chunk_end(p.pending, left, chunk) };
        if let Some(end) = end {
            budget.take_prompt(end - p.pending.prefilled);
            if !p.pending.isolated {
                prompt_rows_left = prompt_rows_left.saturating_sub(end - p.pending.prefilled);
            }
        }
        decision.prompt_ends[i] = end;
    }
    for (p, end) in prompts.iter().zip(&decision.prompt_ends) {
        for pos in p.pending.prefilled..end.unwrap_or(p.pending.prefilled) {
            let last = pos + 1 == p.prompt.len();
            decision.plan.push_prompt(p.prompt[pos], crate::units::llama_pos(pos), p.seq, last);
        }
    }
    decision.spent_inputs = decoding;
    decision
}

/// The order prompts take what the step leaves: isolated prompts' fixed chunks first (rows were
/// held for them); then by key, the key owed most rows first (`prompt_turns`); among keys owed
/// alike, a prompt that waited `AGED_AFTER_STEPS` steps first, then the fewest tokens left to
/// read; ties in request order. A short prompt is read at once beside a long one, instead of
/// waiting for the long one to be read whole (in request order, one key's long prompt held every
/// later request's first token back for its whole prefill: seconds per thousand tokens on a CPU);
/// and
/// a key whose short prompts read every step falls behind in its account, so another key's
/// long prompt goes first and reads its share instead of only what they leave, which was
/// nothing under a steady stream of them.
fn prompt_order(prompts: &[PromptToRead<'_>], deficits: &PromptDeficits) -> Vec<usize> {
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by_key(|&i| {
        let p = &prompts[i];
        let aged = p.waited >= AGED_AFTER_STEPS;
        (!p.pending.isolated, std::cmp::Reverse(deficits.of(p.owner.key)), !aged, p.pending.rest())
    });
    order
}

#[cfg(test)]
mod tests;
