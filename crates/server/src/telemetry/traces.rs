//! OpenTelemetry traces: one trace per API request, exported over OTLP/HTTP, off unless the
//! standard `OTEL_*` variables ask for it (`docs/observability.md`).
//!
//! The request's root span (`POST /v1/chat/completions`, kind server) is opened by
//! [`trace_request`], the outermost layer of the key-authenticated routes, under the client's
//! W3C `traceparent` when it sent one, and ends when the response's body has been sent (a stream:
//! when it ends, not when its headers leave). The code on the request's path reaches it through a
//! task-local ([`span`], [`annotate_request`]) rather than a parameter, so that the handlers'
//! signatures stay as axum takes them apart, and so that with tracing off nothing but one
//! `OnceLock` check is done per request. The engine's phases (queue, prefill, decode) run on the
//! scheduler's thread, which knows no trace: [`EngineTimeline`] times them from the events the
//! server reads, and records them after the fact with those times.
//!
//! Never recorded: prompt or answer text, API keys (the root carries the server's request id).

use std::sync::OnceLock;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use gantry_api::ApiError;
use gantry_engine::{Event, Usage};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use crate::request_id::RequestId;

/// The tracer, once [`start_from_env`] turned tracing on; unset (the default) means off.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

tokio::task_local! {
    /// The trace of the request whose handler runs in this task (set by [`trace_request`]).
    static CURRENT: RequestTrace;
}

/// The OTLP/HTTP encodings the exporter speaks (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// `http/protobuf`, the standard's default.
    Protobuf,
    /// `http/json`.
    Json,
}

/// What the environment asks of trace export, when it asks for any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceConfig {
    /// `service.name` of every span's resource: `OTEL_SERVICE_NAME`, else `gantry`.
    pub service_name: String,
    pub encoding: Encoding,
}

/// Reads the standard variables through `var` (the process environment, or a test's table).
/// `Ok(None)` is "tracing off": nothing set, `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none`. What Gantry cannot do (another exporter, gRPC) is an error, so
/// that a deployment that asks for traces does not silently get none.
pub(crate) fn config_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<TraceConfig>, String> {
    let set = |name: &str| var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let wanted = match set("OTEL_TRACES_EXPORTER") {
        Some(list) => {
            let names: Vec<&str> = list.split(',').map(str::trim).collect();
            if names.iter().any(|n| n.eq_ignore_ascii_case("none")) {
                return Ok(None);
            }
            if names.iter().any(|n| !n.eq_ignore_ascii_case("otlp")) {
                return Err(format!("OTEL_TRACES_EXPORTER={list}: Gantry exports traces only with `otlp` (or `none`)"));
            }
            true
        }
        // The exporter's own default endpoint (localhost:4318) is not reason enough to export.
        None => set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some(),
    };
    if !wanted {
        return Ok(None);
    }
    let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
    let encoding = match protocol.as_deref() {
        None | Some("http/protobuf") => Encoding::Protobuf,
        Some("http/json") => Encoding::Json,
        Some(other) => {
            return Err(format!(
                "OTLP protocol `{other}` is not supported: Gantry exports traces over HTTP (`http/protobuf` or `http/json`)"
            ))
        }
    };
    Ok(Some(TraceConfig { service_name: set("OTEL_SERVICE_NAME").unwrap_or_else(|| "gantry".into()), encoding }))
}

/// The running export; [`TraceExport::shutdown`] sends what is still buffered.
pub(crate) struct TraceExport {
    provider: SdkTracerProvider,
}

/// Turns tracing on when the environment asks for it. The SDK's batch processor exports from a
/// thread of its own with a blocking HTTP client (its default; an async client there would need
/// a runtime it does not have), reading `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER` (default: follow the
/// parent's sampled flag, else sample all), and the exporter `OTEL_EXPORTER_OTLP_*` (endpoint,
/// headers, timeout, compression).
pub(crate) fn start_from_env() -> anyhow::Result<Option<TraceExport>> {
    let Some(config) = config_from(|name| std::env::var(name).ok()).map_err(anyhow::Error::msg)? else {
        return Ok(None);
    };
    let protocol = match config.encoding {
        Encoding::Protobuf => opentelemetry_otlp::Protocol::HttpBinary,
        Encoding::Json => opentelemetry_otlp::Protocol::HttpJson,
    };
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(protocol).build()?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    if TRACER.set(provider.tracer("gantry")).is_err() {
        anyhow::bail!("trace export was already started in this process");
    }
    tracing::info!(service_name = %config.service_name, encoding = ?config.encoding, "exporting traces over OTLP/HTTP");
    Ok(Some(TraceExport { provider }))
}

