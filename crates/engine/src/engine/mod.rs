//! The engine as the server holds it: [`Engine`] loads a model, starts the scheduler thread and
//! hands it requests through a channel; [`EngineConfig`] (`config.rs`) is everything it is
//! started with.

mod config;
mod warm_up;

pub use config::{default_threads, EngineConfig, DEFAULT_HOST_CACHE_MIB};

use std::num::NonZeroU32;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use llama_cpp_2::context::params::LlamaContextParams;

use crate::constraint::{Constraint, PreparedGrammars};
use crate::error::{panic_message, EngineError, SubmitError};
use crate::generator::{Generator, Health};
use crate::kv::cache::StreamCopies;
use crate::model::devices::accelerators;
use crate::model::raw_prompt::RawPrompt;
use crate::model::twins::q5_as_q8;
use crate::model::vision::ImageInput;
use crate::model::{LoadError, LoadedModel, ModelInfo};
use crate::prepare::{ChatInput, Limits, PrepareError};
use crate::request::{GenerateRequest, GenerationHandle, Owner};
use crate::scheduler::queue::shares::QueueShares;
use crate::scheduler::sample::device::{DeviceSampling, AUTO_MAX_STREAMS};
use crate::scheduler::Job;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::speculation::SpeculationStats;
use crate::{model, telemetry, tools, units};

/// Handle to the running engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    model: Arc<LoadedModel>,
    config: EngineConfig,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    queued: Arc<QueueShares>,
    abort: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    health: Arc<tokio::sync::watch::Sender<Health>>,
    spec_stats: Arc<SpeculationStats>,
    stalled: Arc<AtomicU64>,
}

