//! The scheduler: one thread owns the llama.cpp context. Every step it builds ONE batch holding
//! the next token of every decoding sequence plus a chunk of pending prompt tokens (continuous
//! batching with chunked prefill), decodes it, samples every sequence and streams the text out.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::session::SeqState;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use crate::admission::{FairQueue, Waiting};
use crate::deterministic;
use crate::device_sampling::{ChainKey, DeviceSamplers};
use crate::faults::FaultPoint;
use crate::generator::EngineError;
use crate::host_cache::{self, HostCache};
use crate::kv_layout::{self, KvLayout};
use crate::kv_slots::{common_prefix, KvSlots};
use crate::model::LoadedModel;
use crate::request::{Event, FinishReason, Outcome, Usage};
use crate::sequence::{ActiveRequest, Job};
use crate::shared_drafts::DraftFamilies;
use crate::speculation::{
    self, Acceptance, DraftSource, Lookup, Speculate, SpeculationConfig, SpeculationStats, MAX_DRAFTING_STREAMS,
};
use crate::step_cost::StepCost;
use crate::telemetry::{self, StepStats, Totals};

pub(crate) struct SchedulerConfig {
    /// Max tokens of one sequence (prompt + completion).
    pub ctx_size: u32,
    /// Number of llama.cpp sequences (slots).
    pub parallel: u32,
    /// Max tokens per decode call.
    pub batch_size: u32,
    /// Test hook: panic once the running requests generated this many tokens (see
    /// `test_panic_hook`); `None` outside tests.
    pub panic_after_tokens: Option<u32>,
    pub speculation: SpeculationConfig,
    pub host_cache_bytes: usize,
    /// Held through each decode step when other engines share the cores (see `EngineConfig`).
    pub decode_turns: Option<std::sync::Arc<std::sync::Mutex<()>>>,
    pub layout: KvLayout,
    /// Most sequences one API key's requests may run at once (see `admission`).
    pub max_running_per_key: Option<u32>,
    /// Greedy requests compute apart from everything else (see `deterministic`).
    pub deterministic_greedy: bool,
    /// Sampled choices that only need a temperature are sampled on the device (see
    /// `device_sampling`).
    pub device_sampling: bool,
    #[cfg(test)]
    pub admission_log: Option<Arc<std::sync::Mutex<Vec<u64>>>>,
}

pub(crate) struct Scheduler {
    model: Arc<LoadedModel>,
    cfg: SchedulerConfig,
    waiting: FairQueue<Job>,
    active: Vec<ActiveRequest>,
    free_seqs: Vec<i32>,
    slots: KvSlots,
    batch: LlamaBatch<'static>,
    /// Jobs submitted but not yet admitted (shared with `Engine::submit` for backpressure).
    queued: Arc<AtomicUsize>,
    /// Set when shutdown's grace period ran out: cut everything, cleanly.
    abort: Arc<AtomicBool>,
    totals: Totals,
    spec_stats: Arc<SpeculationStats>,
    step_cost: StepCost,
    /// Acceptance of lookup drafts, learned apart by where they were copied from and whether a
    /// grammar picked them (see `acceptance_kind`).
    acceptance: [Acceptance; 5],
    /// Recent answers, for drafts across requests, apart by schema or tools.
    shared: DraftFamilies,
    /// Prompt tokens in the batch being built: a step with any is no measure of decode cost.
    batch_prompt_tokens: usize,
    /// This step's decoding rows (token, position, sequence) and prompt rows (token, position,
    /// sequence, logits wanted), put in the batch in the layout's order (see `fill_batch`).
    decode_rows: Vec<(i32, i32, i32)>,
    prompt_rows: Vec<(i32, i32, i32, bool)>,
    /// Requests with several choices whose prompt this step reads to its end: the other choices
    /// get a copy once it is decoded (see `spread_prompts`).
    spreading: Vec<usize>,
    /// Idle sequences' KV entries, out of the KV cache (see `host_cache`).
    host: HostCache<SeqState>,
    /// Chains sampling on the device, made on the first step when `cfg.device_sampling`.
    device: Option<DeviceSamplers>,
}