impl TraceExport {
    /// Exports the spans still buffered and stops; blocks (call it off the async workers).
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "trace export did not shut down cleanly");
        }
    }
}

/// Whether traces are exported: [`trace_request`] is layered onto the routes only then.
pub(crate) fn enabled() -> bool {
    TRACER.get().is_some()
}

/// One request's trace: the context holding its root span.
#[derive(Clone)]
struct RequestTrace {
    root: Context,
}

impl RequestTrace {
    /// The trace of the request this task serves; `None` while tracing is off (one check, no
    /// allocation) or outside a traced request (a batch's line).
    fn current() -> Option<(Self, &'static SdkTracer)> {
        let tracer = TRACER.get()?;
        CURRENT.try_with(Clone::clone).ok().map(|trace| (trace, tracer))
    }

    /// Sets attributes on the root span.
    fn annotate(&self, attributes: impl IntoIterator<Item = KeyValue>) {
        self.root.span().set_attributes(attributes);
    }
}

/// A child span of the current request's, from now until it is dropped.
pub(crate) fn span(name: &'static str) -> Option<Span> {
    let (trace, tracer) = RequestTrace::current()?;
    Some(tracer.start_with_context(name, &trace.root))
}

/// Runs `work` in a child span of the current request's named `name`.
pub(crate) async fn in_span<T>(name: &'static str, work: impl std::future::Future<Output = T>) -> T {
    let _span = span(name);
    work.await
}

/// The request's model (as the client named it, and as served) and the tier it is billed in.
pub(crate) fn annotate_request(asked: &str, served: &str, tier: &'static str) {
    if let Some((trace, _)) = RequestTrace::current() {
        trace.annotate([
            KeyValue::new("gen_ai.request.model", asked.to_string()),
            KeyValue::new("gen_ai.response.model", served.to_string()),
            KeyValue::new("gantry.service_tier", tier),
        ]);
    }
}

/// The root span of a key-authenticated request, around everything the route does, its body
/// included. Outside the key check, so that a refused key is traced too.
pub(crate) async fn trace_request(req: Request, next: Next) -> Response {
    let Some(tracer) = TRACER.get() else { return next.run(req).await };
    let parent = TraceContextPropagator::new().extract(&Headers(req.headers()));
    // The route's pattern, not the path: ids in paths would make every span name unique.
    let route = req.extensions().get::<MatchedPath>().map_or("other", MatchedPath::as_str).to_string();
    let mut attributes = vec![
        KeyValue::new("http.request.method", req.method().as_str().to_string()),
        KeyValue::new("http.route", route.clone()),
    ];
    if let Some(RequestId(id)) = req.extensions().get::<RequestId>() {
        attributes.push(KeyValue::new("gantry.request_id", id.clone()));
    }
    let root = tracer
        .span_builder(format!("{} {route}", req.method()))
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    let trace = RequestTrace { root: parent.with_span(root) };
    let response = CURRENT.scope(trace.clone(), next.run(req)).await;
    let (attributes, failed) = response_attributes(response.status(), response.extensions().get::<ApiError>());
    trace.annotate(attributes);
    if let Some(error_type) = failed {
        trace.root.span().set_status(Status::error(error_type));
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(EndsRootWithBody { body, root: trace.root }))
}

/// The root's attributes from the answer: its status and, for a refusal or failure, the API
/// error's code, else its type (`error.type`: the code is the precise one, `rate_limit_exceeded`
/// where the type says `requests`; never its message, which may quote the request). A server error
/// also marks the span failed: `Some(its type)`; a client's error (4xx) does not, as the
/// semantic conventions have it for server spans.
pub(crate) fn response_attributes(status: StatusCode, error: Option<&ApiError>) -> (Vec<KeyValue>, Option<String>) {
    let mut attributes = vec![KeyValue::new("http.response.status_code", i64::from(status.as_u16()))];
    let error_type = (status.is_client_error() || status.is_server_error()).then(|| {
        error.map_or_else(|| status.as_u16().to_string(), |e| e.code.as_deref().unwrap_or(e.error_type).into())
    });
    if let Some(error_type) = &error_type {
        attributes.push(KeyValue::new("error.type", error_type.clone()));
    }
    (attributes, error_type.filter(|_| status.is_server_error()))
}

/// The request's token counts, as its usage reports them: the semantic conventions' names for
/// the billed ones, and the cache-hit length.
pub(crate) fn usage_attributes(usage: &Usage) -> Vec<KeyValue> {
    vec![
        KeyValue::new("gen_ai.usage.input_tokens", i64::from(usage.prompt_tokens)),
        KeyValue::new("gen_ai.usage.output_tokens", i64::from(usage.completion_tokens)),
        KeyValue::new("gen_ai.usage.cache_read.input_tokens", i64::from(usage.cached_tokens)),
        KeyValue::new("gantry.usage.reasoning_tokens", i64::from(usage.reasoning_tokens)),
    ]
}

