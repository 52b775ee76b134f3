//! The vectors a step's values live in, kept from one step to the next so that a steady step
//! allocates none of its own: each stage takes its vectors from [`StepBuffers`], and they come
//! back once the step's values are spent. The values stay values (each stage returns what the
//! next takes); only their room is reused.

use crate::kv::seq_id::SeqId;
use crate::kv::ubatches::UbatchScratch;
use crate::scheduler::sample::first_tokens::FirstTokens;
use crate::scheduler::step::batch::ChoiceRows;
use crate::scheduler::step::plan::rows::RowOrder;
use crate::scheduler::step::plan::{DecodingChoice, StepDecision};
use crate::speculation::Chain;

/// The step's vectors between steps. Each is emptied by the stage that takes it.
#[derive(Default)]
pub(crate) struct StepBuffers {
    /// The drafts each sequence's drafter offers (`offer_drafts`).
    pub offers: Vec<Option<Chain>>,
    /// The planner's decoding choices (`step_inputs`).
    pub decoding: Vec<DecodingChoice>,
    /// The planner's decision (`plan_step`).
    pub decision: StepDecision,
    /// The decoding choices as committed (`PlannedStep::decoding`).
    pub committed: Vec<(SeqId, usize, i32, Chain)>,
    /// The batch's rows in order (`batch::write`).
    pub order: RowOrder,
    pub ubatches: UbatchScratch,
    /// Each sequence's rows in the batch (`BatchRows::choices`), all taken by `verify`.
    pub choices: Vec<Option<ChoiceRows>>,
    /// The tokens sampled at each choice's first position (`sample_first_tokens`).
    pub first_tokens: FirstTokens,
}

/// `v`, emptied; an empty vector, which holds no memory, stays in its place.
pub(crate) fn emptied<T>(v: &mut Vec<T>) -> Vec<T> {
    let mut v = std::mem::take(v);
    v.clear();
    v
}
