//! The console's copy of the live metrics. The process-wide recorder is a tee: everything goes
//! to Prometheus (`/metrics`) as before, and the few series the console charts also land in
//! [`Tap`], whose plain atomics the stats sampler reads. One measurement, two readers: the
//! console's figures are the ones `/metrics` exports, without parsing its text.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

use super::histogram::AtomicHistogram;

/// Counters the console reads, each kept per label set.
pub(crate) const COUNTERS: &[&str] = &[
    "gantry_http_requests_total",
    "gantry_requests_total",
    "gantry_prompt_tokens_total",
    "gantry_cached_prompt_tokens_total",
    "gantry_completion_tokens_total",
];
/// Gauges the console and `/metrics`' whole-server gauges read, each kept per label set.
pub(crate) const GAUGES: &[&str] = &[
    "gantry_queue_depth",
    "gantry_running_sequences",
    "gantry_kv_cache_tokens",
    "gantry_kv_cache_active_tokens",
    "gantry_kv_cache_capacity_tokens",
];
/// Histograms the console reads, summed over labels (models).
pub(crate) const HISTOGRAMS: &[&str] = &["gantry_time_to_first_token_seconds", "gantry_inter_token_latency_seconds"];

/// The console's series: written through the recorder, read by the sampler.
#[derive(Default)]
pub(crate) struct Tap {
    counters: Mutex<HashMap<Key, Arc<AtomicU64>>>,
    /// f64 bits.
    gauges: Mutex<HashMap<Key, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<String, Arc<AtomicHistogram>>>,
}

/// The one tap of this process (empty until [`TeeRecorder`] is installed, as in router tests).
pub(crate) static TAP: LazyLock<Tap> = LazyLock::new(Tap::default);

/// A series' label value, e.g. `label(key, "model")`.
pub(crate) fn label<'a>(labels: &'a [(String, String)], name: &str) -> &'a str {
    labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or("")
}

/// One series as read: its name, labels and current value.
pub(crate) struct Reading {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

fn readings(map: &Mutex<HashMap<Key, Arc<AtomicU64>>>, decode: impl Fn(u64) -> f64) -> Vec<Reading> {
    let map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.iter()
        .map(|(key, cell)| Reading {
            name: key.name().to_string(),
            labels: key.labels().map(|l| (l.key().to_string(), l.value().to_string())).collect(),
            value: decode(cell.load(Ordering::Relaxed)),
        })
        .collect()
}

impl Tap {
    pub(crate) fn counters(&self) -> Vec<Reading> {
        readings(&self.counters, |v| v as f64)
    }

    pub(crate) fn gauges(&self) -> Vec<Reading> {
        readings(&self.gauges, f64::from_bits)
    }

    /// Cumulative bucket counts of a histogram (all zero before its first observation).
    pub(crate) fn histogram(&self, name: &str) -> Vec<u64> {
        self.histogram_cell(name).snapshot()
    }

    fn histogram_cell(&self, name: &str) -> Arc<AtomicHistogram> {
        let mut map = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.to_string()).or_default().clone()
    }

    fn cell(map: &Mutex<HashMap<Key, Arc<AtomicU64>>>, key: &Key) -> Arc<AtomicU64> {
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.clone()).or_default().clone()
    }
}

/// Sends every metric to Prometheus and the console's series to [`TAP`] as well.
pub(crate) struct TeeRecorder<R> {
    pub inner: R,
}

struct TeeCounter(Counter, Arc<AtomicU64>);
struct TeeGauge(Gauge, Arc<AtomicU64>);
struct TeeHistogram(Histogram, Arc<AtomicHistogram>);

impl CounterFn for TeeCounter {
    fn increment(&self, value: u64) {
        self.0.increment(value);
        self.1.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.absolute(value);
        self.1.fetch_max(value, Ordering::Relaxed);
    }
}

impl GaugeFn for TeeGauge {
    fn increment(&self, value: f64) {
        self.0.increment(value);
        let _ =
            self.1.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some((f64::from_bits(b) + value).to_bits()));
    }
    fn decrement(&self, value: f64) {
        self.increment(-value);
    }
    fn set(&self, value: f64) {
        self.0.set(value);
        self.1.store(value.to_bits(), Ordering::Relaxed);
    }
}

impl HistogramFn for TeeHistogram {
    fn record(&self, value: f64) {
        self.0.record(value);
        self.1.record(value);
    }
}

impl<R: Recorder> Recorder for TeeRecorder<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description)
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description)
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description)
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let inner = self.inner.register_counter(key, metadata);
        if !COUNTERS.contains(&key.name()) {
            return inner;
        }
        Counter::from_arc(Arc::new(TeeCounter(inner, Tap::cell(&TAP.counters, key))))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        let inner = self.inner.register_gauge(key, metadata);
        if !GAUGES.contains(&key.name()) {
            return inner;
        }
        Gauge::from_arc(Arc::new(TeeGauge(inner, Tap::cell(&TAP.gauges, key))))
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let inner = self.inner.register_histogram(key, metadata);
        if !HISTOGRAMS.contains(&key.name()) {
            return inner;
        }
        Histogram::from_arc(Arc::new(TeeHistogram(inner, TAP.histogram_cell(key.name()))))
    }
}
