//! After a decode: sampling every choice at the rows it was given, walking its drafts and keeping
//! those its sampler agrees with, and learning how often each kind of draft is accepted.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;

use crate::faults::FaultPoint;
use crate::kv::cache::KvCache;
use crate::model::LoadedModel;
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::sample::first_tokens::{sample_first_tokens, FirstTokens};
use crate::scheduler::step::batch::ChoiceRows;
use crate::speculation::{AcceptanceByKind, AcceptanceKind, SpeculationStats};
use crate::EngineError;

/// What sampling reads and learns besides the requests and their rows: the scheduler's fields,
/// borrowed apart.
pub(crate) struct Verifying<'a> {
    pub model: &'a LoadedModel,
    pub ctx_size: i32,
    pub kv: &'a mut KvCache,
    pub acceptance: &'a mut AcceptanceByKind,
    pub spec_stats: &'a SpeculationStats,
    /// The last step's first tokens, their vectors to fill again.
    pub first_tokens: &'a mut FirstTokens,
}

/// What sampling a step found: the requests that cannot go on, which the step then ends alone.
pub(crate) struct Verdicts {
    /// `(index in active, the error it ends with)`: a panic while it was sampled, a grammar that
    /// failed.
    pub failed: Vec<(usize, EngineError)>,
    /// The time the first positions took to sample (`gantry_step_part_*`, `pick`).
    pub pick: Duration,
}

/// Samples every choice that had logits computed. A choice that fed draft tokens walks them:
/// at each position it samples as usual and goes on only while the sampled token is the
/// draft token already fed after it (see `speculation`). The first token that differs, or a
/// bonus token after a fully accepted draft, is fed next step; the rejected draft tokens
/// leave the KV cache and the slot bookkeeping, and were never billed nor streamed.
///
/// A panic while one request is sampled (its sampler or grammar, stop strings, tool-call
/// watching, producing its text) fails that request alone: see `end_alone`.
pub(crate) fn sample(
    ctx: &mut LlamaContext<'_>,
    active: &mut [ActiveRequest],
    rows: &mut [Option<ChoiceRows>],
    with: &mut Verifying<'_>,
) -> Verdicts {
    let mut failed = Vec::new();
    let started = Instant::now();
    let last = std::mem::take(with.first_tokens);
    let first = sample_first_tokens(active, rows, ctx, last);
    let pick = started.elapsed();
    for (r, req) in active.iter_mut().enumerate() {
        let sampled = match first.panicked.iter().find(|&&(p, _)| p == r) {
            None => std::panic::catch_unwind(AssertUnwindSafe(|| verify_request(req, &first.by_seq, rows, ctx, with)))
                .map_err(|payload| EngineError::RequestFailed(crate::error::panic_message(payload.as_ref()))),
            Some((_, why)) => Err(EngineError::RequestFailed(why.clone())),
        };
        match sampled {
            Ok(Ok(())) => {}
            Ok(Err(error)) | Err(error) => failed.push((r, error)),
        }
    }
    *with.first_tokens = first;
    Verdicts { failed, pick }
}

/// Walks `req`'s choices; `first` holds each one's token sampled at its first position, by
/// sequence.
/// Fails when a grammar could not say which tokens may come next: the token sampled then
/// is not produced.
fn verify_request(
    req: &mut ActiveRequest,
    first: &[Option<i32>],
    rows: &mut [Option<ChoiceRows>],
    ctx: &mut LlamaContext<'_>,
    with: &mut Verifying<'_>,
) -> Result<(), EngineError> {
    let (model, ctx_size) = (with.model, with.ctx_size);
    for i in 0..req.choices.len() {
        let Some(ChoiceRows { row: idx, fed_pos, drafts: chain }) = rows[req.choices[i].seq_id.index()].take() else {
            continue;
        };
        let drafts = &chain.tokens;
        let k = drafts.len();
        let mut accepted = 0;
        for j in 0..=k {
            let token = match (j, first[req.choices[i].seq_id.index()]) {
                (0, Some(token)) => token,
                _ if req.choices[i].on_device => {
                    crate::scheduler::sample::first_tokens::device_token(ctx, idx + crate::units::llama_pos(j))
                }
                _ => {
                    req.fault.check(FaultPoint::Sampling, req.usage.completion_tokens);
                    req.choices[i].sampler.sample(ctx.get_logits_ith(idx + crate::units::llama_pos(j)))
                }
            };
            if let Some(why) = req.choices[i].sampler.grammar_failed.take() {
                return Err(EngineError::GrammarFailed(why));
            }
            req.choices[i].pos = fed_pos + 1 + crate::units::llama_pos(j);
            if !req.produce(i, token, idx + crate::units::llama_pos(j), ctx, model, ctx_size) {
                break;
            }
            if drafts.get(j) == Some(&token) {
                accepted += 1;
                continue;
            }
            req.choices[i].feed(token);
            break;
        }
        if k > 0 && tracing::enabled!(tracing::Level::TRACE) {
            let text: Vec<_> = drafts.iter().map(|&t| String::from_utf8_lossy(&model.piece(t)).into_owned()).collect();
            let sources: Vec<_> = chain.lookups.iter().map(|l| (l.start, l.len, l.source)).collect();
            let (seq, forced) = (req.choices[i].seq_id, chain.forced_prefix());
            tracing::trace!(seq = %seq, drafts = ?text, accepted, forced, ?sources, "verified");
        }
        // Forced tokens after a rejected lookup were never verified: only those reached
        // count (and are taken, unless the choice ended first).
        let forced = chain.forced_within((accepted + 1).min(k));
        if forced > 0 {
            with.spec_stats.record_forced(forced, chain.forced_within(accepted));
        }
        // A run after the first rejected draft was never tested.
        for l in chain.lookups.iter().filter(|l| l.start <= accepted) {
            let taken = (accepted - l.start).min(l.len);
            with.acceptance[AcceptanceKind::of(l.source, req.choices[i].constrained)].verified(l.matched, l.len, taken);
            with.spec_stats.record(l.len, taken, l.source);
        }
        // The choice's position is where its next token goes: positions from there on
        // hold draft tokens that were not produced.
        let kept = req.choices[i].pos;
        if kept <= fed_pos + crate::units::llama_pos(k) {
            with.kv.cut(ctx, req.choices[i].seq_id, kept as usize);
        }
    }
    Ok(())
}
