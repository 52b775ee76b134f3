//! Taking waiting requests into free sequences: the cached prefix each reuses (from its slot,
//! another slot or host memory), choices sharing one prompt, idle sequences offloaded to make
//! room, and images evaluated into the KV cache.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;

use crate::error::EngineError;
use crate::kv::cache::KvCache;
use crate::kv::seq_id::SeqId;
use crate::kv::slots::common_prefix;
use crate::request::{Event, Outcome, Usage};
use crate::scheduler::active::ActiveRequest;
use crate::scheduler::device_sampling::ChainKey;
use crate::speculation::Speculate;
use crate::telemetry;

use super::{share_waits, Scheduler};

impl Scheduler {
    /// Starts waiting jobs on free sequences, in the order `admission` picks.
    pub(super) fn admit(&mut self, ctx: &mut LlamaContext<'_>) {
        while let Some(job) = self.waiting.pop(self.free_seqs.len()) {
            let n = job.request.n as usize;
            let fairness_key = job.request.fairness_key;
            let events = job.events.clone();
            #[cfg(test)]
            if let Some(log) = &self.cfg.admission_log {
                log.lock().unwrap().push(fairness_key);
            }
            self.queued.leave(fairness_key);
            let (scope, prompt) = (job.request.cache_scope, &job.request.prompt.tokens);
            // The first choice takes the idle slot already holding most of the prompt (under its
            // scope); the others take the least recently used ones.
            let mut seqs = Vec::with_capacity(n);
            let (first, in_place) =
                self.kv.slots().pick_free(&self.free_seqs, scope, prompt).expect("free slot checked");
            seqs.push(self.free_seqs.swap_remove(first));
            while seqs.len() < n {
                let (i, _) = self.kv.slots().pick_free(&self.free_seqs, scope, &[]).expect("free slot checked");
                seqs.push(self.free_seqs.swap_remove(i));
            }
            // Compiling the request's grammar runs a third-party library on client input: a
            // panic there ends this request (its channels close, unanswered: the server reports
            // an error and bills nothing), not the engine.
            let (model, ctx_size, mut speculation) = (&self.model, self.cfg.ctx_size, self.cfg.speculation);
            // Greedy and seeded requests alike: the same request, the same output.
            let sampling = &job.request.sampling;
            let isolated = self.cfg.deterministic_greedy && (sampling.temperature <= 0.0 || sampling.seed.is_some());
            if isolated {
                speculation.mode = Speculate::Off;
            }
            // Sequences busy with this request included: above the limit the host samples.
            let busy = self.cfg.parallel as usize - self.free_seqs.len();
            let on_device = self
                .device
                .as_ref()
                .filter(|_| busy <= self.cfg.device_sampling_max_streams)
                .and_then(|_| ChainKey::for_request(&job.request.sampling, job.request.needs_host_sampling()));
            if on_device.is_some() {
                // A sequence sampled on the device gets one output per step (llama-cpp-2 leaves
                // llama.cpp's `n_outputs_max_per_seq` at 1): no drafts to verify.
                speculation.mode = Speculate::Off;
            }
            let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
                ActiveRequest::new(job, seqs.clone(), model, ctx_size, speculation)
            }));
            let mut req = match started {
                Ok(Ok(mut req)) => {
                    req.isolated = isolated;
                    req
                }
                Ok(Err(rejected)) => {
                    let (job, why) = *rejected;
                    self.free_seqs.extend(seqs);
                    self.waiting.finished(fairness_key, n);
                    let why = format!("the response format cannot be enforced: {why}");
                    let _ = job.events.send(Event::Error(EngineError::Rejected(why)));
                    let _ = job.usage.send(Usage { outcome: Outcome::Error, ..Usage::default() });
                    continue;
                }
                Err(payload) => {
                    let why = crate::error::panic_message(payload.as_ref());
                    tracing::error!(reason = %why, "a request panicked at admission; ending it alone");
                    let _ = events.send(Event::Error(EngineError::RequestFailed(why)));
                    self.free_seqs.extend(seqs);
                    self.waiting.finished(fairness_key, n);
                    continue;
                }
            };
            if let Some(device) = self.device.as_mut() {
                for c in &mut req.choices {
                    c.on_device = device.assign(c.seq_id, on_device);
                }
            }
            let keep = req.whole_images(in_place.min(req.reusable_len()));
            for (i, c) in req.choices.iter().enumerate() {
                let keep = if i == 0 { keep } else { 0 };
                // What the slot held beyond the part reused goes to host memory first.
                self.kv.take(ctx, c.seq_id, req.scope, keep);
            }
            req.prefilled = keep;
            // A longer prefix elsewhere: in another slot, or being prefilled right now by a
            // request admitted earlier (a burst sharing one system prompt computes it once).
            let own = req.seq_ids();
            let mut best = self.kv.slots().best_source(req.scope, &req.prompt, &own);
            for other in self.active.iter().filter(|r| r.is_prefilling() && r.scope == req.scope) {
                let len = common_prefix(&other.prompt, &req.prompt);
                if best.is_none_or(|(_, l)| len > l) {
                    best = Some((other.choices[0].seq_id, len));
                }
            }
            // Host memory may hold more of it than any sequence (see `host_cache`).
            let resident = best.map_or(keep, |(_, len)| len.min(req.reusable_len()).max(keep));
            let usable = &req.prompt[..req.reusable_len()];
            if let Some(len) = self.kv.restore(ctx, own[0], req.scope, usable, resident) {
                share_prefix(&mut self.kv, ctx, &mut req, own[0], len);
                self.active.push(req);
                continue;
            }
            match best {
                Some((src, len)) if len.min(req.reusable_len()) > keep => req.share = Some((src, len)),
                _ => share_prefix(&mut self.kv, ctx, &mut req, own[0], keep),
            }
            self.active.push(req);
        }
    }

    /// Requests waiting on a prefix from another sequence take it once it is computed, or as
    /// much of it as exists once its computation stopped (its request finished or was cut).
    /// A request waits only on a chain of waits that ends in a prompt being read
    /// (`share_waits`), so no wait lasts forever.
    pub(super) fn resolve_shares(&mut self, ctx: &mut LlamaContext<'_>) {
        let slots = self.kv.slots();
        let waiting_on: Vec<Option<usize>> = self
            .active
            .iter()
            .map(|req| {
                let (src, want) = req.share?;
                // The source was picked under the request's scope; should the slot have been
                // taken by another scope since, it has nothing for this request.
                if slots.scope(src) != req.scope || slots.tokens(src).len() >= want {
                    return None;
                }
                self.active.iter().position(|r| r.is_prefilling() && r.choices[0].seq_id == src)
            })
            .collect();
        let keep_waiting = share_waits::waits_that_end(&waiting_on);
        for (req, keep_waiting) in self.active.iter_mut().zip(keep_waiting) {
            let Some((src, _)) = req.share else { continue };
            if keep_waiting {
                continue;
            }
            let same_scope = self.kv.slots().scope(src) == req.scope;
            let have = if same_scope { self.kv.slots().tokens(src) } else { &[] };
            let len = req.whole_images(common_prefix(have, &req.prompt).min(req.reusable_len()));
            let len = len.max(req.prefilled);
            let from = if len > req.prefilled { src } else { req.choices[0].seq_id };
            share_prefix(&mut self.kv, ctx, req, from, len);
        }
    }

    /// Idle sequences still holding KV entries move them to host memory before the next decode,
    /// unless a request waits to copy from them. A request admitted in the same step has already
    /// taken the one it continues in place.
    pub(super) fn offload_idle(&mut self, ctx: &mut LlamaContext<'_>) {
        if !self.kv.host_enabled() {
            return;
        }
        for seq in self.free_seqs.clone() {
            let awaited = self.active.iter().any(|r| r.share.is_some_and(|(src, _)| src == seq));
            if !awaited && !self.kv.slots().tokens(seq).is_empty() {
                self.kv.offload(ctx, seq);
            }
        }
    }

    /// Evaluates the next image of one prefilling request: the vision encoder runs, then its
    /// embeddings are decoded into the request's first sequence (the others get the whole
    /// prompt once it is read: `spread_prompts`).
    /// One image per step, so running streams wait for at most one encode. A failure ends that
    /// request alone. Returns whether an image was evaluated (or failed): a step of progress
    /// even when the batch is empty.
    pub(super) fn evaluate_image(&mut self, ctx: &mut LlamaContext<'_>) -> bool {
        let Some(vision) = self.model.vision.as_ref() else { return false };
        let Some(i) = self.active.iter().position(|r| r.share.is_none() && r.image_at(r.prefilled).is_some()) else {
            return false;
        };
        let req = &mut self.active[i];
        let image = req.image_at(req.prefilled).expect("found above").clone();
        let seq = req.choices[0].seq_id;
        let (start, end) = (image.start, image.start + image.len);
        let started = Instant::now();
        let turn = self.cfg.decode_turns.as_ref().map(|t| t.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let evaluated = vision.evaluate(ctx, &image, seq.raw(), self.cfg.batch_size as i32);
        drop(turn);
        match evaluated {
            Ok(()) => {
                telemetry::image_evaluated(image.len, started.elapsed());
                for pos in start..end {
                    self.kv.record(seq, pos, req.prompt[pos]);
                }
                req.prefilled = end;
            }
            Err(e) => {
                tracing::error!(error = %e, "an image could not be evaluated");
                self.kv.cut(ctx, seq, start);
                let req = self.active.swap_remove(i);
                self.release(&req);
                let usage = req.complete(Some(EngineError::Decode(format!("the image could not be encoded: {e}"))));
                self.totals.request_done(&usage);
            }
        }
        true
    }
}

/// Copies the first `len` cached tokens of `src` into the request's first sequence (fewer if
/// `len` would cut an image: see `ActiveRequest::whole_images`; none if the copy fails). The
/// other choices get the whole prompt once it is read (`spread_prompts`).
fn share_prefix(kv: &mut KvCache, ctx: &mut LlamaContext<'_>, req: &mut ActiveRequest, src: SeqId, len: usize) {
    let mut len = req.whole_images(len);
    let first = req.choices[0].seq_id;
    if first == src {
        // Its own sequence (a restore from host memory) keeps nothing past the prefix.
        kv.cut(ctx, src, len);
    } else if let Err(e) = kv.share(ctx, src, &[first], len) {
        tracing::warn!(error = %e, src = %src, dst = %first, len, "could not copy a shared prefix; computing it instead");
        len = 0;
    }
    req.prefilled = len;
    req.usage.cached_tokens = crate::units::count_u32(len);
    req.share = None;
    req.announce_cached();
}