impl Scheduler {
    pub(crate) fn new(
        model: Arc<LoadedModel>,
        cfg: SchedulerConfig,
        queued: Arc<AtomicUsize>,
        abort: Arc<AtomicBool>,
        spec_stats: Arc<SpeculationStats>,
    ) -> Self {
        let batch = LlamaBatch::new(cfg.batch_size as usize, cfg.parallel as i32);
        let free_seqs = (0..cfg.parallel as i32).rev().collect();
        // Per sequence, the lowest free sequence keeps running ones in one ubatch (`kv_layout`).
        let slots = KvSlots::new(cfg.parallel as usize, cfg.layout == KvLayout::PerSequence);
        let host = HostCache::new(cfg.host_cache_bytes);
        let waiting = FairQueue::new(cfg.max_running_per_key.map(|n| n as usize));
        telemetry::describe();
        speculation::describe();
        Self {
            model,
            cfg,
            waiting,
            active: Vec::new(),
            free_seqs,
            slots,
            batch,
            queued,
            abort,
            totals: Totals::default(),
            spec_stats,
            step_cost: StepCost::default(),
            acceptance: [
                Acceptance::default(),
                Acceptance::default(),
                Acceptance::default(),
                Acceptance::agreed(),
                Acceptance::quoted(),
            ],
            shared: DraftFamilies::default(),
            batch_prompt_tokens: 0,
            decode_rows: Vec::new(),
            prompt_rows: Vec::new(),
            spreading: Vec::new(),
            host,
            device: None,
        }
    }

    /// Runs until every sender of `jobs` is gone and all work is finished.
    pub(crate) fn run(&mut self, ctx: &mut LlamaContext<'_>, jobs: &Receiver<Job>) {
        if self.cfg.device_sampling && self.device.is_none() {
            self.device = DeviceSamplers::new(ctx);
        }
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                // Idle: the gauges would otherwise keep the last busy step's figures (a
                // sequence still "running") until the next request.
                telemetry::step(&self.step_stats(0));
                match jobs.recv() {
                    Ok(job) => self.enqueue(job),
                    Err(_) => return,
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.enqueue(job),
                    Err(TryRecvError::Empty) => break,
                    // Keep draining the work already accepted, then stop.
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.step(ctx);
        }
    }

    fn step(&mut self, ctx: &mut LlamaContext<'_>) {
        if self.abort.load(Ordering::Relaxed) {
            self.abort_everything(ctx);
            return;
        }
        self.drop_cancelled();
        self.admit(ctx);
        self.resolve_shares(ctx);
        self.offload_idle(ctx);
        self.evaluate_image(ctx);
        let has_work = self.fill_batch(ctx);
        telemetry::step(&self.step_stats(self.batch.n_tokens() as usize));
        if !has_work {
            return;
        }
        let turn = self.cfg.decode_turns.as_ref().map(|t| t.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let started = Instant::now();
        let decoded = ctx.decode(&mut self.batch);
        drop(turn);
        if let Err(e) = decoded {
            tracing::error!(error = %e, "llama.cpp decode failed");
            self.fail_all(ctx, &EngineError::Decode(e.to_string()));
            return;
        }
        self.spread_prompts(ctx);
        self.sample_all(ctx);
        if self.batch_prompt_tokens == 0 {
            self.step_cost.observe(self.batch.n_tokens() as usize, started.elapsed());
        }
        self.panic_if_asked();
        self.retire_finished();
    }

    /// The gauges' figures now; `batch_tokens` is 0 when idle (the batch still holds the last
    /// step's tokens, which must not be recorded twice).
    fn step_stats(&self, batch_tokens: usize) -> StepStats {
        StepStats {
            batch_tokens,
            running: self.active.iter().map(|r| r.choices.len()).sum(),
            waiting: self.queued.load(Ordering::Relaxed),
            kv_tokens: self.slots.total_tokens(),
            kv_capacity: (self.cfg.ctx_size * self.cfg.parallel) as usize,
            host_cache_bytes: self.host.bytes(),
            host_cache_entries: self.host.len(),
        }
    }

    fn panic_if_asked(&self) {
        let Some(limit) = self.cfg.panic_after_tokens else { return };
        let generated: u32 = self.active.iter().map(|r| r.usage.completion_tokens).sum();
        if generated >= limit {
            panic!("test-only panic after {generated} generated tokens");
        }
    }

    /// Client disconnects cancel their sequences before any more compute is spent on them.
    fn drop_cancelled(&mut self) {
        for req in &mut self.active {
            if req.client_gone() {
                for i in 0..req.choices.len() {
                    req.finish_choice(i, FinishReason::Cancelled);
                }
            }
        }
        // Jobs still waiting never reached the model: nothing was computed, nothing is billed.
        for job in self.waiting.remove_where(|job| job.events.is_closed()) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let _ = job.usage.send(Usage { outcome: Outcome::Cancelled, ..Usage::default() });
        }
        self.retire_finished();
    }

