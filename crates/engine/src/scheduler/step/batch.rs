//! The step's batch: the running requests offer their tokens and drafts (`gather`), the pure
//! planner decides the rows (`plan`), `commit` applies the decision to the requests and the KV
//! mirror, and the rows go into llama.cpp's batch in the layout's order.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use crate::kv::seq_id::SeqId;
use crate::kv::ubatches::ubatches;
use crate::scheduler::step::gather::{decodes, prompt_quantum, reads_prompt, step_inputs};
use crate::scheduler::step::plan::rows::{Row, StepPlan};
use crate::scheduler::step::plan::{self, StepDecision};
use crate::scheduler::Scheduler;
use crate::speculation::Chain;

impl Scheduler {
    /// Plans the step (`plan`) and writes it into the batch: the running requests offer
    /// their tokens, drafts and prompt chunks ([`Self::offer_drafts`], [`step_inputs`]),
    /// the planner decides, and the decision is committed to the requests and the KV mirror.
    /// Returns what it wrote for the stages after the decode, or `None` when there is nothing to
    /// decode.
    ///
    /// With a KV stream per sequence, rows go in by ascending sequence (one ubatch per run of
    /// consecutive sequences: `kv_layout`). In a unified cache the prompt chunks come first and
    /// the decoding rows last: ggml's CPU flash attention computes batches of 64+ rows in tiles
    /// of 64 query rows and skips a tile of KV cells only when every row of the query tile masks
    /// it. Decoding rows of different sequences in one query tile keep alive every KV tile any of
    /// them sees; put after the prompt, they share at most one tile with it, and the prompt's own
    /// tiles skip the other sequences' cells.
    pub(in crate::scheduler) fn fill_batch(&mut self, ctx: &mut LlamaContext<'_>) -> Option<BatchRows> {
        self.sit_out_batch_lines();
        let mut offers = self.offer_drafts(ctx);
        let inputs = step_inputs(&mut self.active, &self.cfg, &self.prompt_deficits, &mut offers);
        let decision = plan::plan_step(inputs, &self.step_cost, &mut self.acceptance);
        let (plan, Committed { decoding, prompt_done, prompt_rows, spreading }) = self.commit(decision);
        let isolated: Vec<SeqId> =
            self.active.iter().filter(|r| r.isolated).flat_map(|r| r.choices.iter().map(|c| c.seq_id)).collect();
        let (rows, at) = plan.ordered(self.cfg.layout, &isolated);
        write_batch(&mut self.batch, &rows);
        let seqs: Vec<i32> = rows.iter().map(|r| r.seq.raw()).collect();
        let ubatches = ubatches(self.cfg.layout, &seqs, self.cfg.batch_size as usize);
        // Each choice's rows, by sequence: decoding rows were numbered among themselves, and
        // every choice of a prompt read to its end samples its first token at the prompt's last.
        let mut choices: Vec<Option<ChoiceRows>> =
            std::iter::repeat_with(|| None).take(self.cfg.parallel as usize).collect();
        let first_decode_row = plan.prompt.len();
        for (seq, row, fed_pos, drafts) in decoding {
            let row = crate::units::llama_pos(at[first_decode_row + row]);
            choices[seq.index()] = Some(ChoiceRows { row, fed_pos, drafts });
        }
        for (r, row) in prompt_done {
            let req = &self.active[r];
            let fed_pos = crate::units::llama_pos(req.prompt.len() - 1);
            for c in &req.choices {
                let row = crate::units::llama_pos(at[row]);
                choices[c.seq_id.index()] = Some(ChoiceRows { row, fed_pos, drafts: Chain::default() });
            }
        }
        (!rows.is_empty()).then_some(BatchRows { rows: rows.len(), prompt_rows, ubatches, spreading, choices })
    }

    /// Applies the planner's decision: each decoding choice feeds its token and drafts (their
    /// rows numbered among the decoding rows until the batch is ordered), each prompt is
    /// read to its chunk's end (its first choice's sequence; the others get a copy once it is
    /// read: `spread_prompts`), and the KV mirror records every row.
    /// Returns the step's rows and what reading the prompts did.
    fn commit(&mut self, decision: StepDecision) -> (StepPlan, Committed) {
        let StepDecision { plan, token_rows, drafts, prompt_ends } = decision;
        let mut decided = token_rows.into_iter().zip(drafts);
        let mut decoding = Vec::new();
        for req in self.active.iter_mut().filter(|r| decodes(r)) {
            let mut rows = 0;
            for c in req.choices.iter_mut().filter(|c| c.ready().is_some()) {
                let (row, chain) = decided.next().expect("a decision per decoding choice");
                c.take_ready();
                rows += 1 + chain.tokens.len();
                decoding.push((c.seq_id, row, c.pos, chain));
            }
            self.waiting.charge(req.owner, req.tier, rows);
        }
        let (mut prompt_done, mut spreading) = (Vec::new(), Vec::new());
        let mut ends = prompt_ends.into_iter();
        let mut prompt_rows = 0;
        let mut read_by_owner = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            if !reads_prompt(req) {
                continue;
            }
            let end = ends.next().expect("a decision per prompt");
            let read = end.map_or(0, |end| end - req.read());
            read_by_owner.push((req.owner, read));
            self.waiting.charge(req.owner, req.tier, read);
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
        self.prompt_deficits.settle(&read_by_owner, prompt_quantum(&self.cfg));
        for row in plan.prompt.iter().chain(&plan.decode) {
            self.kv.record(row.seq, row.pos as usize, row.token);
        }
        (plan, Committed { decoding, prompt_done, prompt_rows, spreading })
    }
}

/// What `fill_batch` put into llama.cpp's batch, for the stages after the decode.
pub(crate) struct BatchRows {
    /// Rows in the batch.
    pub rows: usize,
    /// Prompt rows among them: a step with any is no measure of decode cost (`StepCost`).
    pub prompt_rows: usize,
    /// Ubatches llama.cpp cuts the batch into (see `kv::ubatches`).
    pub ubatches: usize,
    /// Requests (index in `active`) with several choices whose prompt this step reads to its
    /// end: the other choices get a copy once it is decoded (`spread_prompts`).
    pub spreading: Vec<usize>,
    /// Each sampled choice's rows, by sequence (`SeqId::index`): what `verify` verifies.
    pub choices: Vec<Option<ChoiceRows>>,
}

/// One choice's rows in the batch.
pub(crate) struct ChoiceRows {
    /// Where its first logits are: the row of the token it fed (or of its prompt's last); the
    /// drafts' logits follow at the next rows.
    pub row: i32,
    /// The position of the token fed at `row`; the drafts follow it.
    pub fed_pos: i32,
    /// The drafts fed after it, to verify.
    pub drafts: Chain,
}

/// What committing a decision did to the prompts being read.
struct Committed {
    /// Each decoding choice's sequence, its row among the decoding rows, the position of the
    /// token it feeds, and its drafts.
    decoding: Vec<(SeqId, usize, i32, Chain)>,
    /// Each prompt read to its end: (request, its last row among the prompt rows).
    prompt_done: Vec<(usize, usize)>,
    prompt_rows: usize,
    spreading: Vec<usize>,
}

/// Fills `batch` with `rows`, in order.
fn write_batch(batch: &mut LlamaBatch<'_>, rows: &[Row]) {
    batch.clear();
    for r in rows {
        batch.add(LlamaToken(r.token), r.pos, &[r.seq.raw()], r.logits).expect("batch sized for the budget");
    }
}
