//! Taking waiting requests into free sequences: the slots each takes, the cached prefix it
//! reuses in place or from host memory, or the longer prefix it will copy from another sequence
//! (`cache_moves`).

use std::panic::AssertUnwindSafe;

use llama_cpp_2::context::LlamaContext;

use crate::error::EngineError;
use crate::kv::slots::common_prefix;
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::sample::device::ChainKey;
use crate::speculation::Speculate;

use crate::scheduler::end::{Ending, Leaving, Unstarted};
use crate::scheduler::step::cache_moves::copy_prefix;
use crate::scheduler::{Job, Scheduler};

impl Scheduler {
    /// Ends preemptible requests (`ActiveRequest::is_preemptible`: batch lines, unstreamed
    /// `flex` ones) while a `default` or `priority` request waits for more sequences than are
    /// free and one would start with theirs: batch lines before `flex` requests (a person may be
    /// waiting for those), each the most recently started first, which loses the least work.
    /// Their owners run them again (`Ending::Preempted`), unbilled.
    pub(in crate::scheduler) fn preempt(&mut self, ctx: &mut LlamaContext<'_>) {
        while let Some(wanted) = self.waiting.standard_wants(self.free_seqs.len()) {
            let held: usize = self.active.iter().filter(|r| r.is_preemptible()).map(|r| r.choices.len()).sum();
            if self.free_seqs.len() + held < wanted {
                return;
            }
            let last = self.active.iter().rposition(ActiveRequest::is_batch_line);
            let Some(last) = last.or_else(|| self.active.iter().rposition(ActiveRequest::is_preemptible)) else {
                return;
            };
            let req = self.active.remove(last);
            self.end(ctx, req.into(), Ending::Preempted);
        }
    }

    /// Starts waiting jobs on free sequences, in the order the fair `queue` picks.
    pub(in crate::scheduler) fn admit(&mut self, ctx: &mut LlamaContext<'_>) {
        while let Some(job) = self.waiting.pop(self.free_seqs.len()) {
            let n = job.request.n as usize;
            let (owner, tier) = (job.request.owner, job.request.tier);
            #[cfg(test)]
            if let Some(log) = &self.cfg.admission_log {
                log.lock().unwrap().push(owner.key);
            }
            let Job { request, events, usage, submitted_at } = job;
            let (scope, prompt) = (request.cache_scope, &request.prompt.tokens);
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
            let (model, ctx_size, mut speculation) = (&self.model, self.cfg.ctx_size, self.cfg.speculation);
            // Greedy and seeded requests alike: the same request, the same output.
            let sampling = &request.sampling;
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
                .and_then(|_| ChainKey::for_request(&request.sampling, request.needs_host_sampling()));
            if on_device.is_some() {
                // A sequence sampled on the device gets one output per step (llama-cpp-2 leaves
                // llama.cpp's `n_outputs_max_per_seq` at 1): no drafts to verify.
                speculation.mode = Speculate::Off;
            }
            // Compiling the request's grammar runs a third-party library on client input: a
            // panic there ends this request, not the engine.
            let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
                ActiveRequest::new(request, events.clone(), submitted_at, seqs.clone(), model, ctx_size, speculation)
            }));
            let failed = match started {
                Ok(Ok(req)) => Ok(req),
                Ok(Err(why)) => Err(EngineError::Rejected(format!("the response format cannot be enforced: {why}"))),
                Err(payload) => {
                    let why = crate::error::panic_message(payload.as_ref());
                    tracing::error!(reason = %why, "a request panicked at admission; ending it alone");
                    Err(EngineError::RequestFailed(why))
                }
            };
            let mut req = match failed {
                Ok(req) => req,
                Err(error) => {
                    // Taken back: its sequences free again, its key's running count as before.
                    self.free_seqs.extend(seqs);
                    self.waiting.finished(owner, tier, n);
                    let unstarted = Unstarted { owner, events, usage };
                    self.end(ctx, Leaving::Unstarted(unstarted), Ending::Failed(error));
                    continue;
                }
            };
            self.queued.leave(owner);
            req.report_usage_to(usage);
            req.isolated = isolated;
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
            req.set_read(keep);
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
                copy_prefix(&mut self.kv, ctx, &mut req, own[0], len);
                self.active.push(req);
                continue;
            }
            match best {
                Some((src, len)) if len.min(req.reusable_len()) > keep => req.await_prefix(src, len),
                _ => copy_prefix(&mut self.kv, ctx, &mut req, own[0], keep),
            }
            self.active.push(req);
        }
    }
}
