//! `GET /admin/v1/stats`: the live figures the console's overview charts, from the same series
//! `/metrics` exports (see [`tap`]), with a 15-minute history in memory: a background task
//! samples the series every few seconds into a ring buffer of [`Point`]s.

pub(crate) mod histogram;
pub(crate) mod tap;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use self::histogram::Counts;
use self::tap::{label, TAP};
use crate::clock::now_ms;

/// How often the sampler records a point.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How much history is kept: 15 minutes.
pub(crate) const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The span per-model throughput is averaged over.
const RECENT: Duration = Duration::from_secs(60);

/// One model's series, as read at one moment.
#[derive(Clone, Debug, Default)]
struct ModelTotals {
    requests: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
    queue_depth: f64,
    running_sequences: f64,
    kv_tokens: f64,
    kv_capacity: f64,
}

/// Every series the console shows, as read at one moment (counters since the process started).
#[derive(Clone, Debug, Default)]
struct Totals {
    /// HTTP requests to `/v1/chat/completions`, whatever their status.
    chat_requests: u64,
    /// HTTP responses with a status of 400 or more, on any route, by status.
    errors: BTreeMap<String, u64>,
    models: BTreeMap<String, ModelTotals>,
    ttft: Vec<u64>,
    itl: Vec<u64>,
}

impl Totals {
    fn read() -> Self {
        let mut t = Totals {
            ttft: TAP.histogram("gantry_time_to_first_token_seconds"),
            itl: TAP.histogram("gantry_inter_token_latency_seconds"),
            ..Default::default()
        };
        for r in TAP.counters() {
            let n = r.value as u64;
            if r.name == "gantry_http_requests_total" {
                if label(&r.labels, "route") == "/v1/chat/completions" {
                    t.chat_requests += n;
                }
                let status = label(&r.labels, "status");
                if status.parse::<u16>().is_ok_and(|s| s >= 400) {
                    *t.errors.entry(status.to_string()).or_default() += n;
                }
                continue;
            }
            let m = t.models.entry(label(&r.labels, "model").to_string()).or_default();
            match r.name.as_str() {
                "gantry_requests_total" => m.requests += n,
                "gantry_prompt_tokens_total" => m.prompt_tokens += n,
                "gantry_cached_prompt_tokens_total" => m.cached_tokens += n,
                "gantry_completion_tokens_total" => m.completion_tokens += n,
                _ => {}
            }
        }
        for r in TAP.gauges() {
            let m = t.models.entry(label(&r.labels, "model").to_string()).or_default();
            match r.name.as_str() {
                "gantry_queue_depth" => m.queue_depth += r.value,
                "gantry_running_sequences" => m.running_sequences += r.value,
                "gantry_kv_cache_tokens" => m.kv_tokens += r.value,
                "gantry_kv_cache_capacity_tokens" => m.kv_capacity += r.value,
                _ => {}
            }
        }
        t
    }

    fn sum(&self, f: impl Fn(&ModelTotals) -> f64) -> f64 {
        self.models.values().map(f).sum()
    }
}

/// What happened over one sampling interval, and the gauges at its end.
#[derive(Clone, Debug)]
struct Point {
    at_ms: i64,
    seconds: f64,
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    errors: BTreeMap<String, u64>,
    queue_depth: f64,
    running_sequences: f64,
    kv_tokens: f64,
    kv_capacity: f64,
    ttft: Counts,
    itl: Counts,
    model_completion_tokens: BTreeMap<String, u64>,
}

impl Point {
    fn between(before: &Totals, after: &Totals, seconds: f64, at_ms: i64) -> Self {
        let model_tokens = |t: &Totals, id: &str| t.models.get(id).map_or(0, |m| m.completion_tokens);
        let errors = after
            .errors
            .iter()
            .map(|(s, n)| (s.clone(), n.saturating_sub(before.errors.get(s).copied().unwrap_or(0))))
            .filter(|(_, n)| *n > 0)
            .collect();
        Point {
            at_ms,
            seconds,
            requests: after.chat_requests.saturating_sub(before.chat_requests),
            prompt_tokens: (after.sum(|m| m.prompt_tokens as f64) - before.sum(|m| m.prompt_tokens as f64)).max(0.0)
                as u64,
            completion_tokens: (after.sum(|m| m.completion_tokens as f64) - before.sum(|m| m.completion_tokens as f64))
                .max(0.0) as u64,
            errors,
            queue_depth: after.sum(|m| m.queue_depth),
            running_sequences: after.sum(|m| m.running_sequences),
            kv_tokens: after.sum(|m| m.kv_tokens),
            kv_capacity: after.sum(|m| m.kv_capacity),
            ttft: Counts::between(&before.ttft, &after.ttft),
            itl: Counts::between(&before.itl, &after.itl),
            model_completion_tokens: after
                .models
                .keys()
                .map(|id| (id.clone(), model_tokens(after, id).saturating_sub(model_tokens(before, id))))
                .collect(),
        }
    }
}

struct History {
    last: Option<(Instant, Totals)>,
    points: VecDeque<Point>,
}

/// The sampled history behind `/admin/v1/stats`. Cheap to clone (shared).
#[derive(Clone)]
pub struct StatsHistory {
    started: Instant,
    inner: Arc<Mutex<History>>,
}

impl Default for StatsHistory {
    fn default() -> Self {
        Self { started: Instant::now(), inner: Arc::new(Mutex::new(History { last: None, points: VecDeque::new() })) }
    }
}

