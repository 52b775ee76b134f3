//! `GET /metrics` in Prometheus text format, and per-route request counters; OpenTelemetry
//! traces in `traces`.
//!
//! The engine records its own metrics (tokens, queue, batch sizes, latencies) through the
//! `metrics` facade; this module installs the one process-wide Prometheus recorder they land in.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::admin::stats::tap::{TeeRecorder, TAP};

mod server_gauges;
/// OpenTelemetry traces of API requests, exported over OTLP/HTTP when `OTEL_*` asks.
pub(crate) mod traces;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the recorder (once per process; later calls reuse it).
pub(crate) fn install() {
    HANDLE.get_or_init(|| {
        let latency = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
        let batch = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full("gantry_batch_tokens".into()), &batch))
            .map_err(|e| e.to_string())
            .and_then(|b| {
                // The console's live figures are a tee of the same series (crate::admin::stats::tap).
                let recorder = b.build_recorder();
                let handle = recorder.handle();
                metrics::set_global_recorder(TeeRecorder { inner: recorder })
                    .map(|()| handle)
                    .map_err(|_| "another metrics recorder is already installed".to_string())
            });
        match handle {
            Ok(h) => {
                describe_counter!("gantry_http_requests_total", Unit::Count, "HTTP requests by route and status.");
                describe_histogram!(
                    "gantry_http_request_duration_seconds",
                    Unit::Seconds,
                    "HTTP request latency by route."
                );
                describe_gauge!(
                    "gantry_model_loaded_bytes",
                    Unit::Bytes,
                    "Memory a loaded model takes (0 when unloaded), by model."
                );
                describe_counter!("gantry_model_loads_total", Unit::Count, "Model loads, by model.");
                describe_counter!(
                    "gantry_model_evictions_total",
                    Unit::Count,
                    "Models unloaded to make room for another, by model."
                );
                describe_histogram!("gantry_model_load_seconds", Unit::Seconds, "Time to load a model, by model.");
                Some(h)
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics recorder not installed; /metrics will be empty");
                None
            }
        }
    });
}

/// Loads (in the portable build) and reports which CPU kernels llama.cpp runs: the variant (chosen
/// for this CPU at start in the portable build, `built-in` otherwise: native to the build host for
/// `make build`, portable AVX2 in `make test`'s debug build) and its features, logged and exported
/// as `gantry_cpu_backend_info{variant="…", features="…", dot_kernels="…", small_batches="…"} 1`;
/// `dot_kernels` names whose Q8_0/Q5_0 (and with AVX-512 Q4_K/Q5_K/Q6_K/IQ4_XS) dot products run
/// (`--cpu-kernels`), put in place here, before any model loads, `small_batches` whose products of
/// those weights with a few rows of activations (Gantry's where ggml's CPU backend is linked in,
/// else llamafile's), and `repacked_weights` whether ggml copies Q4_0/Q4_K/IQ4_NL weights into its
/// repacked layout (`no` where Gantry's kernels read every such type of `models` as loaded).
pub(crate) fn report_cpu_backend(
    kernels: gantry_engine::CpuKernels,
    models: &[&std::path::Path],
) -> anyhow::Result<()> {
    gantry_engine::load_cpu_backend().map_err(|e| anyhow::anyhow!("loading llama.cpp's CPU backend: {e}"))?;
    let variant = gantry_engine::cpu_backend_variant();
    let features = gantry_engine::cpu_backend_features().join(" ");
    let dot_kernels = gantry_engine::use_cpu_kernels(kernels, models);
    let small_batches = gantry_engine::small_batch_kernels();
    let repacked_weights = if gantry_engine::weights_repacked() { "yes" } else { "no" };
    tracing::info!(
        variant = %variant, features = %features, dot_kernels, small_batches, repacked_weights, "llama.cpp CPU backend"
    );
    describe_gauge!(
        "gantry_cpu_backend_info",
        "Always 1; variant names the build of ggml's CPU backend that runs, features the CPU features it was built with, dot_kernels whose Q8_0/Q5_0/Q4_0 (with AVX-512 also Q4_K/Q5_K/Q6_K/IQ4_XS) dot products run, small_batches whose products of those weights with a few rows of activations, repacked_weights whether ggml keeps repacked copies of Q4_0/Q4_K/IQ4_NL weights (not where Gantry's kernels serve every such type of the models)."
    );
    gauge!(
        "gantry_cpu_backend_info",
        "variant" => variant, "features" => features, "dot_kernels" => dot_kernels, "small_batches" => small_batches,
        "repacked_weights" => repacked_weights
    )
    .set(1.0);
    Ok(())
}

