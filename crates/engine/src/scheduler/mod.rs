//! The scheduler: one thread owns the llama.cpp context. Every step it builds ONE batch holding
//! the next token of every decoding sequence plus a chunk of pending prompt tokens (continuous
//! batching with chunked prefill), decodes it, samples every sequence and streams the text out.
//!
//! Its folders: [`queue`], the waiting requests, fair between API keys; [`request`], one running
//! request (its choices, what it streams, its tool watch, answer gate, thinking, stop strings);
//! [`step`], a file per stage of `Scheduler::step` in the order it runs; [`sample`], the
//! samplers. `step` here runs the stages and the decode between them.

pub(crate) mod end;
pub(crate) mod queue;
pub(crate) mod request;
pub(crate) mod sample;
pub(crate) mod step;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;

use self::end::Ending;
use self::queue::shares::QueueShares;
use self::step::batch;
use self::step::buffers::StepBuffers;
use self::step::graph_reuse;
use self::step::image::ImageStep;
use self::step::prompt_turns::PromptDeficits;
use self::step::verify::{self, Verdicts, Verifying};
use crate::error::EngineError;
use crate::kv::cache::{KvCache, StreamCopies};
use crate::kv::layout::KvLayout;
use crate::kv::seq_id::SeqId;
use crate::model::LoadedModel;
use crate::request::{Event, FinishReason, GenerateRequest, Usage};
use crate::scheduler::queue::{FairQueue, Waiting};
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::sample::device::DeviceSamplers;
use crate::speculation::shared_drafts::DraftFamilies;
use crate::speculation::step_cost::StepCost;
use crate::speculation::{self, AcceptanceByKind, SpeculationConfig, SpeculationStats};
use crate::telemetry::{self, PlanParts, SampleParts, StepPhases, StepStats, Totals};

/// Steps in a row without a row for anyone, with requests active or waiting, after which they
/// end as stalled (`Scheduler::no_rows`). Such a step takes microseconds; none is expected.
const STALLED_AFTER_STEPS: u32 = 8;

pub(crate) struct SchedulerConfig {
    /// Max tokens of one sequence (prompt + completion).
    pub ctx_size: u32,
    /// Number of llama.cpp sequences (slots).
    pub parallel: u32,
    /// Max tokens per decode call.
    pub batch_size: u32,
    /// Most prompt rows one step reads while sequences decode (`prompt_rows_while_decoding`):
    /// a step lasts as long as its rows take, and every decoding stream waits for it.
    pub prompt_rows_while_decoding: Option<usize>,
    /// Requests ended because no step could move them (`EngineError::Stalled`), since start.
    pub stalled: Arc<AtomicU64>,
    /// Test hook: panic once the running requests generated this many tokens (see
    /// `test_panic_hook`); `None` outside tests.
    pub panic_after_tokens: Option<u32>,
    pub speculation: SpeculationConfig,
    pub host_cache_bytes: usize,
    /// Held through each decode step when other engines share the cores (see `EngineConfig`).
    pub decode_turns: Option<std::sync::Arc<std::sync::Mutex<()>>>,
    pub layout: KvLayout,
    /// How KV entries are copied between streams (moves, shared prefixes, spread prompts).
    pub kv_copies: StreamCopies,
    /// Most sequences one API key's requests may run at once (see `queue`).
    pub max_running_per_key: Option<u32>,
    /// Greedy requests compute apart from everything else (see `deterministic`).
    pub deterministic_greedy: bool,
    /// Sampled choices that only need a temperature are sampled on the device (see
    /// `sample::device`).
    pub device_sampling: bool,
    /// Most busy sequences, a new request's included, for it to sample on the device
    /// (`sample::device::AUTO_MAX_STREAMS` under `auto`).
    pub device_sampling_max_streams: usize,
    /// Where the virtual blocks the KV cache gains and loses are announced (see `kv::blocks`).
    pub kv_events: Option<crate::kv::blocks::KvEventSink>,
    #[cfg(test)]
    pub admission_log: Option<Arc<std::sync::Mutex<Vec<u64>>>>,
    /// Tests only: every request's end, as `Scheduler::end` counts it.
    #[cfg(test)]
    pub endings_log: Option<Arc<std::sync::Mutex<Vec<end::EndingRecord>>>>,
    #[cfg(test)]
    pub moves_log: Option<crate::scheduler::step::compact::MovesLog>,
}