impl Engine {
    /// Loads the model and starts the scheduler thread; returns once the context exists.
    pub fn start(mut config: EngineConfig) -> Result<Self, LoadError> {
        let threads = config.threads.unwrap_or_else(default_threads).max(1) as i32;
        model::memory::check_kv_type(&config.model_path, config.kv_type)?;
        let weights = match &config.q8_twin_dir {
            Some(dir) => q5_as_q8::weights_to_load(&config.model_path, dir),
            None => config.model_path.clone(),
        };
        let mmproj = config.mmproj_path.as_deref();
        let model = LoadedModel::load_weights(
            &config.model_path,
            &weights,
            mmproj,
            threads,
            &config.offload,
            config.special_tokens_in_content,
        )?;
        config.parallel = config.parallel.max(1);
        config.ctx_size = config.ctx_size.max(16);
        // Every running sequence needs one slot in each batch, plus room for prompt chunks.
        config.batch_size = config.batch_size.max(config.parallel + 16);
        if let Some(need) =
            model.vision.as_ref().and_then(|v| v.min_batch()).filter(|&n| n > config.batch_size as usize)
        {
            tracing::warn!(
                batch_size = config.batch_size,
                image_tokens = need,
                "this projector decodes an image in one batch: raising --batch-size to hold one"
            );
            config.batch_size = u32::try_from(need).unwrap_or(u32::MAX);
        }

        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), String>>(1);
        let thread_model = model.clone();
        let thread_model_path = config.model_path.clone();
        let queued = Arc::new(QueueShares::default());
        let thread_queued = queued.clone();
        let abort = Arc::new(AtomicBool::new(false));
        let thread_abort = abort.clone();
        let health = Arc::new(tokio::sync::watch::Sender::new(Health::Ready));
        let thread_health = health.clone();
        let stalled = Arc::new(AtomicU64::new(0));
        let sched_cfg = SchedulerConfig {
            ctx_size: config.ctx_size,
            parallel: config.parallel,
            batch_size: config.batch_size,
            stalled: stalled.clone(),
            panic_after_tokens: test_panic_hook(&config),
            speculation: config.speculation,
            host_cache_bytes: config.host_cache_bytes,
            decode_turns: config.decode_turns.clone(),
            layout: config.kv_layout,
            max_running_per_key: config.max_running_per_key,
            deterministic_greedy: config.deterministic_greedy,
            device_sampling: match config.device_sampling {
                DeviceSampling::On => true,
                DeviceSampling::Off => false,
                // The output layer is on a GPU when every layer is offloaded.
                DeviceSampling::Auto => all_on_gpu(&config, &model),
            },
            device_sampling_max_streams: device_sampling_max_streams(&config),
            kv_events: config.kv_events.clone(),
            kv_copies: kv_copies(&config, &model),
            prompt_rows_while_decoding: prompt_rows_while_decoding(&config, &model),
            #[cfg(test)]
            admission_log: config.admission_log.clone(),
            #[cfg(test)]
            endings_log: config.endings_log.clone(),
            #[cfg(test)]
            moves_log: config.moves_log.clone(),
        };
        let spec_stats = Arc::new(SpeculationStats::default());
        let thread_spec_stats = spec_stats.clone();
        let ctx_params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(config.ctx_size * config.parallel))
            .with_n_batch(config.batch_size)
            .with_n_ubatch(config.batch_size)
            .with_n_seq_max(config.parallel)
            .with_kv_unified(config.kv_layout.is_unified())
            .with_type_k(config.kv_type.llama())
            .with_type_v(config.kv_type.llama())
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let metrics_label = config.metrics_label.clone();
        let thread = std::thread::Builder::new()
            .name("gantry-scheduler".into())
            .spawn(move || {
                telemetry::set_model(&metrics_label);
                let mut ctx = match thread_model.llama.new_context(model::backend::llama_backend(), ctx_params) {
                    Ok(ctx) => ctx,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                warm_up::make_k_quant_copies(&mut ctx, &thread_model_path);
                let _ = ready_tx.send(Ok(()));
                let mut scheduler =
                    Scheduler::new(thread_model.clone(), sched_cfg, thread_queued, thread_abort, thread_spec_stats);
                // A panic must not leave requests hanging and budgets reserved: catch it, mark
                // the engine failed (so `/health` turns 503 and the server exits for its
                // supervisor to restart it), and answer everything it held. The scheduler's state
                // may be half-updated, so after this only its request channels are used.
                let ran = std::panic::catch_unwind(AssertUnwindSafe(|| scheduler.run(&mut ctx, &jobs_rx)));
                if let Err(payload) = ran {
                    let why = panic_message(payload.as_ref());
                    tracing::error!(reason = %why, "the scheduler thread panicked; failing every request");
                    thread_health.send_replace(Health::Failed(why.clone()));
                    scheduler.fail_after_panic(&mut ctx, &EngineError::Crashed(why), &jobs_rx);
                }
            })
            .map_err(|e| LoadError::Context(e.to_string()))?;
        // The grammar engine's view of the vocabulary takes a while to build; build it now, in
        // the background, rather than on the first request that asks for JSON.
        let warm = model.clone();
        let _ = std::thread::Builder::new().name("gantry-grammar-warmup".into()).spawn(move || {
            warm.warm_grammars();
        });
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(LoadError::Context(e)),
            Err(_) => return Err(LoadError::Context("scheduler thread exited".into())),
        }
        tracing::info!(
            model = %config.model_path.display(),
            ctx_size = config.ctx_size,
            parallel = config.parallel,
            threads,
            speculation = ?config.speculation,
            kv_layout = ?config.kv_layout,
            kv_type = %config.kv_type,
            "engine ready"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                model,
                config,
                jobs: Mutex::new(Some(jobs_tx)),
                queued,
                abort,
                thread: Mutex::new(Some(thread)),
                health,
                spec_stats,
                stalled,
            }),
        })
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.inner.model
    }

    /// Draft tokens verified and accepted since start (speculative decoding).
    pub fn speculation_stats(&self) -> &SpeculationStats {
        &self.inner.spec_stats
    }

    /// Requests ended as stalled since start (`EngineError::Stalled`): none unless the
    /// scheduler has a bug.
    pub fn stalled_requests(&self) -> u64 {
        self.inner.stalled.load(Ordering::Relaxed)
    }

    /// Requests submitted and still waiting for a slot.
    pub fn queued(&self) -> usize {
        self.inner.queued.total()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Queues a request. Events stream on the returned handle; dropping it cancels the request.
    pub fn submit(&self, request: GenerateRequest) -> Result<GenerationHandle, SubmitError> {
        let mut handles = self.submit_all(vec![request])?;
        handles.pop().ok_or(SubmitError::Stopped)
    }

    /// Queues every request or none (a completion of several prompts runs a job per prompt: a
    /// part refused would leave the others computing for an answer never given or billed).
    pub fn submit_all(&self, requests: Vec<GenerateRequest>) -> Result<Vec<GenerationHandle>, SubmitError> {
        let guard = self.inner.jobs.lock().expect("jobs lock");
        if let Health::Failed(why) = self.health() {
            return Err(SubmitError::Failed(why));
        }
        let sender = guard.as_ref().ok_or(SubmitError::Stopped)?;
        // Counted before sending (the scheduler lets go once it takes the job), within the key's
        // share of the queue (`QueueShares`): one key's or tenant's flood does not refuse the others.
        let owners: Vec<Owner> = requests.iter().map(|r| r.owner).collect();
        for (entered, &owner) in owners.iter().enumerate() {
            if let Err(waiting) = self.inner.queued.try_enter(owner, self.inner.config.max_queue) {
                owners[..entered].iter().for_each(|&o| self.inner.queued.leave(o));
                return Err(SubmitError::QueueFull(waiting));
            }
        }
        let mut handles = Vec::with_capacity(requests.len());
        for (sent, request) in requests.into_iter().enumerate() {
            let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
            let (usage_tx, usage_rx) = tokio::sync::oneshot::channel();
            let job = Job { request, events: events_tx, usage: usage_tx, submitted_at: std::time::Instant::now() };
            // Only a scheduler gone sends nothing more: those sent are answered as it ends.
            if sender.send(job).is_err() {
                owners[sent..].iter().for_each(|&o| self.inner.queued.leave(o));
                return Err(SubmitError::Stopped);
            }
            handles.push(GenerationHandle { events: events_rx, usage: usage_rx });
        }
        Ok(handles)
    }

    /// Watches the engine's health: the server exits once it turns `Failed`.
    pub fn watch_health(&self) -> tokio::sync::watch::Receiver<Health> {
        self.inner.health.subscribe()
    }

    pub fn limits(&self) -> Limits {
        Limits {
            ctx_size: self.inner.config.ctx_size,
            slots: self.inner.config.parallel,
            per_key: self.inner.config.max_running_per_key,
            n_vocab: self.inner.model.info().n_vocab,
        }
    }

    /// Cuts every running and waiting request: each ends with an error event and reports the
    /// tokens it generated. Used when shutdown's grace period runs out.
    pub fn abort_all(&self) {
        // An idle scheduler blocked on its queue has nothing to cut; a busy one sees the flag
        // at its next step.
        self.inner.abort.store(true, Ordering::Relaxed);
    }

    /// Stops accepting work, lets the scheduler finish what it has, and joins its thread.
    pub fn shutdown(&self) {
        self.inner.jobs.lock().expect("jobs lock").take();
        if let Some(t) = self.inner.thread.lock().expect("thread lock").take() {
            let _ = t.join();
        }
    }
}

