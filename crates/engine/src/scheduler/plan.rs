//! Planning one step: which rows (each decoding choice's token and drafts, chunks of pending
//! prompts) go into the batch under the step's token budget, and in which order.

use std::panic::AssertUnwindSafe;

use llama_cpp_2::context::LlamaContext;

use crate::error::EngineError;
use crate::faults::FaultPoint;
use crate::speculation::{AcceptanceKind, Lookup, Speculate, MAX_DRAFTING_STREAMS};

use crate::kv::seq_id::SeqId;

use super::step_plan::{prompt_chunk_end, write_batch, Budget, PendingPrompt, RowKind};
use super::{deterministic, Scheduler};

impl Scheduler {
    /// Decoding tokens are planned first (one per running choice, so streams never stall, plus
    /// any draft tokens to verify after it), then prompt chunks take what is left of the batch
    /// budget. Returns false when there is nothing to decode.
    ///
    /// With a KV stream per sequence, rows go in by ascending sequence (one ubatch per run of
    /// consecutive sequences: `kv_layout`). In a unified cache the prompt chunks come first and
    /// the decoding rows last: ggml's CPU flash attention computes batches of 64+ rows in tiles
    /// of 64 query rows and skips a tile of KV cells only when every row of the query tile masks
    /// it. Decoding rows of different sequences in one query tile keep alive every KV tile any of
    /// them sees; put after the prompt, they share at most one tile with it, and the prompt's own
    /// tiles skip the other sequences' cells.
    pub(super) fn fill_batch(&mut self, ctx: &mut LlamaContext<'_>) -> bool {
        self.plan.clear();
        self.batch_prompt_tokens = 0;
        self.spreading.clear();
        let decoding: usize = self.active.iter().flat_map(|r| &r.choices).filter(|c| c.next_token.is_some()).count();
        // The fixed prompt chunks of isolated requests are held back from drafts.
        let chunk = deterministic::chunk_size(self.cfg.batch_size, self.cfg.parallel);
        let reserved: usize = self
            .active
            .iter()
            .filter(|r| r.isolated && r.is_prefilling() && r.share.is_none())
            .map(|r| deterministic::chunk_end(r.prefilled, chunk, r.text_end(r.prefilled)) - r.prefilled)
            .sum();
        let mut budget =
            Budget::new(self.cfg.batch_size as usize, decoding, reserved, decoding <= MAX_DRAFTING_STREAMS);
        let ctx_size = self.cfg.ctx_size as i32;
        let weigh_drafts = self.cfg.speculation.mode == Speculate::Auto;
        // Positions this step computes logits for so far, counting every decoding choice's token.
        let mut outputs = decoding;
        // Planning a request's drafts runs its drafter (and grammar) on its own output: a panic
        // there ends that request alone, its rows taken back out of the plan.
        let mut panicked = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            let before = (self.plan.decode.len(), budget, outputs);
            let planned = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let (max_tokens, isolated) = (req.max_tokens, req.isolated);
                for c in &mut req.choices {
                    let Some(token) = c.next_token.take() else { continue };
                    // An index into the decoding rows until the batch is ordered.
                    let row = self.plan.push_decode(token, c.pos, c.seq_id, RowKind::Token);
                    c.batch_idx = Some(crate::units::llama_pos(row));
                    self.kv.record(c.seq_id, c.pos as usize, token);
                    c.pos += 1;
                    budget.take_token();
                    req.fault.check(FaultPoint::Drafting, req.usage.completion_tokens);
                    // A draft longer than the tokens the choice may still produce, or reaching
                    // past its context, could never be used: verifying k drafts produces up to
                    // k + 1 tokens, and the last draft must sit inside the context.
                    let produce_left = max_tokens.saturating_sub(c.generated) as usize;
                    let room = (ctx_size - c.pos).max(0) as usize;
                    let limit = if isolated { 0 } else { produce_left.saturating_sub(1).min(room) };
                    let (forced_room, lookup_room) = budget.draft_room(limit);
                    let mut chain = c.drafter.chain(forced_room, lookup_room, self.shared.of(c.drafter.family()));
                    let forced = chain.forced_prefix();
                    if weigh_drafts && chain.tokens.len() > forced {
                        let acceptance = &mut self.acceptance;
                        let chance =
                            |l: &Lookup| acceptance[AcceptanceKind::of(l.source, c.constrained)].chance(l.matched);
                        let k = self
                            .step_cost
                            .best_draft(outputs, forced, chain.tokens.len(), |k| chain.expected_tokens(k, chance));
                        if let Some(first) = chain.lookups.first().filter(|l| l.start >= k) {
                            acceptance[AcceptanceKind::of(first.source, c.constrained)].declined(first.matched);
                        }
                        chain.truncate(k);
                    }
                    c.drafts = chain;
                    outputs += c.drafts.tokens.len();
                    for &draft in &c.drafts.tokens {
                        self.plan.push_decode(draft, c.pos, c.seq_id, RowKind::Draft);
                        self.kv.record(c.seq_id, c.pos as usize, draft);
                        c.pos += 1;
                    }
                    let fed = c.drafts.tokens.len();
                    budget.take_drafts(fed, c.drafts.forced_within(fed));
                }
            }));
            if let Err(payload) = planned {
                let rows;
                (rows, budget, outputs) = before;
                self.plan.decode.truncate(rows);
                panicked.push((r, crate::error::panic_message(payload.as_ref())));
            }
        }
        self.end_panicked(ctx, panicked);
        let mut prompt_done = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            if budget.left() == 0 {
                break;
            }
            if !req.is_prefilling() || req.share.is_some() {
                continue;
            }
            let pending = PendingPrompt {
                prefilled: req.prefilled,
                text_end: req.text_end(req.prefilled),
                isolated: req.isolated,
            };
            let Some(end) = prompt_chunk_end(pending, budget.left(), chunk) else { continue };
            // The prompt goes into the first choice's sequence; the others get a copy once it
            // is read (`spread_prompts`).
            let seq = req.choices[0].seq_id;
            for pos in req.prefilled..end {
                let last = pos + 1 == req.prompt.len();
                self.plan.push_prompt(req.prompt[pos], crate::units::llama_pos(pos), seq, last);
                self.kv.record(seq, pos, req.prompt[pos]);
            }
            budget.take_prompt(end - req.prefilled);
            self.batch_prompt_tokens += end - req.prefilled;
            req.prefilled = end;
            if !req.is_prefilling() {
                prompt_done.push((r, self.plan.prompt.len() - 1));
                if req.choices.len() > 1 {
                    self.spreading.push(r);
                }
            }
        }
        let isolated: Vec<SeqId> =
            self.active.iter().filter(|r| r.isolated).flat_map(|r| r.choices.iter().map(|c| c.seq_id)).collect();
        let (rows, at) = self.plan.ordered(self.cfg.layout, &isolated);
        write_batch(&mut self.batch, &rows);
        let first_decode_row = self.plan.prompt.len();
        for c in self.active.iter_mut().flat_map(|r| &mut r.choices) {
            if let Some(row) = &mut c.batch_idx {
                *row = crate::units::llama_pos(at[first_decode_row + *row as usize]);
            }
        }
        // A prompt read to its end has its first token's logits at its last row.
        for (r, idx) in prompt_done {
            let req = &mut self.active[r];
            for c in &mut req.choices {
                c.batch_idx = Some(crate::units::llama_pos(at[idx]));
                c.pos = crate::units::llama_pos(req.prompt.len());
            }
        }
        self.batch.n_tokens() > 0
    }

    /// Copies each prompt read to its end this step from the first choice's sequence into the
    /// request's other choices' (see `kv_layout`). A request whose copy fails ends with an error
    /// (its prompt is billed, as for any decode failure).
    pub(super) fn spread_prompts(&mut self, ctx: &mut LlamaContext<'_>) {
        let mut failed = Vec::new();
        for &r in &self.spreading {
            let req = &self.active[r];
            let seqs = req.seq_ids();
            let len = req.prompt.len();
            if let Err(e) = self.kv.share(ctx, seqs[0], &seqs[1..], len) {
                failed.push((r, e));
            }
        }
        self.spreading.clear();
        // Highest index first, so each `swap_remove` leaves the lower ones in place.
        failed.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
        for (r, e) in failed {
            tracing::error!(error = %e, "a prompt could not be copied to the request's other choices");
            let req = self.active.swap_remove(r);
            self.release(&req);
            let why = format!("the prompt could not be copied to the other choices: {e}");
            let usage = req.complete(Some(EngineError::Decode(why)));
            self.totals.request_done(&usage);
        }
    }
}