pub(crate) struct Scheduler {
    model: Arc<LoadedModel>,
    cfg: SchedulerConfig,
    waiting: FairQueue<Job>,
    active: Vec<ActiveRequest>,
    free_seqs: Vec<SeqId>,
    /// The KV cache's cells, their mirror and host memory: every change to them goes through it.
    kv: KvCache,
    batch: LlamaBatch<'static>,
    /// Jobs submitted but not yet admitted (shared with `Engine::submit` for backpressure).
    queued: Arc<QueueShares>,
    /// Set when shutdown's grace period ran out: cut everything, cleanly.
    abort: Arc<AtomicBool>,
    totals: Totals,
    spec_stats: Arc<SpeculationStats>,
    step_cost: StepCost,
    /// Acceptance of lookup drafts, learned apart by where they were copied from and whether a
    /// grammar picked them (see `AcceptanceKind`).
    acceptance: AcceptanceByKind,
    /// Recent answers, for drafts across requests, apart by schema or tools.
    shared: DraftFamilies,
    /// Each key's account of prompt rows, which orders prompts between keys (`prompt_turns`).
    prompt_deficits: PromptDeficits,
    /// Steps in a row that gave no row to the requests active or waiting (see `no_rows`).
    steps_without_rows: u32,
    /// Chains sampling on the device, made on the first step when `cfg.device_sampling`.
    device: Option<DeviceSamplers>,
    /// llama.cpp's count of reused graphs, read each step; made on the first step, `None` where
    /// the context's handle cannot be had.
    graph_reuse: Option<graph_reuse::GraphReuse>,
    /// When a step last saw interactive work (any request not a batch's line), running or
    /// waiting: batch lines hold off for a while after it (`sit_out_batch_lines`).
    interactive_at: Option<Instant>,
    /// The vectors the step's values live in, from one step to the next.
    buffers: StepBuffers,
}

impl Scheduler {
    pub(crate) fn new(
        model: Arc<LoadedModel>,
        cfg: SchedulerConfig,
        queued: Arc<QueueShares>,
        abort: Arc<AtomicBool>,
        spec_stats: Arc<SpeculationStats>,
    ) -> Self {
        let batch = LlamaBatch::new(cfg.batch_size as usize, cfg.parallel as i32);
        let free_seqs = (0..cfg.parallel as usize).rev().map(SeqId::new).collect();
        let kv = KvCache::new(cfg.parallel as usize, cfg.layout, cfg.host_cache_bytes)
            .with_copies(cfg.kv_copies)
            .with_events(cfg.kv_events.clone());
        let waiting = FairQueue::new(cfg.max_running_per_key.map(|n| n as usize));
        telemetry::describe();
        speculation::describe();
        Self {
            model,
            cfg,
            waiting,
            active: Vec::new(),
            free_seqs,
            kv,
            batch,
            queued,
            abort,
            totals: Totals::default(),
            spec_stats,
            step_cost: StepCost::default(),
            acceptance: AcceptanceByKind::default(),
            shared: DraftFamilies::default(),
            prompt_deficits: PromptDeficits::default(),
            steps_without_rows: 0,
            device: None,
            graph_reuse: None,
            interactive_at: None,
            buffers: StepBuffers::default(),
        }
    }

