//! The step as a value: the rows one decode computes, typed, and the pure rules that decide them
//! (the token budget and what drafts may take of it, how far each pending prompt is read, the
//! order rows go into the batch for the KV layout). `gather.rs` asks the running requests for
//! their tokens and drafts under these rules; `batch.rs` copies the result into llama.cpp's
//! batch. Nothing here touches llama.cpp or a request, so all of it is unit-tested alone.

use crate::kv::layout::{self, KvLayout};
use crate::kv::seq_id::SeqId;

use crate::scheduler::step::deterministic;

/// What a row of the batch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowKind {
    /// A decoding choice's next token.
    Token,
    /// A draft token after it, to be verified.
    Draft,
    /// A prompt token; only a prompt's last one wants logits.
    Prompt,
}

/// One token of the batch: what is fed, where, and whether its logits are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    pub token: i32,
    pub pos: i32,
    pub seq: SeqId,
    pub logits: bool,
    pub kind: RowKind,
}

/// The rows of one step, in the order they were planned: decoding rows (each choice's token
/// and its drafts), then prompt chunks.
#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    pub decode: Vec<Row>,
    pub prompt: Vec<Row>,
}

impl StepPlan {
    /// A decoding row; its index among them (the choice's `batch_idx` until [`Self::ordered`]).
    pub(crate) fn push_decode(&mut self, token: i32, pos: i32, seq: SeqId, kind: RowKind) -> usize {
        self.decode.push(Row { token, pos, seq, logits: true, kind });
        self.decode.len() - 1
    }

    pub(crate) fn push_prompt(&mut self, token: i32, pos: i32, seq: SeqId, last: bool) {
        self.prompt.push(Row { token, pos, seq, logits: last, kind: RowKind::Prompt });
    }

    /// The rows in batch order, and where each planned row went: prompt row `i` is at
    /// `at[i]`, decoding row `j` at `at[prompt.len() + j]`. With a KV stream per sequence the rows
    /// are grouped by ascending sequence (llama.cpp makes one ubatch per run of consecutive
    /// sequences), `isolated` sequences each in a ubatch of their own (`deterministic`); in a
    /// unified cache prompt chunks come first and decoding rows last (see `batch::write`).
    #[cfg(test)]
    pub(crate) fn ordered(&self, layout: KvLayout, isolated: &[SeqId]) -> (Vec<Row>, Vec<usize>) {
        let mut order = RowOrder::default();
        self.order_into(layout, isolated, &mut order);
        (order.rows, order.at)
    }

    /// [`Self::ordered`] into `order.rows` and `order.at`, in vectors kept between steps.
    pub(crate) fn order_into(&self, layout: KvLayout, isolated: &[SeqId], order: &mut RowOrder) {
        // The ordering rules work on llama.cpp's numbers: a run is of ids that follow on by one.
        order.seqs.clear();
        order.seqs.extend(self.prompt.iter().chain(&self.decode).map(|r| r.seq.raw()));
        if isolated.is_empty() {
            layout::batch_order_into(layout, &order.seqs, &mut order.by_seq, &mut order.at);
        } else {
            let isolated: Vec<i32> = isolated.iter().map(|s| s.raw()).collect();
            order.at = deterministic::batch_order(layout, &order.seqs, |s| isolated.contains(&s));
        }
        order.rows.clear();
        order.rows.extend(self.prompt.iter().chain(&self.decode).copied());
        for (i, row) in self.prompt.iter().chain(&self.decode).enumerate() {
            order.rows[order.at[i]] = *row;
        }
    }
}

/// The batch's rows in order and the vectors ordering them (`StepPlan::order_into`), kept from
/// one step to the next (`StepBuffers`).
#[derive(Debug, Default)]
pub(crate) struct RowOrder {
    /// The rows in batch order.
    pub rows: Vec<Row>,
    /// Where each planned row went.
    pub at: Vec<usize>,
    /// Each planned row's sequence, as llama.cpp numbers it.
    pub seqs: Vec<i32>,
    by_seq: Vec<usize>,
}

/// The step's token budget. Every decoding choice gets its token first; drafts use what is left.
/// Forced drafts (jump-forward, always accepted) may use it at any load; lookup drafts only
/// while at most `MAX_DRAFTING_STREAMS` choices decode. Rows held for isolated prompt chunks are
/// kept from both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    left: usize,
    forced: usize,
    lookup: usize,
}

impl Budget {
    pub(crate) fn new(batch_size: usize, decoding: usize, reserved: usize, lookups_allowed: bool) -> Self {
        let forced = batch_size.saturating_sub(decoding).saturating_sub(reserved);
        Self { left: batch_size, forced, lookup: if lookups_allowed { forced } else { 0 } }
    }

    /// Rows still free in the batch.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// A decoding choice's token.
    pub(crate) fn take_token(&mut self) {
        self.left -= 1;
    }

    /// How many drafts a choice that could use `limit` may feed: forced ones, and lookups.
    pub(crate) fn draft_room(&self, limit: usize) -> (usize, usize) {
        (limit.min(self.forced), limit.min(self.lookup))
    }

    /// A choice fed `fed` drafts, the first `forced` of them forced.
    pub(crate) fn take_drafts(&mut self, fed: usize, forced: usize) {
        self.left -= fed;
        self.forced -= fed;
        self.lookup = self.lookup.saturating_sub(fed - forced);
    }

    /// Prompt rows.
    pub(crate) fn take_prompt(&mut self, rows: usize) {
        self.left -= rows;
    }
}

/// How far a pending prompt is read, given where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingPrompt {
    pub prefilled: usize,
    /// Where its text ends: the prompt's end, or the next image (which `evaluate_image` reads).
    pub text_end: usize,
    /// Read in fixed chunks, each whole in one step (`--deterministic-greedy`).
    pub isolated: bool,
}

impl PendingPrompt {
    /// Tokens left to read before its text ends.
    pub(crate) fn rest(&self) -> usize {
        self.text_end.saturating_sub(self.prefilled)
    }
}

/// Where this step's chunk of `p` ends with `left` rows free (`None`: no chunk this step).
/// Isolated prompts take a whole fixed chunk (`chunk` positions from a multiple of it) or none.
pub(crate) fn prompt_chunk_end(p: PendingPrompt, left: usize, chunk: usize) -> Option<usize> {
    let end = if p.isolated {
        let end = deterministic::chunk_end(p.prefilled, chunk, p.text_end);
        if end - p.prefilled > left {
            return None;
        }
        end
    } else {
        (p.prefilled + left).min(p.text_end)
    };
    (end > p.prefilled).then_some(end)
}

#[cfg(test)]
#[path = "rows_tests.rs"]
mod tests;
