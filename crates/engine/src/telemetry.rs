//! Engine metrics through the `metrics` facade; the server installs the Prometheus recorder.
//! Without a recorder (tests, library use) every call is a no-op.

use std::cell::RefCell;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};

use crate::request::Usage;

thread_local! {
    /// The `model` label of this scheduler thread's metrics: each engine runs on its own.
    static MODEL: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Labels every metric this thread records with `model` (called as a scheduler thread starts).
pub(crate) fn set_model(model: &str) {
    MODEL.with(|m| *m.borrow_mut() = model.to_string());
}

pub(crate) fn model() -> String {
    MODEL.with(|m| m.borrow().clone())
}

pub(crate) fn describe() {
    describe_counter!("gantry_prompt_tokens_total", Unit::Count, "Prompt tokens of finished requests.");
    describe_counter!(
        "gantry_cached_prompt_tokens_total",
        Unit::Count,
        "Prompt tokens taken from the prefix cache instead of being computed."
    );
    describe_counter!("gantry_completion_tokens_total", Unit::Count, "Tokens generated.");
    describe_counter!("gantry_requests_total", Unit::Count, "Requests the engine finished, by model and outcome.");
    describe_gauge!("gantry_prefix_cache_hit_ratio", "Cached prompt tokens / prompt tokens, since start.");
    describe_gauge!("gantry_queue_depth", Unit::Count, "Requests waiting for a sequence slot.");
    describe_gauge!("gantry_running_sequences", Unit::Count, "Sequences being prefilled or decoded.");
    describe_gauge!(
        "gantry_kv_cache_tokens",
        Unit::Count,
        "Tokens held in the KV cache, summed over sequences (shared prefixes counted per sequence)."
    );
    describe_gauge!(
        "gantry_kv_cache_active_tokens",
        Unit::Count,
        "Tokens the KV cache holds for running requests' sequences: gantry_kv_cache_tokens less the \
         prefixes idle sequences keep for reuse."
    );
    describe_gauge!("gantry_kv_cache_capacity_tokens", Unit::Count, "KV cache size in tokens (0 once unloaded).");
    describe_gauge!("gantry_host_cache_bytes", Unit::Bytes, "Idle sequences' KV entries held in host memory.");
    describe_gauge!("gantry_host_cache_entries", Unit::Count, "Token lists whose KV entries host memory holds.");
    describe_histogram!("gantry_batch_tokens", Unit::Count, "Tokens per llama.cpp decode call.");
    describe_counter!(
        "gantry_image_tokens_total",
        Unit::Count,
        "Prompt positions of images evaluated (encoded and decoded)."
    );
    describe_histogram!("gantry_image_eval_seconds", Unit::Seconds, "Encoding one image and decoding its embeddings.");
    describe_histogram!("gantry_time_to_first_token_seconds", Unit::Seconds, "From submission to the first token.");
    describe_histogram!("gantry_inter_token_latency_seconds", Unit::Seconds, "Between consecutive tokens of a choice.");
    describe_counter!("gantry_decode_steps_total", Unit::Count, "Scheduler steps that decoded a batch.");
    describe_counter!(
        "gantry_stalled_requests_total",
        Unit::Count,
        "Requests ended with a server_error because scheduler steps in a row gave them no work (a bug \
         to report; they would otherwise hang)."
    );
    describe_counter!(
        "gantry_decode_ubatches_total",
        Unit::Count,
        "Ubatches llama.cpp cut the decoded batches into: each is one more pass over the weights (see \
         kv/ubatches.rs). Per step, against gantry_decode_steps_total."
    );
    describe_counter!(
        "gantry_decode_graphs_reused_total",
        Unit::Count,
        "Ubatches for which llama.cpp reused the previous compute graph instead of building one \
         (scheduler/step/graph_reuse.rs). Against gantry_decode_ubatches_total."
    );
    describe_counter!(
        "gantry_step_phase_microseconds_total",
        Unit::Microseconds,
        "Time of decoding steps by phase: plan (admission, cache moves, the batch), decode (llama.cpp's \
         decode call: building the graph and, on a CPU, computing it), sync (waiting for the device to \
         finish it), sample (reading logits or device tokens, sampling, stop strings, streaming), finish \
         (retiring finished requests)."
    );
    describe_counter!(
        "gantry_step_part_microseconds_total",
        Unit::Microseconds,
        "Parts of two phases of gantry_step_phase_microseconds_total. Of plan: admit (taking waiting \
         requests in, finding and copying their cached prefixes), cache (moving idle sequences to host \
         memory, running ones down into gaps), batch (drafts, the planner, writing the batch). Of \
         sample: pick (every choice's first token, in parallel), produce (drafts walked, stop strings, \
         text and events out)."
    );
}

#[derive(Debug, Default)]
pub(crate) struct StepStats {
    pub batch_tokens: usize,
    pub running: usize,
    pub waiting: usize,
    pub kv_tokens: usize,
    /// Of `kv_tokens`, those of running requests' sequences.
    pub kv_active_tokens: usize,
    pub kv_capacity: usize,
    pub host_cache_bytes: usize,
    pub host_cache_entries: usize,
}

pub(crate) fn step(s: &StepStats) {
    if s.batch_tokens > 0 {
        histogram!("gantry_batch_tokens", "model" => model()).record(s.batch_tokens as f64);
    }
    gauge!("gantry_running_sequences", "model" => model()).set(s.running as f64);
    gauge!("gantry_queue_depth", "model" => model()).set(s.waiting as f64);
    gauge!("gantry_kv_cache_tokens", "model" => model()).set(s.kv_tokens as f64);
    gauge!("gantry_kv_cache_active_tokens", "model" => model()).set(s.kv_active_tokens as f64);
    gauge!("gantry_kv_cache_capacity_tokens", "model" => model()).set(s.kv_capacity as f64);
    gauge!("gantry_host_cache_bytes", "model" => model()).set(s.host_cache_bytes as f64);
    gauge!("gantry_host_cache_entries", "model" => model()).set(s.host_cache_entries as f64);
}

/// The plan phase's parts (see `gantry_step_part_microseconds_total`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PlanParts {
    pub admit: Duration,
    pub cache: Duration,
    pub batch: Duration,
}