    /// Runs until every sender of `jobs` is gone and all work is finished.
    pub(crate) fn run(&mut self, ctx: &mut LlamaContext<'_>, jobs: &Receiver<Job>) {
        if self.cfg.device_sampling && self.device.is_none() {
            self.device = DeviceSamplers::new(ctx);
        }
        if self.graph_reuse.is_none() {
            self.graph_reuse = graph_reuse::GraphReuse::new(ctx);
        }
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                // Idle: the gauges would otherwise keep the last busy step's figures (a
                // sequence still "running") until the next request.
                telemetry::step(&self.step_stats(0));
                match jobs.recv() {
                    Ok(job) => self.enqueue(ctx, job),
                    Err(_) => {
                        // Stopping (the model unloads): nothing of it counts any more.
                        telemetry::step(&StepStats::default());
                        return;
                    }
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.enqueue(ctx, job),
                    Err(TryRecvError::Empty) => break,
                    // Keep draining the work already accepted, then stop.
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            if let Some(until) = self.step(ctx) {
                // Only batch lines run, and they hold off: a new job ends the wait.
                if let Ok(job) = jobs.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    self.enqueue(ctx, job);
                }
            }
        }
    }

    /// One step: each stage a call whose result the next takes. Returns when batch lines, the
    /// only work, hold off until (`SittingOut::held_off_until`): `run` waits for a job until then.
    fn step(&mut self, ctx: &mut LlamaContext<'_>) -> Option<Instant> {
        if self.abort.load(Ordering::Relaxed) {
            self.abort_everything(ctx);
            return None;
        }
        let step_started = Instant::now();
        self.drop_cancelled(ctx);
        // A source whose request ended since the last step is copied from before admission
        // can hand its sequence to a new request.
        self.copy_awaited_prefixes(ctx);
        self.preempt(ctx);
        self.admit(ctx);
        self.copy_awaited_prefixes(ctx);
        let admitted = Instant::now();
        self.offload_idle(ctx);
        self.compact(ctx);
        let cache_moved = Instant::now();
        let image_evaluated = match self.evaluate_image(ctx) {
            ImageStep::None => false,
            ImageStep::Evaluated => true,
            ImageStep::Failed(r, error) => {
                self.end_alone(ctx, vec![(r, error)]);
                true
            }
        };
        let sitting = self.sit_out_batch_lines();
        let planned = self.plan(ctx, &sitting);
        let written = batch::write(&mut self.batch, planned, &self.active, &self.cfg, &mut self.buffers);
        telemetry::step(&self.step_stats(self.batch.n_tokens() as usize));
        let Some(mut rows) = written else {
            if !image_evaluated && sitting.held_off_until.is_none() {
                self.no_rows(ctx);
            }
            return sitting.held_off_until;
        };
        self.steps_without_rows = 0;
        let turn = self.cfg.decode_turns.as_ref().map(|t| t.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let started = Instant::now();
        let decoded = ctx.decode(&mut self.batch);
        let launched = Instant::now();
        // Reading the first logits would wait for the device anyway; waiting here first tells
        // the device's share of the step apart from the host's (`gantry_step_phase_*`).
        ctx.synchronize();
        drop(turn);
        let synced = Instant::now();
        if let Err(e) = decoded {
            tracing::error!(error = %e, "llama.cpp decode failed");
            self.fail_all(ctx, &EngineError::Decode(e.to_string()));
            return None;
        }
        self.kv.decoded();
        let graphs_reused = self.graph_reuse.as_mut().map(graph_reuse::GraphReuse::since_last);
        let copy_failed = self.spread_prompts(ctx, &rows.spreading);
        self.end_alone(ctx, copy_failed);
        let mut with = Verifying {
            model: &self.model,
            ctx_size: self.cfg.ctx_size as i32,
            kv: &mut self.kv,
            acceptance: &mut self.acceptance,
            spec_stats: &self.spec_stats,
            first_tokens: &mut self.buffers.first_tokens,
        };
        let Verdicts { failed, pick } = verify::sample(ctx, &mut self.active, &mut rows.choices, &mut with);
        self.buffers.choices = rows.choices;
        self.end_alone(ctx, failed);
        let sampled = Instant::now();
        if rows.prompt_rows == 0 {
            // Without the reuse count (no context handle) every step counts as reusing its graph.
            let built = graphs_reused.is_some_and(|reused| reused < rows.ubatches as u64);
            self.step_cost.observe(rows.rows, started.elapsed(), built);
        }
        self.step_cost.ran(rows.rows);
        self.panic_if_asked();
        self.retire_finished(ctx);
        telemetry::step_phases(&StepPhases {
            plan: PlanParts {
                admit: admitted - step_started,
                cache: cache_moved - admitted,
                batch: started - cache_moved,
            },
            decode: launched - started,
            sync: synced - launched,
            sample: SampleParts { pick, produce: (sampled - synced).saturating_sub(pick) },
            finish: sampled.elapsed(),
            ubatches: rows.ubatches,
            graphs_reused: graphs_reused.unwrap_or(0),
        });
        None
    }

    /// A step that gave nothing a row and evaluated no image while requests are active or
    /// waiting. Each active request is read, decoding, or waiting on a prompt being read
    /// (`prefix_waits`), and admission takes a waiting job whenever nothing runs, so this is a
    /// bug: a few such steps in a row end what is stuck, loudly, rather than spin on it
    /// forever (the running requests with what they computed billed; else the waiting jobs).
    fn no_rows(&mut self, ctx: &mut LlamaContext<'_>) {
        if self.active.is_empty() && self.waiting.is_empty() {
            self.steps_without_rows = 0;
            return;
        }
        self.steps_without_rows += 1;
        if self.steps_without_rows < STALLED_AFTER_STEPS {
            return;
        }
        self.steps_without_rows = 0;
        let why = format!("{STALLED_AFTER_STEPS} scheduler steps in a row gave it no work");
        tracing::error!(
            running = self.active.len(),
            waiting = self.queued.total(),
            "requests the scheduler could not move: ending them"
        );
        let ended = if self.active.is_empty() {
            let jobs = self.waiting.drain();
            let ended = jobs.len();
            for job in jobs {
                self.end(ctx, job.into(), Ending::Failed(EngineError::Stalled(why.clone())));
            }
            ended
        } else {
            let stuck: Vec<_> = (0..self.active.len()).map(|r| (r, EngineError::Stalled(why.clone()))).collect();
            let ended = stuck.len();
            self.end_alone(ctx, stuck);
            ended
        };
        self.cfg.stalled.fetch_add(ended as u64, Ordering::Relaxed);
        telemetry::stalled(ended);
    }

    /// The gauges' figures now; `batch_tokens` is 0 when idle (the batch still holds the last
    /// step's tokens, which must not be recorded twice).
    fn step_stats(&self, batch_tokens: usize) -> StepStats {
        let (host_cache_bytes, host_cache_entries) = self.kv.host_usage();
        StepStats {
            batch_tokens,
            running: self.active.iter().map(|r| r.choices.len()).sum(),
            waiting: self.queued.total(),
            kv_tokens: self.kv.slots().total_tokens(),
            kv_active_tokens: self
                .active
                .iter()
                .flat_map(|r| &r.choices)
                .map(|c| self.kv.slots().tokens(c.seq_id).len())
                .sum(),
            kv_capacity: (self.cfg.ctx_size * self.cfg.parallel) as usize,
            host_cache_bytes,
            host_cache_entries,
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
    fn drop_cancelled(&mut self, ctx: &mut LlamaContext<'_>) {
        for req in &mut self.active {
            if req.client_gone() {
                for i in 0..req.choices.len() {
                    req.finish_choice(i, FinishReason::Cancelled);
                }
            }
        }
        // Jobs still waiting never reached the model: nothing was computed, nothing is billed.
        for job in self.waiting.remove_where(|job| job.events.is_closed()) {
            self.end(ctx, job.into(), Ending::Finished);
        }
        self.retire_finished(ctx);
    }

    /// Queues a job for admission; one that could never run (more choices than sequences,
    /// which `prepare` refuses) is answered at once rather than held.
    fn enqueue(&mut self, ctx: &mut LlamaContext<'_>, job: Job) {
        let n = job.request.n as usize;
        if n == 0 || n > self.cfg.parallel as usize {
            let msg = format!("n={n} must be between 1 and the server's {} parallel sequences", self.cfg.parallel);
            self.end(ctx, job.into(), Ending::Failed(EngineError::Rejected(msg)));
            return;
        }
        self.waiting.push(job);
    }

    /// Ends requests that cannot go on (`(index in active, the error they end with)`): a panic
    /// while processing one, a grammar that failed, a stall. Each reports the tokens it produced,
    /// which are billed; other requests go on.
    fn end_alone(&mut self, ctx: &mut LlamaContext<'_>, mut failed: Vec<(usize, EngineError)>) {
        // Highest index first, so each `swap_remove` leaves the lower ones in place.
        failed.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
        for (r, error) in failed {
            match &error {
                EngineError::RequestFailed(why) => {
                    tracing::error!(reason = %why, "a request panicked; ending it alone")
                }
                other => tracing::warn!(reason = %other, "a request cannot go on; ending it alone"),
            }
            let req = self.active.swap_remove(r);
            self.end(ctx, req.into(), Ending::Failed(error));
        }
    }

    /// Ends the requests whose every choice finished.
    fn retire_finished(&mut self, ctx: &mut LlamaContext<'_>) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].all_finished() {
                let req = self.active.swap_remove(i);
                self.end(ctx, req.into(), Ending::Finished);
            } else {
                i += 1;
            }
        }
    }

    /// Ends every running and waiting request with an error; what was generated is billed.
    fn abort_everything(&mut self, ctx: &mut LlamaContext<'_>) {
        for job in self.waiting.drain() {
            self.end(ctx, job.into(), Ending::Failed(EngineError::ShuttingDown));
        }
        if !self.active.is_empty() {
            self.fail_all(ctx, &EngineError::ShuttingDown);
        }
    }

    /// Ends every running request with `error` and empties the whole cache (a failed decode
    /// leaves every sequence's cells in doubt).
    fn fail_all(&mut self, ctx: &mut LlamaContext<'_>, error: &EngineError) {
        for req in std::mem::take(&mut self.active) {
            self.end(ctx, req.into(), Ending::Failed(error.clone()));
        }
        self.kv.clear_all(ctx);
    }

    /// After a panic in `run`: every running, waiting and still-queued request ends with `error`
    /// ([`Ending::Crashed`]: the context and the slot bookkeeping, which the panic may have left
    /// half-updated, are not touched).
    pub(crate) fn fail_after_panic(&mut self, ctx: &mut LlamaContext<'_>, error: &EngineError, jobs: &Receiver<Job>) {
        for req in std::mem::take(&mut self.active) {
            self.end(ctx, req.into(), Ending::Crashed(error.clone()));
        }
        for job in self.waiting.drain() {
            self.end(ctx, job.into(), Ending::Crashed(error.clone()));
        }
        while let Ok(job) = jobs.try_recv() {
            self.end(ctx, job.into(), Ending::Crashed(error.clone()));
        }
    }

    /// Ends the requests whose processing panicked (`(index in active, why)`): see
    /// [`Scheduler::end_alone`].
    fn end_panicked(&mut self, ctx: &mut LlamaContext<'_>, panicked: Vec<(usize, String)>) {
        let failed = panicked.into_iter().map(|(r, why)| (r, EngineError::RequestFailed(why))).collect();
        self.end_alone(ctx, failed);
    }
}

/// A request as queued for the scheduler.
pub(crate) struct Job {
    pub request: GenerateRequest,
    pub events: tokio::sync::mpsc::UnboundedSender<Event>,
    pub usage: tokio::sync::oneshot::Sender<Usage>,
    pub submitted_at: Instant,
}

impl Waiting for Job {
    fn owner(&self) -> crate::request::Owner {
        self.request.owner
    }

    fn tier(&self) -> crate::request::ServiceTier {
        self.request.tier
    }

    fn sequences(&self) -> usize {
        self.request.n as usize
    }
}