    /// Queues a job for admission; one that could never run (more choices than sequences,
    /// which `prepare` refuses) is answered at once rather than held.
    fn enqueue(&mut self, job: Job) {
        let n = job.request.n as usize;
        if n == 0 || n > self.cfg.parallel as usize {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let msg = format!("n={n} must be between 1 and the server's {} parallel sequences", self.cfg.parallel);
            let _ = job.events.send(Event::Error(EngineError::Rejected(msg)));
            let _ = job.usage.send(Usage { outcome: Outcome::Error, ..Usage::default() });
            return;
        }
        self.waiting.push(job);
    }

    /// Starts waiting jobs on free sequences, in the order `admission` picks.
    fn admit(&mut self, ctx: &mut LlamaContext<'_>) {
        while let Some(job) = self.waiting.pop(self.free_seqs.len()) {
            let n = job.request.n as usize;
            let fairness_key = job.request.fairness_key;
            let events = job.events.clone();
            #[cfg(test)]
            if let Some(log) = &self.cfg.admission_log {
                log.lock().unwrap().push(fairness_key);
            }
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let (scope, prompt) = (job.request.cache_scope, &job.request.prompt.tokens);
            // The first choice takes the idle slot already holding most of the prompt (under its
            // scope); the others take the least recently used ones.
            let mut seqs = Vec::with_capacity(n);
            let (first, in_place) = self.slots.pick_free(&self.free_seqs, scope, prompt).expect("free slot checked");
            seqs.push(self.free_seqs.swap_remove(first));
            while seqs.len() < n {
                let (i, _) = self.slots.pick_free(&self.free_seqs, scope, &[]).expect("free slot checked");
                seqs.push(self.free_seqs.swap_remove(i));
            }
            // Compiling the request's grammar runs a third-party library on client input: a
            // panic there ends this request (its channels close, unanswered: the server reports
            // an error and bills nothing), not the engine.
            let (model, ctx_size, mut speculation) = (&self.model, self.cfg.ctx_size, self.cfg.speculation);
            let isolated = self.cfg.deterministic_greedy && job.request.sampling.temperature <= 0.0;
            if isolated {
                speculation.mode = Speculate::Off;
            }
            let on_device = self
                .device
                .as_ref()
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
                    let why = crate::panic_message(payload.as_ref());
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
                if self.slots.tokens(c.seq_id).len() > keep {
                    host_cache::save(&mut self.host, &self.slots, ctx, c.seq_id);
                }
                let _ = ctx.clear_kv_cache_seq(Some(c.seq_id as u32), Some(crate::units::count_u32(keep)), None);
                self.slots.truncate(c.seq_id, keep);
                self.slots.claim(c.seq_id, req.scope);
                self.slots.touch(c.seq_id);
            }
            req.prefilled = keep;
            // A longer prefix elsewhere: in another slot, or being prefilled right now by a
            // request admitted earlier (a burst sharing one system prompt computes it once).
            let own = req.seq_ids();
            let mut best = self.slots.best_source(req.scope, &req.prompt, &own);
            for other in self.active.iter().filter(|r| r.is_prefilling() && r.scope == req.scope) {
                let len = common_prefix(&other.prompt, &req.prompt);
                if best.is_none_or(|(_, l)| len > l) {
                    best = Some((other.choices[0].seq_id, len));
                }
            }
            // Host memory may hold more of it than any sequence (see `host_cache`).
            let resident = best.map_or(keep, |(_, len)| len.min(req.reusable_len()).max(keep));
            let usable = &req.prompt[..req.reusable_len()];
            let restored =
                host_cache::restore(&mut self.host, &mut self.slots, ctx, own[0], req.scope, usable, resident);
            if let Some(len) = restored {
                share_prefix(self.cfg.layout, &mut self.slots, ctx, &mut req, own[0], len);
                self.active.push(req);
                continue;
            }
            match best {
                Some((src, len)) if len.min(req.reusable_len()) > keep => req.share = Some((src, len)),
                _ => share_prefix(self.cfg.layout, &mut self.slots, ctx, &mut req, own[0], keep),
            }
            self.active.push(req);
        }
    }

    /// Requests waiting on a prefix from another sequence take it once it is computed, or as
    /// much of it as exists once its computation stopped (its request finished or was cut).
    fn resolve_shares(&mut self, ctx: &mut LlamaContext<'_>) {
        let still_prefilling: Vec<i32> =
            self.active.iter().filter(|r| r.is_prefilling()).map(|r| r.choices[0].seq_id).collect();
        for req in &mut self.active {
            let Some((src, want)) = req.share else { continue };
            // The source was picked under the request's scope; should the slot have been taken
            // by another scope since, it has nothing for this request.
            let same_scope = self.slots.scope(src) == req.scope;
            let have = if same_scope { self.slots.tokens(src) } else { &[] };
            if same_scope && have.len() < want && still_prefilling.contains(&src) {
                continue;
            }
            let len = req.whole_images(common_prefix(have, &req.prompt).min(req.reusable_len()));
            let len = len.max(req.prefilled);
            let from = if len > req.prefilled { src } else { req.choices[0].seq_id };
            share_prefix(self.cfg.layout, &mut self.slots, ctx, req, from, len);
        }
    }

    /// Idle sequences still holding KV entries move them to host memory before the next decode,
    /// unless a request waits to copy from them. A request admitted in the same step has already
    /// taken the one it continues in place.
    fn offload_idle(&mut self, ctx: &mut LlamaContext<'_>) {
        if !self.host.enabled() {
            return;
        }
        for seq in self.free_seqs.clone() {
            let awaited = self.active.iter().any(|r| r.share.is_some_and(|(src, _)| src == seq));
            if !awaited && !self.slots.tokens(seq).is_empty() {
                host_cache::offload(&mut self.host, &mut self.slots, ctx, seq);
            }
        }
    }

    /// Evaluates the next image of one prefilling request: the vision encoder runs, then its
    /// embeddings are decoded into the request's first sequence (the others get the whole
    /// prompt once it is read: `spread_prompts`).
    /// One image per step, so running streams wait for at most one encode. A failure ends that
    /// request alone.
    fn evaluate_image(&mut self, ctx: &mut LlamaContext<'_>) {
        let Some(vision) = self.model.vision.as_ref() else { return };
        let Some(i) = self.active.iter().position(|r| r.share.is_none() && r.image_at(r.prefilled).is_some()) else {
            return;
        };
        let req = &mut self.active[i];
        let image = req.image_at(req.prefilled).expect("found above").clone();
        let seq = req.choices[0].seq_id;
        let (start, end) = (image.start, image.start + image.len);
        let started = Instant::now();
        let turn = self.cfg.decode_turns.as_ref().map(|t| t.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let evaluated = vision.evaluate(ctx, &image, seq, self.cfg.batch_size as i32);
        drop(turn);
        match evaluated {
            Ok(()) => {
                telemetry::image_evaluated(image.len, started.elapsed());
                for pos in start..end {
                    self.slots.record(seq, pos, req.prompt[pos]);
                }
                req.prefilled = end;
            }
            Err(e) => {
                tracing::error!(error = %e, "an image could not be evaluated");
                let _ = ctx.clear_kv_cache_seq(Some(seq as u32), Some(crate::units::count_u32(start)), None);
                let req = self.active.swap_remove(i);
                self.release(&req);
                let usage = req.complete(Some(EngineError::Decode(format!("the image could not be encoded: {e}"))));
                self.totals.request_done(&usage);
            }
        }
    }

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
    fn fill_batch(&mut self, ctx: &mut LlamaContext<'_>) -> bool {
        self.batch.clear();
        self.batch_prompt_tokens = 0;
        self.decode_rows.clear();
        self.prompt_rows.clear();
        self.spreading.clear();
        let mut budget = self.cfg.batch_size as usize;
        let decoding: usize = self.active.iter().flat_map(|r| &r.choices).filter(|c| c.next_token.is_some()).count();
        // Drafts only use what is left once every decoding choice has its token. Forced drafts
        // (jump-forward) are always accepted, so they may use it at any load; lookup drafts only
        // while few streams decode.
        let mut forced_budget = budget.saturating_sub(decoding);
        let mut draft_budget = if decoding <= MAX_DRAFTING_STREAMS { forced_budget } else { 0 };
        let ctx_size = self.cfg.ctx_size as i32;
        let weigh_drafts = self.cfg.speculation.mode == Speculate::Auto;
        // Positions this step computes logits for so far, counting every decoding choice's token.
        let mut outputs = decoding;
        // The fixed prompt chunks of isolated requests are held back from drafts.
        let chunk = deterministic::chunk_size(self.cfg.batch_size, self.cfg.parallel);
        let reserved: usize = self
            .active
            .iter()
            .filter(|r| r.isolated && r.is_prefilling() && r.share.is_none())
            .map(|r| deterministic::chunk_end(r.prefilled, chunk, r.text_end(r.prefilled)) - r.prefilled)
            .sum();
        forced_budget = forced_budget.saturating_sub(reserved);
        draft_budget = draft_budget.min(forced_budget);
        // Planning a request's drafts runs its drafter (and grammar) on its own output: a panic
        // there ends that request alone, its rows taken back out of the batch.
        let mut panicked = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            let before = (self.decode_rows.len(), budget, forced_budget, draft_budget, outputs);
            let planned = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let (max_tokens, isolated) = (req.max_tokens, req.isolated);
                for c in &mut req.choices {
                    let Some(token) = c.next_token.take() else { continue };
                    // An index into `decode_rows` until the prompt chunks are in.
                    c.batch_idx = Some(crate::units::llama_pos(self.decode_rows.len()));
                    self.decode_rows.push((token, c.pos, c.seq_id));
                    self.slots.record(c.seq_id, c.pos as usize, token);
                    c.pos += 1;
                    budget -= 1;
                    req.fault.check(FaultPoint::Drafting, req.usage.completion_tokens);
                    // A draft longer than the tokens the choice may still produce, or reaching
                    // past its context, could never be used: verifying k drafts produces up to
                    // k + 1 tokens, and the last draft must sit inside the context.
                    let produce_left = max_tokens.saturating_sub(c.generated) as usize;
                    let room = (ctx_size - c.pos).max(0) as usize;
                    let limit = if isolated { 0 } else { produce_left.saturating_sub(1).min(room) };
                    let mut chain = c.drafter.chain(
                        limit.min(forced_budget),
                        limit.min(draft_budget),
                        self.shared.of(c.drafter.family()),
                    );
                    let forced = chain.forced_prefix();
                    if weigh_drafts && chain.tokens.len() > forced {
                        let acceptance = &mut self.acceptance;
                        let chance =
                            |l: &Lookup| acceptance[acceptance_kind(l.source, c.constrained)].chance(l.matched);
                        let k = self
                            .step_cost
                            .best_draft(outputs, forced, chain.tokens.len(), |k| chain.expected_tokens(k, chance));
                        if let Some(first) = chain.lookups.first().filter(|l| l.start >= k) {
                            acceptance[acceptance_kind(first.source, c.constrained)].declined(first.matched);
                        }
                        chain.truncate(k);
                    }
                    c.drafts = chain;
                    outputs += c.drafts.tokens.len();
                    for &draft in &c.drafts.tokens {
                        self.decode_rows.push((draft, c.pos, c.seq_id));
                        self.slots.record(c.seq_id, c.pos as usize, draft);
                        c.pos += 1;
                    }
                    let fed = c.drafts.tokens.len();
                    budget -= fed;
                    forced_budget -= fed;
                    draft_budget = draft_budget.saturating_sub(fed - c.drafts.forced_within(fed));
                }
            }));
            if let Err(payload) = planned {
                let rows;
                (rows, budget, forced_budget, draft_budget, outputs) = before;
                self.decode_rows.truncate(rows);
                panicked.push((r, crate::panic_message(payload.as_ref())));
            }
        }
        self.end_panicked(ctx, panicked);
        let mut prompt_done = Vec::new();
        for (r, req) in self.active.iter_mut().enumerate() {
            if budget == 0 {
                break;
            }
            if !req.is_prefilling() || req.share.is_some() {
                continue;
            }
            // An image waits for `evaluate_image`.
            let mut end = (req.prefilled + budget).min(req.text_end(req.prefilled));
            if req.isolated {
                // A whole chunk or none: its rows' sums depend on how many are computed at once.
                end = deterministic::chunk_end(req.prefilled, chunk, req.text_end(req.prefilled));
                if end - req.prefilled > budget {
                    continue;
                }
            }
            if end == req.prefilled {
                continue;
            }
            // The prompt goes into the first choice's sequence; the others get a copy once it
            // is read (`spread_prompts`).
            let seq = req.choices[0].seq_id;
            for pos in req.prefilled..end {
                let last = pos + 1 == req.prompt.len();
                self.prompt_rows.push((req.prompt[pos], crate::units::llama_pos(pos), seq, last));
                self.slots.record(seq, pos, req.prompt[pos]);
            }
            budget -= end - req.prefilled;
            self.batch_prompt_tokens += end - req.prefilled;
            req.prefilled = end;
            if !req.is_prefilling() {
                prompt_done.push((r, self.prompt_rows.len() - 1));
                if req.choices.len() > 1 {
                    self.spreading.push(r);
                }
            }
        }
        let planned: Vec<(i32, i32, i32, bool)> = self
            .prompt_rows
            .iter()
            .copied()
            .chain(self.decode_rows.iter().map(|&(token, pos, seq)| (token, pos, seq, true)))
            .collect();
        let seqs: Vec<i32> = planned.iter().map(|row| row.2).collect();
        let isolated: Vec<i32> =
            self.active.iter().filter(|r| r.isolated).flat_map(|r| r.choices.iter().map(|c| c.seq_id)).collect();
        let order = if isolated.is_empty() {
            kv_layout::batch_order(self.cfg.layout, &seqs)
        } else {
            deterministic::batch_order(self.cfg.layout, &seqs, |s| isolated.contains(&s))
        };
        let mut rows = vec![(0, 0, 0, false); planned.len()];
        for (i, row) in planned.into_iter().enumerate() {
            rows[order[i]] = row;
        }
        for (token, pos, seq, logits) in rows {
            self.batch.add(LlamaToken(token), pos, &[seq], logits).expect("batch sized for the budget");
        }
        let first_decode_row = self.prompt_rows.len();
        for c in self.active.iter_mut().flat_map(|r| &mut r.choices) {
            if let Some(row) = &mut c.batch_idx {
                *row = crate::units::llama_pos(order[first_decode_row + *row as usize]);
            }
        }
        // A prompt read to its end has its first token's logits at its last row.
        for (r, idx) in prompt_done {
            let req = &mut self.active[r];
            for c in &mut req.choices {
                c.batch_idx = Some(crate::units::llama_pos(order[idx]));
                c.pos = crate::units::llama_pos(req.prompt.len());
            }
        }
        self.batch.n_tokens() > 0
    }

    /// Copies each prompt read to its end this step from the first choice's sequence into the
    /// request's other choices' (see `kv_layout`). A request whose copy fails ends with an error
    /// (its prompt is billed, as for any decode failure).
    fn spread_prompts(&mut self, ctx: &mut LlamaContext<'_>) {
        let mut failed = Vec::new();
        for &r in &self.spreading {
            let req = &self.active[r];
            let seqs = req.seq_ids();
            let len = req.prompt.len();
            match self.cfg.layout.copy_prefix(ctx, seqs[0], &seqs[1..], len) {
                Ok(()) => seqs[1..].iter().for_each(|&s| self.slots.copy_prefix(seqs[0], s, len)),
                Err(e) => {
                    seqs[1..].iter().for_each(|&s| self.slots.truncate(s, 0));
                    failed.push((r, e));
                }
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

    /// Samples every choice that had logits computed. A choice that fed draft tokens walks them:
    /// at each position it samples as usual and goes on only while the sampled token is the
    /// draft token already fed after it (see `speculation`). The first token that differs, or a
    /// bonus token after a fully accepted draft, is fed next step; the rejected draft tokens
    /// leave the KV cache and the slot bookkeeping, and were never billed nor streamed.
    ///
    /// A panic while one request is sampled (its sampler or grammar, stop strings, tool-call
    /// watching, producing its text) ends that request alone: see `end_panicked`.
    fn sample_all(&mut self, ctx: &mut LlamaContext<'_>) {
        let mut panicked = Vec::new();
        let first_tokens = crate::sample_step::sample_first_tokens(&mut self.active, ctx);
        for (r, first) in first_tokens.into_iter().enumerate() {
            let sampled = match first {
                Ok(first) => std::panic::catch_unwind(AssertUnwindSafe(|| self.sample_request(r, &first, ctx)))
                    .map_err(|payload| crate::panic_message(payload.as_ref())),
                Err(why) => Err(why),
            };
            if let Err(why) = sampled {
                panicked.push((r, why));
            }
        }
        self.end_panicked(ctx, panicked);
    }

    /// Walks request `r`'s choices; `first` holds each one's token sampled at its first position.
    fn sample_request(&mut self, r: usize, first: &[Option<i32>], ctx: &mut LlamaContext<'_>) {
        let model = &self.model;
        let ctx_size = self.cfg.ctx_size as i32;
        let req = &mut self.active[r];
        for i in 0..req.choices.len() {
            let Some(idx) = req.choices[i].batch_idx.take() else {
                continue;
            };
            let chain = std::mem::take(&mut req.choices[i].drafts);
            let drafts = &chain.tokens;
            let k = drafts.len();
            // Position of the token fed at `idx`; drafts follow it.
            let fed_pos = req.choices[i].pos - 1 - crate::units::llama_pos(k);
            let mut accepted = 0;
            for j in 0..=k {
                let token = match (j, first.get(i).copied().flatten()) {
                    (0, Some(token)) => token,
                    _ if req.choices[i].on_device => {
                        crate::sample_step::device_token(ctx, idx + crate::units::llama_pos(j))
                    }
                    _ => {
                        req.fault.check(FaultPoint::Sampling, req.usage.completion_tokens);
                        req.choices[i].sampler.sample(ctx.get_logits_ith(idx + crate::units::llama_pos(j)))
                    }
                };
                req.choices[i].pos = fed_pos + 1 + crate::units::llama_pos(j);
                if !req.produce(i, token, idx + crate::units::llama_pos(j), ctx, model, ctx_size) {
                    break;
                }
                if drafts.get(j) == Some(&token) {
                    accepted += 1;
                    continue;
                }
                req.choices[i].next_token = Some(token);
                break;
            }
            if k > 0 && tracing::enabled!(tracing::Level::TRACE) {
                let text: Vec<_> =
                    drafts.iter().map(|&t| String::from_utf8_lossy(&model.piece(t)).into_owned()).collect();
                let sources: Vec<_> = chain.lookups.iter().map(|l| (l.start, l.len, l.source)).collect();
                let (seq, forced) = (req.choices[i].seq_id, chain.forced_prefix());
                tracing::trace!(seq, drafts = ?text, accepted, forced, ?sources, "verified");
            }
            // Forced tokens after a rejected lookup were never verified: only those reached
            // count (and are taken, unless the choice ended first).
            let forced = chain.forced_within((accepted + 1).min(k));
            if forced > 0 {
                self.spec_stats.record_forced(forced, chain.forced_within(accepted));
            }
            // A run after the first rejected draft was never tested.
            for l in chain.lookups.iter().filter(|l| l.start <= accepted) {
                let taken = (accepted - l.start).min(l.len);
                self.acceptance[acceptance_kind(l.source, req.choices[i].constrained)]
                    .verified(l.matched, l.len, taken);
                self.spec_stats.record(l.len, taken, l.source);
            }
            // The choice's position is where its next token goes: positions from there on
            // hold draft tokens that were not produced.
            let kept = req.choices[i].pos;
            if kept <= fed_pos + crate::units::llama_pos(k) {
                let seq = req.choices[i].seq_id;
                let _ = ctx.clear_kv_cache_seq(Some(seq as u32), Some(kept as u32), None);
                self.slots.truncate(seq, kept as usize);
            }
        }
    }

    /// Ends the requests whose processing panicked (`(index in active, why)`): each gets an
    /// error and reports the tokens it produced, which are billed; its sequences are emptied,
    /// since the panic may have left them half-updated, and freed. Other requests go on.
    fn end_panicked(&mut self, ctx: &mut LlamaContext<'_>, mut panicked: Vec<(usize, String)>) {
        // Highest index first, so each `swap_remove` leaves the lower ones in place.
        panicked.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
        for (r, why) in panicked {
            tracing::error!(reason = %why, "a request panicked; ending it alone");
            let req = self.active.swap_remove(r);
            for seq in req.seq_ids() {
                let _ = ctx.clear_kv_cache_seq(Some(seq as u32), Some(0), None);
                self.slots.truncate(seq, 0);
            }
            self.release(&req);
            let usage = req.complete(Some(EngineError::RequestFailed(why)));
            self.totals.request_done(&usage);
        }
    }

    /// Frees the KV cells of finished requests and reports their usage.
    fn retire_finished(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].all_finished() {
                let req = self.active.swap_remove(i);
                self.release(&req);
                let usage = req.complete(None);
                self.totals.request_done(&usage);
            } else {
                i += 1;
            }
        }
    }

    /// Returns the request's sequences to the idle pool. Their KV entries stay: the next
    /// prompt with the same prefix reuses them (see `KvSlots`).
    fn release(&mut self, req: &ActiveRequest) {
        self.waiting.finished(req.fairness_key, req.choices.len());
        for c in &req.choices {
            self.slots.touch(c.seq_id);
            self.free_seqs.push(c.seq_id);
            // Whole answers only: one cut short says little about how answers go on.
            if matches!(c.finished, Some(FinishReason::Stop | FinishReason::Length)) {
                self.shared.record(c.drafter.family(), c.drafter.answer());
            }
        }
    }

    /// Ends every running and waiting request with an error; what was generated is billed.
    fn abort_everything(&mut self, ctx: &mut LlamaContext<'_>) {
        self.answer_waiting(&EngineError::ShuttingDown);
        if !self.active.is_empty() {
            self.fail_all(ctx, &EngineError::ShuttingDown);
        }
    }

    /// Jobs that never reached the model: nothing was computed, nothing is billed.
    fn answer_waiting(&mut self, error: &EngineError) {
        for job in self.waiting.drain() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            answer_unstarted(job, error);
        }
    }

    fn fail_all(&mut self, ctx: &mut LlamaContext<'_>, error: &EngineError) {
        for req in std::mem::take(&mut self.active) {
            self.release(&req);
            let usage = req.complete(Some(error.clone()));
            self.totals.request_done(&usage);
        }
        ctx.clear_kv_cache();
        self.slots.clear_all();
    }

    /// After a panic in `run`: every running request ends with `error` and reports the tokens
    /// it generated; waiting and still-queued jobs are answered. Touches neither the llama.cpp
    /// context nor the slot bookkeeping, which the panic may have left half-updated.
    pub(crate) fn fail_after_panic(&mut self, error: &EngineError, jobs: &Receiver<Job>) {
        for req in std::mem::take(&mut self.active) {
            req.complete(Some(error.clone()));
        }
        self.answer_waiting(error);
        while let Ok(job) = jobs.try_recv() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            answer_unstarted(job, error);
        }
    }
}

