//! Planning one step: gathering what the running requests offer (each decoding choice's token and
//! drafts, chunks of pending prompts), the planner's decision (`planner`), committing it, and
//! writing the rows into the batch in the layout's order.

use std::panic::AssertUnwindSafe;

use llama_cpp_2::context::LlamaContext;

use crate::error::EngineError;
use crate::faults::FaultPoint;
use crate::kv::seq_id::SeqId;
use crate::kv::ubatches::ubatches;
use crate::speculation::Speculate;

use super::active::{ActiveRequest, Choice};
use super::planner::{self, DecodingChoice, PromptToRead, StepDecision, StepInputs};
use super::prompt_turns::PromptDeficits;
use super::step_plan::{write_batch, PendingPrompt};
use super::{deterministic, Scheduler, SchedulerConfig};

impl Scheduler {
    /// Plans the step (`planner`) and writes it into the batch: the running requests offer
    /// their tokens, drafts and prompt chunks ([`Self::offer_drafts`], [`step_inputs`]),
    /// the planner decides, and the decision is committed to the requests and the KV mirror.
    /// Returns false when there is nothing to decode.
    ///
    /// With a KV stream per sequence, rows go in by ascending sequence (one ubatch per run of
    /// consecutive sequences: `kv_layout`). In a unified cache the prompt chunks come first and
    /// the decoding rows last: ggml's CPU flash attention computes batches of 64+ rows in tiles
    /// of 64 query rows and skips a tile of KV cells only when every row of the query tile masks
    /// it. Decoding rows of different sequences in one query tile keep alive every KV tile any of
    /// them sees; put after the prompt, they share at most one tile with it, and the prompt's own
    /// tiles skip the other sequences' cells.
    pub(super) fn fill_batch(&mut self, ctx: &mut LlamaContext<'_>) -> bool {
        self.spreading.clear();
        self.offer_drafts(ctx);
        let inputs = step_inputs(&mut self.active, &self.cfg, &self.prompt_deficits);
        let decision = planner::plan_step(inputs, &self.step_cost, &mut self.acceptance);
        let prompt_done = self.commit(decision);
        let isolated: Vec<SeqId> =
            self.active.iter().filter(|r| r.isolated).flat_map(|r| r.choices.iter().map(|c| c.seq_id)).collect();
        let (rows, at) = self.plan.ordered(self.cfg.layout, &isolated);
        write_batch(&mut self.batch, &rows);
        let seqs: Vec<i32> = rows.iter().map(|r| r.seq.raw()).collect();
        self.batch_ubatches = ubatches(self.cfg.layout, &seqs, self.cfg.batch_size as usize);
        let first_decode_row = self.plan.prompt.len();
        for c in self.active.iter_mut().flat_map(|r| &mut r.choices) {
            if let Some(row) = &mut c.batch_idx {
                *row = crate::units::llama_pos(at[first_decode_row + *row as usize]);
            }
        }
        for (r, row) in prompt_done {
            let req = &mut self.active[r];
            for c in &mut req.choices {
                c.batch_idx = Some(crate::units::llama_pos(at[row]));
                c.pos = crate::units::llama_pos(req.prompt.len());
            }
        }
        self.batch.n_tokens() > 0
    }

