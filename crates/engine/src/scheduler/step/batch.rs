//! The step's batch: a [`PlannedStep`]'s rows go into llama.cpp's batch in the KV layout's
//! order, and each sampled choice learns where its logits will be ([`BatchRows`]), for the
//! stages after the decode.

use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use crate::kv::seq_id::SeqId;
use crate::kv::ubatches::ubatches_with;
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::step::buffers::{emptied, StepBuffers};
use crate::scheduler::step::commit::PlannedStep;
use crate::scheduler::step::plan::rows::Row;
use crate::scheduler::SchedulerConfig;
use crate::speculation::Chain;

/// Writes the planned rows into `batch`. Returns what it wrote for the stages after the decode,
/// or `None` when there is nothing to decode.
///
/// With a KV stream per sequence, rows go in by ascending sequence (one ubatch per run of
/// consecutive sequences: `kv_layout`). In a unified cache the prompt chunks come first and
/// the decoding rows last: ggml's CPU flash attention computes batches of 64+ rows in tiles
/// of 64 query rows and skips a tile of KV cells only when every row of the query tile masks
/// it. Decoding rows of different sequences in one query tile keep alive every KV tile any of
/// them sees; put after the prompt, they share at most one tile with it, and the prompt's own
/// tiles skip the other sequences' cells.
/// Its vectors come from `buffers`, and the plan's and the committed choices' go back there.
pub(crate) fn write(
    batch: &mut LlamaBatch<'_>,
    planned: PlannedStep,
    active: &[ActiveRequest],
    cfg: &SchedulerConfig,
    buffers: &mut StepBuffers,
) -> Option<BatchRows> {
    let PlannedStep { decision, mut decoding, prompt_done, prompt_rows, spreading } = planned;
    let isolated: Vec<SeqId> =
        active.iter().filter(|r| r.isolated).flat_map(|r| r.choices.iter().map(|c| c.seq_id)).collect();
    let plan = &decision.plan;
    let order = &mut buffers.order;
    plan.order_into(cfg.layout, &isolated, order);
    write_batch(batch, &order.rows);
    // `order.seqs` is in planned order; the count wants batch order.
    order.seqs.clear();
    order.seqs.extend(order.rows.iter().map(|r| r.seq.raw()));
    let ubatches = ubatches_with(cfg.layout, &order.seqs, cfg.batch_size as usize, &mut buffers.ubatches);
    // Each choice's rows, by sequence: decoding rows were numbered among themselves, and
    // every choice of a prompt read to its end samples its first token at the prompt's last.
    let mut choices = emptied(&mut buffers.choices);
    choices.resize_with(cfg.parallel as usize, || None);
    let (at, first_decode_row) = (&order.at, plan.prompt.len());
    for (seq, row, fed_pos, drafts) in decoding.drain(..) {
        let row = crate::units::llama_pos(at[first_decode_row + row]);
        choices[seq.index()] = Some(ChoiceRows { row, fed_pos, drafts });
    }
    for (r, row) in prompt_done {
        let req = &active[r];
        let fed_pos = crate::units::llama_pos(req.prompt.len() - 1);
        for c in &req.choices {
            let row = crate::units::llama_pos(at[row]);
            choices[c.seq_id.index()] = Some(ChoiceRows { row, fed_pos, drafts: Chain::default() });
        }
    }
    let rows = order.rows.len();
    buffers.decision = decision;
    buffers.committed = decoding;
    if rows == 0 {
        buffers.choices = choices;
        return None;
    }
    Some(BatchRows { rows, prompt_rows, ubatches, spreading, choices })
}

/// What `write` put into llama.cpp's batch, for the stages after the decode.
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

/// Fills `batch` with `rows`, in order.
fn write_batch(batch: &mut LlamaBatch<'_>, rows: &[Row]) {
    batch.clear();
    for r in rows {
        batch.add(LlamaToken(r.token), r.pos, &[r.seq.raw()], r.logits).expect("batch sized for the budget");
    }
}
