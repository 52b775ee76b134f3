//! Committing the planner's decision to the requests, the queue and the KV mirror: each decoding
//! choice feeds its token and drafts, each prompt is read to its chunk's end, every row is
//! charged to its owner and recorded. What it did is a [`PlannedStep`], which `batch::write`
//! puts into llama.cpp's batch.

use crate::kv::cache::KvCache;
use crate::kv::seq_id::SeqId;
use crate::scheduler::queue::FairQueue;
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::step::gather::{decodes, reads_prompt, SittingOut};
use crate::scheduler::step::plan::StepDecision;
use crate::scheduler::step::prompt_turns::PromptDeficits;
use crate::scheduler::Job;
use crate::speculation::Chain;

/// The step as committed: its rows, as planned, and what reading the prompts did.
pub(crate) struct PlannedStep {
    /// The planner's decision: its rows (`plan`), the rest of its vectors emptied for the next
    /// step (`StepBuffers`).
    pub decision: StepDecision,
    /// Each decoding choice's sequence, its row among the decoding rows, the position of the
    /// token it feeds, and its drafts.
    pub decoding: Vec<(SeqId, usize, i32, Chain)>,
    /// Each prompt read to its end: (request, its last row among the prompt rows).
    pub prompt_done: Vec<(usize, usize)>,
    pub prompt_rows: usize,
    /// Requests (index in `active`) with several choices whose prompt this step reads to its end.
    pub spreading: Vec<usize>,
}

/// The scheduler's fields a commit changes, borrowed apart.
pub(crate) struct Committing<'a> {
    pub active: &'a mut [ActiveRequest],
    pub waiting: &'a mut FairQueue<Job>,
    pub deficits: &'a mut PromptDeficits,
    pub kv: &'a mut KvCache,
    /// The prompt rows a key with a prompt waiting is owed each step (`prompt_quantum`).
    pub quantum: usize,
}

/// Applies the planner's decision: each decoding choice feeds its token and drafts (their
/// rows numbered among the decoding rows until the batch is ordered), each prompt is
/// read to its chunk's end (its first choice's sequence; the others get a copy once it is
/// read: `spread_prompts`), and the KV mirror records every row.
/// `decoding` is the last step's vector for the committed choices, empty.
pub(crate) fn commit(
    mut decision: StepDecision,
    to: Committing<'_>,
    sitting: &SittingOut,
    mut decoding: Vec<(SeqId, usize, i32, Chain)>,
) -> PlannedStep {
    let Committing { active, waiting, deficits, kv, quantum } = to;
    let StepDecision { token_rows, drafts, prompt_ends, .. } = &mut decision;
    let mut decided = token_rows.iter().copied().zip(drafts.drain(..));
    for req in active.iter_mut().filter(|r| decodes(r, sitting)) {
        let mut rows = 0;
        for c in req.choices.iter_mut().filter(|c| c.ready().is_some()) {
            let (row, chain) = decided.next().expect("a decision per decoding choice");
            c.take_ready();
            rows += 1 + chain.tokens.len();
            decoding.push((c.seq_id, row, c.pos, chain));
        }
        waiting.charge(req.owner, req.tier, rows);
    }
    let (mut prompt_done, mut spreading) = (Vec::new(), Vec::new());
    let mut ends = prompt_ends.iter().copied();
    let mut prompt_rows = 0;
    let mut read_by_owner = Vec::new();
    for (r, req) in active.iter_mut().enumerate() {
        if !reads_prompt(req, sitting) {
            continue;
        }
        let end = ends.next().expect("a decision per prompt");
        let read = end.map_or(0, |end| end - req.read());
        read_by_owner.push((req.owner, read));
        waiting.charge(req.owner, req.tier, read);
        let Some(end) = end else {
            req.prompt_waits = req.prompt_waits.saturating_add(1);
            continue;
        };
        req.prompt_waits = 0;
        prompt_rows += read;
        req.set_read(end);
        if !req.is_prefilling() {
            // A prompt read to its end has its first token's logits at its last row.
            prompt_done.push((r, prompt_rows - 1));
            if req.choices.len() > 1 {
                spreading.push(r);
            }
        }
    }
    drop(decided);
    deficits.settle(&read_by_owner, quantum);
    for row in decision.plan.prompt.iter().chain(&decision.plan.decode) {
        kv.record(row.seq, row.pos as usize, row.token);
    }
    PlannedStep { decision, decoding, prompt_done, prompt_rows, spreading }
}