/// The request's headers, as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The response's body, which ends the root span when it is dropped: once sent to its end, or
/// when the client left.
struct EndsRootWithBody {
    body: Body,
    root: Context,
}

impl http_body::Body for EndsRootWithBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for EndsRootWithBody {
    fn drop(&mut self) {
        self.root.span().end();
    }
}

/// When the engine's phases of one request began and ended, as seen from its events: `queue`
/// from the submission to `Event::Cached` (sent once the scheduler admitted it and its sequence
/// holds the cached prefix), `prefill` from there to the first token, `decode` from there to
/// `Event::Done`, and `settle` from there until the ledger journalled it
/// ([`EngineTimeline::settled`]). Recorded then, or when dropped (the client left: the phase it
/// was in ends there), with those times; a phase never reached is left out. Empty when untraced.
pub(crate) struct EngineTimeline(Option<Phases>);

struct Phases {
    trace: RequestTrace,
    tracer: &'static SdkTracer,
    submitted: SystemTime,
    /// When the engine admitted it, and the cache-hit length it reported then.
    admitted: Option<(SystemTime, u32)>,
    first_token: Option<SystemTime>,
    /// When it ended: `Done` with its usage, or an error (no usage).
    ended: Option<(SystemTime, Option<Usage>)>,
}

impl EngineTimeline {
    /// A timeline starting now, the request having just been submitted.
    pub(crate) fn start() -> Self {
        Self(RequestTrace::current().map(|(trace, tracer)| Phases {
            trace,
            tracer,
            submitted: SystemTime::now(),
            admitted: None,
            first_token: None,
            ended: None,
        }))
    }

    /// Notes the time of an event that moves the request to its next phase.
    pub(crate) fn observe(&mut self, event: &Event) {
        let Some(phases) = self.0.as_mut() else { return };
        let now = SystemTime::now();
        match event {
            Event::Cached { tokens } => {
                phases.admitted.get_or_insert((now, *tokens));
            }
            // Even an empty delta (text held back for a stop string) is a token sampled.
            Event::Delta { .. } | Event::Reasoning { .. } => {
                phases.first_token.get_or_insert(now);
            }
            Event::Done(usage) => phases.ended = Some((now, Some(*usage))),
            Event::Error(_) => {
                phases.ended = Some((now, None));
                phases.trace.annotate([KeyValue::new("error.type", "engine_error")]);
                phases.trace.root.span().set_status(Status::error("engine_error"));
            }
            Event::StopSequence { .. } | Event::Finished { .. } => {}
        }
    }

    /// The usage record is journalled: records the phases, settlement ending now.
    pub(crate) fn settled(&mut self) {
        if let Some(phases) = self.0.take() {
            phases.record_all();
        }
    }
}

impl Drop for EngineTimeline {
    fn drop(&mut self) {
        self.settled();
    }
}

impl Phases {
    fn record_all(self) {
        let now = SystemTime::now();
        let (ended, usage) = self.ended.unwrap_or((now, None));
        let Some((admitted, cached)) = self.admitted else {
            self.record("queue", (self.submitted, ended), Vec::new());
            return;
        };
        self.record("queue", (self.submitted, admitted), Vec::new());
        let mut prefill = vec![KeyValue::new("gen_ai.usage.cache_read.input_tokens", i64::from(cached))];
        if let Some(usage) = usage {
            prefill.push(KeyValue::new("gen_ai.usage.input_tokens", i64::from(usage.prompt_tokens)));
        }
        self.record("prefill", (admitted, self.first_token.unwrap_or(ended)), prefill);
        if let Some(first_token) = self.first_token {
            let output = usage.map(|u| KeyValue::new("gen_ai.usage.output_tokens", i64::from(u.completion_tokens)));
            self.record("decode", (first_token, ended), output.into_iter().collect());
        }
        if let Some(usage) = usage {
            self.record("settle", (ended, now), Vec::new());
            self.trace.annotate(usage_attributes(&usage));
        }
    }

    /// Records a finished phase as a child of the root.
    fn record(&self, name: &'static str, (start, end): (SystemTime, SystemTime), attributes: Vec<KeyValue>) {
        let builder = self.tracer.span_builder(name).with_start_time(start).with_attributes(attributes);
        builder.start_with_context(self.tracer, &self.trace.root).end_with_timestamp(end);
    }
}

#[cfg(test)]
#[path = "traces_tests.rs"]
mod tests;