impl PlanParts {
    fn total(&self) -> Duration {
        self.admit + self.cache + self.batch
    }
}

/// The sample phase's parts (see `gantry_step_part_microseconds_total`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SampleParts {
    pub pick: Duration,
    pub produce: Duration,
}

/// Where one decoding step's time went (see `gantry_step_phase_microseconds_total`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StepPhases {
    pub plan: PlanParts,
    pub decode: Duration,
    pub sync: Duration,
    pub sample: SampleParts,
    pub finish: Duration,
    /// Ubatches the step's batch was cut into.
    pub ubatches: usize,
    /// Of those, the ones that reused the previous graph.
    pub graphs_reused: u64,
}

pub(crate) fn step_phases(p: &StepPhases) {
    counter!("gantry_decode_steps_total", "model" => model()).increment(1);
    counter!("gantry_decode_ubatches_total", "model" => model()).increment(p.ubatches as u64);
    counter!("gantry_decode_graphs_reused_total", "model" => model()).increment(p.graphs_reused);
    let phases = [
        ("plan", p.plan.total()),
        ("decode", p.decode),
        ("sync", p.sync),
        ("sample", p.sample.pick + p.sample.produce),
        ("finish", p.finish),
    ];
    for (phase, took) in phases {
        counter!("gantry_step_phase_microseconds_total", "model" => model(), "phase" => phase).increment(micros(took));
    }
    let parts = [
        ("admit", p.plan.admit),
        ("cache", p.plan.cache),
        ("batch", p.plan.batch),
        ("pick", p.sample.pick),
        ("produce", p.sample.produce),
    ];
    for (part, took) in parts {
        counter!("gantry_step_part_microseconds_total", "model" => model(), "part" => part).increment(micros(took));
    }
}

/// The facade's counters are integers: microseconds keep a step's phases apart.
fn micros(took: Duration) -> u64 {
    u64::try_from(took.as_micros()).unwrap_or(u64::MAX)
}

/// Totals since start, for the hit ratio gauge.
#[derive(Default)]
pub(crate) struct Totals {
    prompt: u64,
    cached: u64,
}

impl Totals {
    pub(crate) fn request_done(&mut self, usage: &Usage) {
        counter!("gantry_requests_total", "model" => model(), "outcome" => usage.outcome.as_str()).increment(1);
        counter!("gantry_prompt_tokens_total", "model" => model()).increment(usage.prompt_tokens as u64);
        counter!("gantry_cached_prompt_tokens_total", "model" => model()).increment(usage.cached_tokens as u64);
        counter!("gantry_completion_tokens_total", "model" => model()).increment(usage.completion_tokens as u64);
        if usage.outcome == crate::request::Outcome::Preempted {
            // What preempting batch and flex work costs: the rows it computed, to be computed again.
            let rows = (usage.prompt_tokens - usage.cached_tokens + usage.completion_tokens) as u64;
            counter!("gantry_preempted_rows_total", "model" => model()).increment(rows);
        }
        self.prompt += usage.prompt_tokens as u64;
        self.cached += usage.cached_tokens as u64;
        if self.prompt > 0 {
            gauge!("gantry_prefix_cache_hit_ratio", "model" => model()).set(self.cached as f64 / self.prompt as f64);
        }
    }
}

pub(crate) fn first_token(latency: Duration) {
    histogram!("gantry_time_to_first_token_seconds", "model" => model()).record(latency.as_secs_f64());
}

pub(crate) fn inter_token(latency: Duration) {
    histogram!("gantry_inter_token_latency_seconds", "model" => model()).record(latency.as_secs_f64());
}

/// One image's encode and decode, done by the scheduler.
pub(crate) fn image_evaluated(positions: usize, took: Duration) {
    counter!("gantry_image_tokens_total", "model" => model()).increment(positions as u64);
    histogram!("gantry_image_eval_seconds", "model" => model()).record(took.as_secs_f64());
}

/// Requests ended because no step could move them (`Scheduler::no_rows`).
pub(crate) fn stalled(requests: usize) {
    counter!("gantry_stalled_requests_total", "model" => model()).increment(requests as u64);
}
