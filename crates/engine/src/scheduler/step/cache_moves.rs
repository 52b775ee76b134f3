//! Moves between sequences around a step: prefixes copied from the sequence that holds or
//! computes them (`copy_awaited_prefixes`), idle sequences offloaded to host memory, and a prompt
//! read to its end copied into the request's other choices after the decode (`spread_prompts`).

use llama_cpp_2::context::LlamaContext;

use crate::error::EngineError;
use crate::kv::cache::KvCache;
use crate::kv::seq_id::SeqId;
use crate::kv::slots::common_prefix;
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::step::prefix_waits;
use crate::scheduler::Scheduler;

impl Scheduler {
    /// Copies each prompt read to its end this step from the first choice's sequence into the
    /// request's other choices' (see `kv_layout`). Returns the requests whose copy failed
    /// (`(index in active, error)`), which the step ends before sampling: their other choices
    /// hold no prompt (their prompt is billed, as for any decode failure).
    pub(in crate::scheduler) fn spread_prompts(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        spreading: &[usize],
    ) -> Vec<(usize, EngineError)> {
        let mut failed = Vec::new();
        for &r in spreading {
            let req = &self.active[r];
            let seqs = req.seq_ids();
            let len = req.prompt.len();
            if let Err(e) = self.kv.share(ctx, seqs[0], &seqs[1..], len) {
                let why = format!("the prompt could not be copied to the other choices: {e}");
                failed.push((r, EngineError::Decode(why)));
            }
        }
        failed
    }

    /// Requests waiting on a prefix from another sequence take it once it is computed, or as
    /// much of it as exists once its computation stopped (its request finished or was cut).
    /// A request waits only on a chain of waits that ends in a prompt being read
    /// (`prefix_waits`), so no wait lasts forever.
    pub(in crate::scheduler) fn copy_awaited_prefixes(&mut self, ctx: &mut LlamaContext<'_>) {
        if !self.active.iter().any(|r| r.awaited_prefix().is_some()) {
            return;
        }
        let slots = self.kv.slots();
        let waiting_on: Vec<Option<usize>> = self
            .active
            .iter()
            .map(|req| {
                let (src, want) = req.awaited_prefix()?;
                // The source was picked under the request's scope; should the slot have been
                // taken by another scope since, it has nothing for this request.
                if slots.scope(src) != req.scope || slots.tokens(src).len() >= want {
                    return None;
                }
                self.active.iter().position(|r| r.is_prefilling() && r.choices[0].seq_id == src)
            })
            .collect();
        let keep_waiting = prefix_waits::waits_that_end(&waiting_on);
        for (req, keep_waiting) in self.active.iter_mut().zip(keep_waiting) {
            let Some((src, _)) = req.awaited_prefix() else { continue };
            if keep_waiting {
                continue;
            }
            let same_scope = self.kv.slots().scope(src) == req.scope;
            let have = if same_scope { self.kv.slots().tokens(src) } else { &[] };
            let len = req.whole_images(common_prefix(have, &req.prompt).min(req.reusable_len()));
            let len = len.max(req.read());
            let from = if len > req.read() { src } else { req.choices[0].seq_id };
            copy_prefix(&mut self.kv, ctx, req, from, len);
        }
    }

    /// Idle sequences still holding KV entries move them to host memory before the next decode,
    /// unless a request waits to copy from them. A request admitted in the same step has already
    /// taken the one it continues in place.
    pub(in crate::scheduler) fn offload_idle(&mut self, ctx: &mut LlamaContext<'_>) {
        if !self.kv.host_enabled() {
            return;
        }
        for i in 0..self.free_seqs.len() {
            let seq = self.free_seqs[i];
            let awaited = self.active.iter().any(|r| r.awaited_prefix().is_some_and(|(src, _)| src == seq));
            if !awaited && !self.kv.slots().tokens(seq).is_empty() {
                self.kv.offload(ctx, seq);
            }
        }
    }
}

/// Copies the first `len` cached tokens of `src` into the request's first sequence (fewer if
/// `len` would cut an image: see `ActiveRequest::whole_images`; none if the copy fails). The
/// other choices get the whole prompt once it is read (`spread_prompts`).
pub(super) fn copy_prefix(
    kv: &mut KvCache,
    ctx: &mut LlamaContext<'_>,
    req: &mut ActiveRequest,
    src: SeqId,
    len: usize,
) {
    let mut len = req.whole_images(len);
    let first = req.choices[0].seq_id;
    if first == src {
        // Its own sequence (a restore from host memory) keeps nothing past the prefix.
        kv.cut(ctx, src, len);
    } else if let Err(e) = kv.share(ctx, src, &[first], len) {
        tracing::warn!(error = %e, src = %src, dst = %first, len, "could not copy a shared prefix; computing it instead");
        len = 0;
    }
    req.set_read(len);
    req.usage.cached_tokens = crate::units::count_u32(len);
    req.announce_cached();
}
