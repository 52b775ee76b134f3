//! Engine metrics through the `metrics` facade; the server installs the Prometheus recorder.
//! Without a recorder (tests, library use) every call is a no-op.
//!
//! A scheduler step records some twenty series. Each is registered once per thread and its
//! handle kept ([`counter`], [`gauge`], [`histogram`]): the facade's macros build the key anew
//! at every call (the model label's string, the labels' vector) and look it up in the registry,
//! which was most of the scheduler thread's allocations per token.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit};

use crate::request::Usage;

/// A series of this thread's model: its name and at most one more label.
type Series = (&'static str, Option<(&'static str, &'static str)>);

/// This thread's registered series.
#[derive(Default)]
struct Handles {
    counters: HashMap<Series, Counter>,
    gauges: HashMap<Series, Gauge>,
    histograms: HashMap<Series, Histogram>,
}

thread_local! {
    /// The `model` label of this scheduler thread's metrics: each engine runs on its own.
    static MODEL: RefCell<String> = const { RefCell::new(String::new()) };
    static HANDLES: RefCell<Handles> = RefCell::new(Handles::default());
}

/// Labels every metric this thread records with `model` (called as a scheduler thread starts).
pub(crate) fn set_model(model: &str) {
    MODEL.with(|m| *m.borrow_mut() = model.to_string());
    HANDLES.with(|h| *h.borrow_mut() = Handles::default());
}

fn model() -> String {
    MODEL.with(|m| m.borrow().clone())
}

/// The counter `name` of this thread's model, with `label` if any.
pub(crate) fn counter(name: &'static str, label: Option<(&'static str, &'static str)>) -> Counter {
    HANDLES.with(|h| {
        let mut h = h.borrow_mut();
        let handle = h.counters.entry((name, label)).or_insert_with(|| match label {
            None => metrics::counter!(name, "model" => model()),
            Some((key, value)) => metrics::counter!(name, "model" => model(), key => value),
        });
        handle.clone()
    })
}

/// The gauge `name` of this thread's model.
pub(crate) fn gauge(name: &'static str) -> Gauge {
    HANDLES.with(|h| {
        let mut h = h.borrow_mut();
        h.gauges.entry((name, None)).or_insert_with(|| metrics::gauge!(name, "model" => model())).clone()
    })
}

/// The histogram `name` of this thread's model.
pub(crate) fn histogram(name: &'static str) -> Histogram {
    HANDLES.with(|h| {
        let mut h = h.borrow_mut();
        h.histograms.entry((name, None)).or_insert_with(|| metrics::histogram!(name, "model" => model())).clone()
    })
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
        histogram("gantry_batch_tokens").record(s.batch_tokens as f64);
    }
    gauge("gantry_running_sequences").set(s.running as f64);
    gauge("gantry_queue_depth").set(s.waiting as f64);
    gauge("gantry_kv_cache_tokens").set(s.kv_tokens as f64);
    gauge("gantry_kv_cache_active_tokens").set(s.kv_active_tokens as f64);
    gauge("gantry_kv_cache_capacity_tokens").set(s.kv_capacity as f64);
    gauge("gantry_host_cache_bytes").set(s.host_cache_bytes as f64);
    gauge("gantry_host_cache_entries").set(s.host_cache_entries as f64);
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
    counter("gantry_decode_steps_total", None).increment(1);
    counter("gantry_decode_ubatches_total", None).increment(p.ubatches as u64);
    counter("gantry_decode_graphs_reused_total", None).increment(p.graphs_reused);
    let phases = [
        ("plan", p.plan.total()),
        ("decode", p.decode),
        ("sync", p.sync),
        ("sample", p.sample.pick + p.sample.produce),
        ("finish", p.finish),
    ];
    for (phase, took) in phases {
        counter("gantry_step_phase_microseconds_total", Some(("phase", phase))).increment(micros(took));
    }
    let parts = [
        ("admit", p.plan.admit),
        ("cache", p.plan.cache),
        ("batch", p.plan.batch),
        ("pick", p.sample.pick),
        ("produce", p.sample.produce),
    ];
    for (part, took) in parts {
        counter("gantry_step_part_microseconds_total", Some(("part", part))).increment(micros(took));
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
        counter("gantry_requests_total", Some(("outcome", usage.outcome.as_str()))).increment(1);
        counter("gantry_prompt_tokens_total", None).increment(usage.prompt_tokens as u64);
        counter("gantry_cached_prompt_tokens_total", None).increment(usage.cached_tokens as u64);
        counter("gantry_completion_tokens_total", None).increment(usage.completion_tokens as u64);
        if usage.outcome == crate::request::Outcome::Preempted {
            // What preempting batch and flex work costs: the rows it computed, to be computed again.
            let rows = (usage.prompt_tokens - usage.cached_tokens + usage.completion_tokens) as u64;
            counter("gantry_preempted_rows_total", None).increment(rows);
        }
        self.prompt += usage.prompt_tokens as u64;
        self.cached += usage.cached_tokens as u64;
        if self.prompt > 0 {
            gauge("gantry_prefix_cache_hit_ratio").set(self.cached as f64 / self.prompt as f64);
        }
    }
}

pub(crate) fn first_token(latency: Duration) {
    histogram("gantry_time_to_first_token_seconds").record(latency.as_secs_f64());
}

pub(crate) fn inter_token(latency: Duration) {
    histogram("gantry_inter_token_latency_seconds").record(latency.as_secs_f64());
}

/// One image's encode and decode, done by the scheduler.
pub(crate) fn image_evaluated(positions: usize, took: Duration) {
    counter("gantry_image_tokens_total", None).increment(positions as u64);
    histogram("gantry_image_eval_seconds").record(took.as_secs_f64());
}

/// Requests ended because no step could move them (`Scheduler::no_rows`).
pub(crate) fn stalled(requests: usize) {
    counter("gantry_stalled_requests_total", None).increment(requests as u64);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use metrics::{Key, KeyName, Metadata, Recorder, SharedString};

    use super::*;

    /// Counts registrations and keeps each counter's key and value.
    #[derive(Default)]
    struct Registry {
        counters: Mutex<Vec<(Key, Arc<AtomicU64>)>>,
    }

    impl Recorder for Registry {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let cell = Arc::new(AtomicU64::new(0));
            self.counters.lock().unwrap().push((key.clone(), cell.clone()));
            Counter::from_arc(cell)
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    fn labels(key: &Key) -> Vec<(String, String)> {
        key.labels().map(|l| (l.key().to_string(), l.value().to_string())).collect()
    }

    #[test]
    fn a_series_is_registered_once_per_model_and_keeps_its_labels() {
        let registry = Registry::default();
        metrics::with_local_recorder(&registry, || {
            set_model("m");
            for _ in 0..3 {
                counter("steps", Some(("phase", "plan"))).increment(2);
                counter("steps", None).increment(1);
            }
            set_model("n");
            counter("steps", None).increment(5);
        });
        let counters = registry.counters.lock().unwrap();
        let seen: Vec<_> =
            counters.iter().map(|(k, v)| (k.name().to_string(), labels(k), v.load(Ordering::Relaxed))).collect();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            seen,
            vec![
                ("steps".to_string(), vec![pair("model", "m"), pair("phase", "plan")], 6),
                ("steps".to_string(), vec![pair("model", "m")], 3),
                ("steps".to_string(), vec![pair("model", "n")], 5),
            ]
        );
    }
}