/// Logs and exports the GPUs llama.cpp can offload to, as `gantry_gpu_info{device, name}` 1 and
/// `gantry_gpu_memory_total_bytes` / `gantry_gpu_memory_free_bytes{device}` (free memory as at
/// start; a model loaded since uses some of it). A CPU build has none; one built with `cuda`
/// and started without a usable GPU says so.
pub(crate) fn report_accelerators(gpu_layers_asked: bool) {
    let found = gantry_engine::accelerators();
    if found.is_empty() {
        if gantry_engine::gpu_backend_compiled() {
            tracing::warn!("built with a GPU backend, but no GPU was found: everything runs on the CPU");
        } else if gpu_layers_asked {
            tracing::warn!("--n-gpu-layers has no effect: this is a CPU build (make build-gpu builds with CUDA)");
        }
    }
    describe_gauge!("gantry_gpu_info", "Always 1 per GPU llama.cpp can offload to; labels name it.");
    describe_gauge!("gantry_gpu_memory_total_bytes", Unit::Bytes, "A GPU's memory.");
    describe_gauge!("gantry_gpu_memory_free_bytes", Unit::Bytes, "A GPU's free memory at start.");
    for gpu in found {
        tracing::info!(device = %gpu.name, name = %gpu.description, backend = %gpu.backend,
            memory_total = gpu.memory_total, memory_free = gpu.memory_free, "GPU");
        gauge!("gantry_gpu_info", "device" => gpu.name.clone(), "name" => gpu.description).set(1.0);
        gauge!("gantry_gpu_memory_total_bytes", "device" => gpu.name.clone()).set(gpu.memory_total as f64);
        gauge!("gantry_gpu_memory_free_bytes", "device" => gpu.name).set(gpu.memory_free as f64);
    }
}

/// A model finished loading: `gantry_model_loaded_bytes{model}`, `gantry_model_loads_total{model}`
/// and the load's duration.
pub(crate) fn model_loaded(model: &str, bytes: u64, took: std::time::Duration) {
    gauge!("gantry_model_loaded_bytes", "model" => model.to_string()).set(bytes as f64);
    counter!("gantry_model_loads_total", "model" => model.to_string()).increment(1);
    histogram!("gantry_model_load_seconds", "model" => model.to_string()).record(took.as_secs_f64());
}

/// A model was unloaded: evicted to make room for another (`gantry_model_evictions_total{model}`)
/// or by an operator.
pub(crate) fn model_unloaded(model: &str, evicted: bool) {
    gauge!("gantry_model_loaded_bytes", "model" => model.to_string()).set(0.0);
    if evicted {
        counter!("gantry_model_evictions_total", "model" => model.to_string()).increment(1);
    }
}

pub(crate) async fn render() -> Response {
    let body = match HANDLE.get().and_then(Option::as_ref) {
        Some(handle) => {
            let vllm_model = VLLM_MODEL_NAME.get().map(String::as_str);
            handle.render() + &server_gauges::render(&TAP.gauges(), vllm_model)
        }
        None => String::new(),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// The `model_name` of the vLLM aliases, once `--metrics-compat vllm` asks for them.
static VLLM_MODEL_NAME: OnceLock<String> = OnceLock::new();

/// `/metrics` also exports the whole-server gauges under vLLM's names, labelled `model_name`.
pub(crate) fn export_vllm_aliases(model_name: &str) {
    let _ = VLLM_MODEL_NAME.set(model_name.to_string());
}

/// A bounded set of route labels, so arbitrary URLs cannot blow up metric cardinality.
fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/models" => "/v1/models",
        "/health" => "/health",
        "/health/live" => "/health/live",
        "/health/ready" => "/health/ready",
        "/metrics" => "/metrics",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        _ => "other",
    }
}

pub(crate) async fn track_http(req: Request, next: Next) -> Response {
    let route = route_label(req.uri().path());
    let started = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    counter!("gantry_http_requests_total", "route" => route, "status" => status).increment(1);
    // For streams this is the time to the response head; token latencies live in the engine's
    // time-to-first-token and inter-token histograms.
    histogram!("gantry_http_request_duration_seconds", "route" => route).record(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::route_label;

    #[test]
    fn route_labels_are_bounded() {
        assert_eq!(route_label("/v1/models/qwen"), "/v1/models/{id}");
        assert_eq!(route_label("/v1/chat/completions"), "/v1/chat/completions");
        assert_eq!(route_label("/wp-admin/x.php"), "other");
    }
}