impl Engine {
    /// `ignore_eos`: every end-of-generation token biased to -100, as OpenAI's strongest bias
    /// bans a token.
    fn ban_end_tokens(&self, input: &mut ChatInput) {
        if input.sampling.ignore_eos {
            let ends = self.inner.model.end_tokens().iter().map(|&t| (t, -100.0));
            input.sampling.logit_bias.extend(ends);
        }
    }
}

impl Generator for Engine {
    fn model_info(&self) -> &ModelInfo {
        self.inner.model.info()
    }

    fn prepare(&self, mut input: ChatInput) -> Result<GenerateRequest, PrepareError> {
        if input.answer_constraint.is_some() && self.inner.model.tool_call_tag().is_none() {
            // Without a tag token the answer-or-call union decides (see `answer_gate`).
            input.answer_constraint = None;
            input.lazy_tools = None;
        }
        let limits = self.limits();
        limits.check_request(&input)?;
        self.ban_end_tokens(&mut input);
        let model = &self.inner.model;
        let (prompt, mut thinking) = model.prepare_thinking(&input.messages, input.tools.as_deref(), input.thinking)?;
        // The context is checked before any grammar is compiled: a prompt that cannot fit costs
        // no compile. Images not yet fetched count as admission's reservation in `tokens`, but
        // the context is checked without them here and exactly once they are attached.
        let unplaced = prompt.tokens.iter().filter(|&&t| t < 0).count();
        let max_tokens =
            limits.completion_budget(units::count_u32(prompt.tokens.len() - unplaced), input.max_tokens)?;
        // Grammars compile here, off the scheduler thread, and travel with the request.
        let mut grammars = PreparedGrammars::default();
        if let Some((constraint, param)) = &input.constraint {
            let compiled = model.compile_constraint(constraint, input.cache_scope);
            grammars.output = Some(compiled.map_err(|reason| PrepareError::Grammar { param, reason })?);
        }
        // The grammars a call started under `auto` would switch to are compiled now too, so a bad
        // tool schema is a 400 before anything runs and the scheduler compiles none of them.
        if let Some(l) = &input.lazy_tools {
            let compile = |c: &Constraint| {
                model
                    .compile_constraint(c, input.cache_scope)
                    .map_err(|reason| PrepareError::Grammar { param: "tools", reason })
            };
            grammars.bare_call = Some(compile(&l.bare)?);
            grammars.tagged_call = Some(compile(&l.tagged)?);
            grammars.fenced_call = Some(compile(&Constraint::Lark(tools::fenced_call_grammar(&l.fenced_calls_rules)))?);
        }
        if let Some(plan) = thinking.as_mut() {
            plan.fit(max_tokens);
        }
        if let Some(answer) = &input.answer_constraint {
            let compiled = model.compile_constraint(answer, input.cache_scope);
            grammars.answer =
                Some(compiled.map_err(|reason| PrepareError::Grammar { param: "response_format", reason })?);
            // The gate's vocabulary scan runs once per model, here rather than on the scheduler
            // thread when the first such request is admitted.
            model.call_starts();
        }
        let mut request = input.into_request(prompt, max_tokens);
        request.grammars = grammars;
        request.thinking = thinking;
        Ok(request)
    }