impl Waiting for Job {
    fn fairness_key(&self) -> u64 {
        self.request.fairness_key
    }

    fn sequences(&self) -> usize {
        self.request.n as usize
    }
}

fn answer_unstarted(job: Job, error: &EngineError) {
    let _ = job.events.send(Event::Error(error.clone()));
    let _ = job.usage.send(Usage { outcome: Outcome::Error, ..Usage::default() });
}

/// Copies the first `len` cached tokens of `src` into the request's first sequence (fewer if
/// `len` would cut an image: see `ActiveRequest::whole_images`; none if the copy fails). The
/// other choices get the whole prompt once it is read (`spread_prompts`).
fn share_prefix(
    layout: KvLayout,
    slots: &mut KvSlots,
    ctx: &mut LlamaContext<'_>,
    req: &mut ActiveRequest,
    src: i32,
    len: usize,
) {
    let mut len = req.whole_images(len);
    let first = req.choices[0].seq_id;
    if first == src {
        // Its own sequence (a restore from host memory) keeps nothing past the prefix.
        if slots.tokens(src).len() > len {
            let _ = ctx.clear_kv_cache_seq(Some(src as u32), Some(crate::units::count_u32(len)), None);
            slots.truncate(src, len);
        }
    } else {
        if let Err(e) = layout.copy_prefix(ctx, src, &[first], len) {
            tracing::warn!(error = %e, src, dst = first, len, "could not copy a shared prefix; computing it instead");
            len = 0;
        }
        slots.copy_prefix(src, first, len);
    }
    req.prefilled = len;
    req.usage.cached_tokens = crate::units::count_u32(len);
    req.share = None;
}

/// Which acceptance estimate a lookup draft uses. A draft from another request's answer that a
/// grammar picked among several (the answer with the next key of the schema) is right far more
/// often than one copied after the same few tokens of free text, so answers to chat requests
/// must not teach the scheduler to decline drafts of JSON keys, nor the other way round. Drafts
/// a choice's own output agrees on under a grammar (`DraftSource::Agreed`) share the estimate of
/// the agreed drafts from earlier answers: both are a schema's layout.
fn acceptance_kind(source: DraftSource, constrained: bool) -> usize {
    match (source, constrained) {
        (DraftSource::Own, false) => 0,
        (DraftSource::Own, true) => 1,
        (DraftSource::Shared, false) => 2,
        (DraftSource::Shared, true) | (DraftSource::Agreed, _) => 3,
        (DraftSource::Quoted, _) => 4,
    }
}