impl StatsHistory {
    /// Records a point now: what changed since the previous call (the first call only sets the
    /// baseline).
    pub fn sample(&self) {
        let now = Instant::now();
        let totals = Totals::read();
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, before)) = &h.last {
            let point = Point::between(before, &totals, now.duration_since(*at).as_secs_f64(), now_ms());
            h.points.push_back(point);
            let keep = (WINDOW.as_secs() / SAMPLE_EVERY.as_secs()) as usize;
            while h.points.len() > keep {
                h.points.pop_front();
            }
        }
        h.last = Some((now, totals));
    }

    /// Samples every [`SAMPLE_EVERY`] for the life of the process.
    pub fn start_sampling(&self) {
        let history = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                history.sample();
            }
        });
    }

    pub(crate) fn view(&self) -> Value {
        let now = Totals::read();
        let h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let points: Vec<&Point> = h.points.iter().collect();
        json!({
            "object": "stats",
            "uptime_seconds": self.started.elapsed().as_secs(),
            "sample_seconds": SAMPLE_EVERY.as_secs(),
            "window_seconds": WINDOW.as_secs(),
            "now": now_view(&now),
            "window": window_view(&points),
            "series": points.iter().map(|p| point_view(p)).collect::<Vec<_>>(),
            "models": models_view(&now, &points),
        })
    }
}

fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

fn errors_view(errors: &BTreeMap<String, u64>) -> Value {
    Value::Object(errors.iter().map(|(s, n)| (s.clone(), json!(n))).collect::<Map<_, _>>())
}

fn now_view(t: &Totals) -> Value {
    json!({
        "requests_total": t.chat_requests,
        "prompt_tokens_total": t.sum(|m| m.prompt_tokens as f64) as u64,
        "cached_tokens_total": t.sum(|m| m.cached_tokens as f64) as u64,
        "completion_tokens_total": t.sum(|m| m.completion_tokens as f64) as u64,
        "queue_depth": t.sum(|m| m.queue_depth),
        "running_sequences": t.sum(|m| m.running_sequences),
        "kv_cache_tokens": t.sum(|m| m.kv_tokens),
        "kv_cache_capacity_tokens": t.sum(|m| m.kv_capacity),
        "errors_total": errors_view(&t.errors),
    })
}

fn quantiles(c: &Counts) -> Value {
    json!({"count": c.total(), "p50": c.quantile(0.5), "p95": c.quantile(0.95)})
}

fn window_view(points: &[&Point]) -> Value {
    let seconds: f64 = points.iter().map(|p| p.seconds).sum();
    let (mut ttft, mut itl, mut errors) = (Counts::default(), Counts::default(), BTreeMap::<String, u64>::new());
    for p in points {
        ttft.add(&p.ttft);
        itl.add(&p.itl);
        for (s, n) in &p.errors {
            *errors.entry(s.clone()).or_default() += n;
        }
    }
    let requests: u64 = points.iter().map(|p| p.requests).sum();
    let completion: u64 = points.iter().map(|p| p.completion_tokens).sum();
    let prompt: u64 = points.iter().map(|p| p.prompt_tokens).sum();
    json!({
        "seconds": seconds,
        "requests": requests,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "requests_per_second": rate(requests, seconds),
        "completion_tokens_per_second": rate(completion, seconds),
        "errors": errors_view(&errors),
        "ttft_seconds": quantiles(&ttft),
        "inter_token_seconds": quantiles(&itl),
    })
}

fn point_view(p: &Point) -> Value {
    json!({
        "at_ms": p.at_ms,
        "requests_per_second": rate(p.requests, p.seconds),
        "prompt_tokens_per_second": rate(p.prompt_tokens, p.seconds),
        "completion_tokens_per_second": rate(p.completion_tokens, p.seconds),
        "queue_depth": p.queue_depth,
        "running_sequences": p.running_sequences,
        "kv_cache_tokens": p.kv_tokens,
        "kv_cache_capacity_tokens": p.kv_capacity,
        "ttft_p50": p.ttft.quantile(0.5),
        "ttft_p95": p.ttft.quantile(0.95),
        "itl_p50": p.itl.quantile(0.5),
        "itl_p95": p.itl.quantile(0.95),
        "errors": errors_view(&p.errors),
        "completion_tokens_per_second_by_model": Value::Object(
            p.model_completion_tokens.iter().map(|(id, n)| (id.clone(), json!(rate(*n, p.seconds)))).collect::<Map<_, _>>()
        ),
    })
}

fn models_view(now: &Totals, points: &[&Point]) -> Value {
    let recent_points = (RECENT.as_secs() / SAMPLE_EVERY.as_secs()) as usize;
    let recent = &points[points.len().saturating_sub(recent_points)..];
    let seconds: f64 = recent.iter().map(|p| p.seconds).sum();
    let data: Vec<Value> = now
        .models
        .iter()
        .map(|(id, m)| {
            let tokens: u64 = recent.iter().map(|p| p.model_completion_tokens.get(id).copied().unwrap_or(0)).sum();
            json!({
                "id": id,
                "requests_total": m.requests,
                "prompt_tokens_total": m.prompt_tokens,
                "cached_tokens_total": m.cached_tokens,
                "completion_tokens_total": m.completion_tokens,
                "completion_tokens_per_second_1m": rate(tokens, seconds),
                "queue_depth": m.queue_depth,
                "running_sequences": m.running_sequences,
                "kv_cache_tokens": m.kv_tokens,
                "kv_cache_capacity_tokens": m.kv_capacity,
            })
        })
        .collect();
    Value::Array(data)
}