    fn prepare_raw(&self, mut input: ChatInput, raw: RawPrompt) -> Result<GenerateRequest, PrepareError> {
        let limits = self.limits();
        limits.check_request(&input)?;
        self.ban_end_tokens(&mut input);
        // A FIM prompt's other files take what the completion leaves of the context.
        let ctx = limits.ctx_size as usize;
        let room = ctx.saturating_sub(input.max_tokens.map_or(ctx / 4, |m| m as usize));
        let prompt = self.inner.model.prepare_raw(&raw, room)?;
        let max_tokens = limits.completion_budget(units::count_u32(prompt.tokens.len()), input.max_tokens)?;
        Ok(input.into_request(prompt, max_tokens))
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        self.inner.model.tokenize_with(text, add_special, parse_special)
    }

    fn detokenize(&self, tokens: &[i32]) -> String {
        self.inner.model.detokenize(tokens, true)
    }

    fn attach_images(&self, request: &mut GenerateRequest, images: Vec<ImageInput>) -> Result<(), PrepareError> {
        self.inner.model.attach_images(&mut request.prompt, &images)?;
        let prompt_tokens = units::count_u32(request.prompt.tokens.len());
        request.max_tokens = self.limits().completion_budget(prompt_tokens, request.requested_max_tokens)?;
        Ok(())
    }

    fn submit(&self, request: GenerateRequest) -> Result<GenerationHandle, SubmitError> {
        Engine::submit(self, request)
    }

    fn submit_all(&self, requests: Vec<GenerateRequest>) -> Result<Vec<GenerationHandle>, SubmitError> {
        Engine::submit_all(self, requests)
    }

    fn health(&self) -> Health {
        self.inner.health.borrow().clone()
    }

    fn watch_health(&self) -> Option<tokio::sync::watch::Receiver<Health>> {
        Some(Engine::watch_health(self))
    }

    fn abort_all(&self) {
        Engine::abort_all(self);
    }

    fn shutdown(&self) {
        Engine::shutdown(self);
    }
}

/// Whether every layer, and with them the output layer and the KV cache, is on a GPU.
fn all_on_gpu(config: &EngineConfig, model: &LoadedModel) -> bool {
    !accelerators().is_empty() && config.offload.gpu_layers.is_none_or(|n| n > model.llama.n_layer())
}

/// On a CPU a step of `--batch-size` prompt rows takes seconds (512 rows of the default model:
/// about 2 s on 2 threads), and every decoding stream waits for it: one key's long prompt froze
/// the others' streams for that long per token. While sequences decode, a step reads at most a
/// quarter of the batch of prompt rows (at least 64), which costs the prompt little (a CPU's
/// time grows with the rows, not the steps) and cuts the streams' wait fourfold. A GPU runs
/// such a step in milliseconds and is left its whole batch.
fn prompt_rows_while_decoding(config: &EngineConfig, model: &LoadedModel) -> Option<usize> {
    (!all_on_gpu(config, model)).then(|| (config.batch_size as usize / 4).max(64))
}

/// KV entries are copied between streams on the device where the KV cache is on a GPU.
fn kv_copies(config: &EngineConfig, model: &LoadedModel) -> StreamCopies {
    match config.kv_copies {
        Some(copies) => copies,
        None if all_on_gpu(config, model) => StreamCopies::OnDevice,
        None => StreamCopies::ThroughHost,
    }
}

/// How many busy sequences still let a new request sample on the device: a few under `auto`
/// (`AUTO_MAX_STREAMS`), any number when forced `on` (or `off`, where it is never asked).
fn device_sampling_max_streams(config: &EngineConfig) -> usize {
    #[cfg(test)]
    if let Some(n) = config.device_sampling_max_streams {
        return n;
    }
    match config.device_sampling {
        DeviceSampling::Auto => AUTO_MAX_STREAMS,
        DeviceSampling::On | DeviceSampling::Off => usize::MAX,
    }
}

/// The engine-death test hook: `GANTRY_TEST_PANIC_AFTER_TOKENS=N` makes the scheduler thread
/// panic once its running requests have generated N tokens, so the failure path (errors to every
/// request, usage billed, `/health` 503, exit status 1) can be tested against the real binary.
/// Read once at start; unset, which it always is outside tests, it does nothing.
fn test_panic_hook(config: &EngineConfig) -> Option<u32> {
    #[cfg(test)]
    if config.panic_after_tokens.is_some() {
        return config.panic_after_tokens;
    }
    let _ = config;
    let hook = std::env::var("GANTRY_TEST_PANIC_AFTER_TOKENS").ok()?.parse().ok()?;
    tracing::warn!(after_tokens = hook, "GANTRY_TEST_PANIC_AFTER_TOKENS is set: the engine will panic on purpose");
    Some(hook)
}