    /// Asks each decoding choice's drafter for the drafts it could feed (into `Choice::drafts`,
    /// which the planner then cuts). A drafter runs its grammar on the choice's own output: a
    /// panic there ends that request alone.
    fn offer_drafts(&mut self, ctx: &mut LlamaContext<'_>) {
        let decoding = self.active.iter().flat_map(|r| &r.choices).filter(|c| c.next_token.is_some()).count();
        let lookups = planner::lookups_allowed(decoding);
        let ctx_size = self.cfg.ctx_size as i32;
        let mut panicked = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            let shared = &self.shared;
            let offered = std::panic::catch_unwind(AssertUnwindSafe(|| {
                for c in req.choices.iter_mut().filter(|c| c.next_token.is_some()) {
                    req.fault.check(FaultPoint::Drafting, req.usage.completion_tokens);
                    let limit = draft_limit(req.max_tokens, req.isolated, c, ctx_size);
                    c.drafts = c.drafter.chain(limit, if lookups { limit } else { 0 }, shared.of(c.drafter.family()));
                }
            }));
            if let Err(payload) = offered {
                panicked.push((r, crate::error::panic_message(payload.as_ref())));
            }
        }
        self.end_panicked(ctx, panicked);
    }

    /// Applies the planner's decision: each decoding choice feeds its token and drafts (its
    /// `batch_idx` an index among the decoding rows until the batch is ordered), each prompt is
    /// read to its chunk's end (its first choice's sequence; the others get a copy once it is
    /// read: `spread_prompts`), and the KV mirror records every row.
    /// Returns each prompt read to its end, as (request, its last row among the prompt rows).
    fn commit(&mut self, decision: StepDecision) -> Vec<(usize, usize)> {
        let StepDecision { plan, token_rows, drafts, prompt_ends } = decision;
        let mut decided = token_rows.into_iter().zip(drafts);
        for c in self.active.iter_mut().flat_map(|r| &mut r.choices).filter(|c| c.next_token.is_some()) {
            let (row, chain) = decided.next().expect("a decision per decoding choice");
            c.next_token = None;
            c.batch_idx = Some(crate::units::llama_pos(row));
            c.pos += crate::units::llama_pos(1 + chain.tokens.len());
            c.drafts = chain;
        }
        let mut prompt_done = Vec::new();
        self.batch_prompt_tokens = 0;
        let mut ends = prompt_ends.into_iter();
        let mut prompt_rows = 0;
        let mut read_by_key = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            if !reads_prompt(req) {
                continue;
            }
            let end = ends.next().expect("a decision per prompt");
            read_by_key.push((req.fairness_key, end.map_or(0, |end| end - req.prefilled)));
            let Some(end) = end else {
                req.prompt_waits = req.prompt_waits.saturating_add(1);
                continue;
            };
            req.prompt_waits = 0;
            prompt_rows += end - req.prefilled;
            self.batch_prompt_tokens += end - req.prefilled;
            req.prefilled = end;
            if !req.is_prefilling() {
                // A prompt read to its end has its first token's logits at its last row.
                prompt_done.push((r, prompt_rows - 1));
                if req.choices.len() > 1 {
                    self.spreading.push(r);
                }
            }
        }
        self.prompt_deficits.settle(read_by_key, prompt_quantum(&self.cfg));
        for row in plan.prompt.iter().chain(&plan.decode) {
            self.kv.record(row.seq, row.pos as usize, row.token);
        }
        self.plan = plan;
        prompt_done
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

/// Whether `req` reads its prompt this step, as far as the budget goes: still prefilling, and not
/// waiting to copy a prefix another sequence is computing. `step_inputs` and `commit` must agree.
fn reads_prompt(req: &ActiveRequest) -> bool {
    req.is_prefilling() && req.share.is_none()
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
) -> StepInputs<'a> {
    let ctx_size = cfg.ctx_size as i32;
    let chunk = deterministic::chunk_size(cfg.batch_size, cfg.parallel);
    // The fixed prompt chunks of isolated requests are held back from drafts.
    let reserved: usize = active
        .iter()
        .filter(|r| r.isolated && reads_prompt(r))
        .map(|r| deterministic::chunk_end(r.prefilled, chunk, r.text_end(r.prefilled)) - r.prefilled)
        .sum();
    let mut decoding = Vec::new();
    for req in active.iter_mut() {
        for c in req.choices.iter_mut() {
            let Some(token) = c.next_token else { continue };
            decoding.push(DecodingChoice {
                token,
                pos: c.pos,
                seq: c.seq_id,
                limit: draft_limit(req.max_tokens, req.isolated, c, ctx_size),
                offered: std::mem::take(&mut c.drafts),
                constrained: c.constrained,
            });
        }
    }
    let active: &'a [ActiveRequest] = active;
    let prompts = active
        .iter()
        .filter(|r| reads_prompt(r))
        .map(|r| PromptToRead {
            seq: r.choices[0].seq_id,
            prompt: &r.prompt,
            pending: PendingPrompt { prefilled: r.prefilled, text_end: r.text_end(r.prefilled), isolated: r.isolated },
            key: r.fairness_key,
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
