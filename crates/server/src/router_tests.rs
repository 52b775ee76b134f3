//! The router driven in-process (`oneshot`) by a scripted engine: what the HTTP layer makes of
//! engine events and engine refusals, without loading a model. Test-only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gantry_accounts::Accounts;
use gantry_engine::{
    ChatInput, EngineError, Event, FinishReason, GenerateRequest, GenerationHandle, Generator, Health, ImageError,
    ImageInput, Limits, ModelInfo, Outcome, PrepareError, Prompt, SubmitError, Usage,
};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::pool::{ModelLoader, ModelPool, ModelSpec, PoolOptions};
use crate::router::{routes, RouterOptions, Routes};
use crate::state::AppState;

pub(crate) const KEY: &str = "sk-gantry-router-test-0123456789abcdefghij";
/// Another name clients may send for the scripted model.
pub(crate) const ALIAS: &str = "scripted-latest";

/// An engine that answers every submission with a fixed list of events, then a usage report.
/// Its `prepare` applies the real engine's checks ([`Limits`]) to a prompt of one token per
/// word, so refusals come from the same code as in production.
pub(crate) struct ScriptedEngine {
    info: ModelInfo,
    limits: Limits,
    events: Vec<Event>,
    usage: Usage,
    /// Set as the script ends: the health a failed engine reports.
    fail_with: Option<String>,
    health: Arc<tokio::sync::watch::Sender<Health>>,
    submitted: Mutex<Vec<u32>>,
    /// Each submission's prompt length (a token per word).
    pub prompts: Mutex<Vec<usize>>,
    /// Called for each request's images, which it then attaches as none (see `attaching`).
    on_attach: Option<Box<dyn Fn() + Send + Sync>>,
}

impl ScriptedEngine {
    pub(crate) fn new(events: Vec<Event>, usage: Usage) -> Self {
        Self {
            info: ModelInfo {
                path: PathBuf::from("scripted.gguf"),
                n_vocab: 1000,
                n_ctx_train: 64,
                size_bytes: 0,
                n_params: 0,
                supports_vision: false,
                image_marker: None,
                chat_template: Some(String::new()),
            },
            limits: Limits { ctx_size: 64, slots: 2, per_key: None, n_vocab: 1000 },
            events,
            usage,
            fail_with: None,
            health: Arc::new(tokio::sync::watch::Sender::new(Health::Ready)),
            submitted: Mutex::new(Vec::new()),
            prompts: Mutex::new(Vec::new()),
            on_attach: None,
        }
    }

    /// The same engine, for a model that reads images (its images are checked before the
    /// engine sees them; it attaches none).
    pub(crate) fn seeing(mut self) -> Self {
        self.info.supports_vision = true;
        self
    }

    /// The same engine, accepting a request's images (leaving its prompt as it is) after
    /// calling `probe`, where the real engine decodes them.
    pub(crate) fn attaching(mut self, probe: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_attach = Some(Box::new(probe));
        self
    }
}

impl Generator for ScriptedEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    fn prepare(&self, input: ChatInput) -> Result<GenerateRequest, PrepareError> {
        self.limits.check_request(&input)?;
        let words: Vec<i32> = input
            .messages
            .iter()
            .filter_map(|m| m["content"].as_str())
            .flat_map(str::split_whitespace)
            .map(|w| w.len() as i32)
            .collect();
        let max_tokens = self.limits.completion_budget(words.len() as u32, input.max_tokens)?;
        Ok(input.into_request(
            Prompt { text: String::new(), tokens: words, images: Vec::new(), typed: Vec::new() },
            max_tokens,
        ))
    }

    fn prepare_raw(&self, input: ChatInput, raw: gantry_engine::RawPrompt) -> Result<GenerateRequest, PrepareError> {
        self.limits.check_request(&input)?;
        // One token per word, as for chat.
        let tokens: Vec<i32> = match &raw.prompt {
            gantry_engine::PromptSource::Text(text) => text.split_whitespace().map(|w| w.len() as i32).collect(),
            gantry_engine::PromptSource::Tokens(tokens) => tokens.clone(),
        };
        let max_tokens = self.limits.completion_budget(tokens.len() as u32, input.max_tokens)?;
        Ok(input
            .into_request(Prompt { text: String::new(), tokens, images: Vec::new(), typed: Vec::new() }, max_tokens))
    }

    fn attach_images(&self, _: &mut GenerateRequest, _: Vec<ImageInput>) -> Result<(), PrepareError> {
        let probe = self.on_attach.as_ref().ok_or(PrepareError::Image(ImageError::NoVision))?;
        probe();
        Ok(())
    }

    fn submit(&self, request: GenerateRequest) -> Result<GenerationHandle, SubmitError> {
        self.submitted.lock().unwrap().push(request.n);
        self.prompts.lock().unwrap().push(request.prompt.tokens.len());
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        let (usage_tx, usage) = tokio::sync::oneshot::channel();
        let script = self.events.clone();
        let report = self.usage;
        let (health, fail_with) = (self.health.clone(), self.fail_with.clone());
        tokio::spawn(async move {
            for event in script {
                // As the real engine: it is marked failed before it answers its requests.
                if let (Event::Error(_), Some(why)) = (&event, &fail_with) {
                    health.send_replace(Health::Failed(why.clone()));
                }
                let _ = events_tx.send(event);
                tokio::task::yield_now().await;
            }
            let _ = usage_tx.send(report);
        });
        Ok(GenerationHandle { events, usage })
    }

    fn health(&self) -> Health {
        self.health.borrow().clone()
    }

    fn watch_health(&self) -> Option<tokio::sync::watch::Receiver<Health>> {
        Some(self.health.subscribe())
    }
}

/// Hands the pool the one scripted engine, counting the loads.
struct ScriptedLoader(Arc<ScriptedEngine>, Arc<AtomicUsize>);

impl ModelLoader for ScriptedLoader {
    fn estimate(&self, _: &ModelSpec) -> anyhow::Result<u64> {
        Ok(1)
    }
    fn load(&self, _: &ModelSpec) -> anyhow::Result<(Arc<dyn Generator>, u64)> {
        self.1.fetch_add(1, Ordering::SeqCst);
        let model: Arc<dyn Generator> = self.0.clone();
        Ok((model, 0))
    }
}

pub(crate) struct Harness {
    pub app: axum::Router,
    draining: crate::state::Draining,
    pub accounts: Accounts,
    pub meter: gantry_accounts::Meter,
    pub stats: crate::admin::stats::StatsHistory,
    /// How many times the pool loaded the model.
    pub loads: Arc<AtomicUsize>,
    pub prepare_gate: crate::openai::prepare_gate::PrepareGate,
    _dir: tempfile::TempDir,
}

pub(crate) async fn harness(engine: Arc<ScriptedEngine>) -> Harness {
    harness_with_admin(engine, None).await
}

/// A router over a scripted engine; `admin_token` turns on `/admin/v1` and the console.
pub(crate) async fn harness_with_admin(engine: Arc<ScriptedEngine>, admin_token: Option<&str>) -> Harness {
    harness_serving(engine, admin_token, Routes::All).await
}

/// As [`harness_with_admin`], with only the routes one listener of `--admin-listen` serves.
pub(crate) async fn harness_serving(engine: Arc<ScriptedEngine>, admin_token: Option<&str>, which: Routes) -> Harness {
    harness_with_options(engine, admin_token, RouterOptions::default(), which).await
}

pub(crate) async fn harness_with_options(
    engine: Arc<ScriptedEngine>,
    admin_token: Option<&str>,
    router_options: RouterOptions,
    which: Routes,
) -> Harness {
    harness_tweaked(engine, admin_token, router_options, which, |_| {}).await
}

/// As [`harness_with_options`], with `tweak` changing the state the router serves.
pub(crate) async fn harness_tweaked(
    engine: Arc<ScriptedEngine>,
    admin_token: Option<&str>,
    router_options: RouterOptions,
    which: Routes,
    tweak: impl FnOnce(&mut AppState),
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let accounts = Accounts::open_data_dir(dir.path()).await.unwrap();
    accounts.ensure_key(KEY, "router-test").await.unwrap();
    let meter = gantry_accounts::Meter::start(
        accounts.clone(),
        gantry_accounts::MeterConfig {
            instance_name: "router-test".into(),
            outbox_dir: dir.path().join("outbox"),
            heartbeat_timeout: std::time::Duration::from_secs(60),
            reservation_ttl: std::time::Duration::from_secs(3600),
            default_limits: Default::default(),
        },
    )
    .await
    .unwrap();
    let spec = ModelSpec {
        id: "scripted".into(),
        aliases: vec![ALIAS.into()],
        config: gantry_engine::EngineConfig::new("scripted.gguf"),
        pin: false,
        idle_unload: None,
        created: 0,
        shrinkable: crate::pool::Shrinkable::ALL,
        capabilities: gantry_engine::Capabilities::default(),
        prices: Vec::new(),
    };
    let options = PoolOptions { budget: 1 << 30, wait_for_room: std::time::Duration::from_secs(1) };
    let loads = Arc::new(AtomicUsize::new(0));
    let mut state = AppState {
        models: ModelPool::new(vec![spec], Box::new(ScriptedLoader(engine, loads.clone())), options),
        accounts: accounts.clone(),
        images: Default::default(),
        meter: meter.clone(),
        prices: Default::default(),
        admin_token: admin_token.map(Arc::from),
        draining: Default::default(),
        stats: crate::admin::stats::StatsHistory::default(),
        prepare_gate: crate::openai::prepare_gate::PrepareGate::new(4, 2),
        response_retention: std::time::Duration::from_secs(3600),
        response_storage: Default::default(),
        batches: Default::default(),
    };
    tweak(&mut state);
    let (draining, stats, prepare_gate) = (state.draining.clone(), state.stats.clone(), state.prepare_gate.clone());
    let app = routes(state, router_options, which);
    Harness { app, draining, accounts, meter, stats, loads, prepare_gate, _dir: dir }
}

impl Harness {
    pub(crate) async fn chat(&self, body: Value) -> (StatusCode, String) {
        let request = Request::post("/v1/chat/completions")
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        self.send(request).await
    }

    pub(crate) async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    async fn health(&self) -> (StatusCode, Value) {
        self.get_json("/health").await
    }

    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let (status, body) = self.send(Request::get(path).body(Body::empty()).unwrap()).await;
        (status, serde_json::from_str(&body).unwrap())
    }

    /// Completion tokens the ledger billed, once every usage write has landed.
    pub(crate) async fn billed_completion_tokens(&self) -> u64 {
        self.meter.shutdown(std::time::Duration::from_secs(10)).await;
        let usage = self.accounts.usage_summary().await.unwrap();
        usage.iter().map(|row| row.completion_tokens).sum()
    }
}

pub(crate) fn body(extra: Value) -> Value {
    let mut b = json!({"model": "scripted", "messages": [{"role": "user", "content": "say hello to the test"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

pub(crate) fn delta(text: &str) -> Event {
    Event::Delta { choice: 0, text: text.into(), logprobs: Vec::new() }
}

/// The JSON payloads of an SSE body, `[DONE]` included as a string.
fn sse_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_string())))
        .collect()
}

pub(crate) fn usage(completion_tokens: u32) -> Usage {
    Usage { prompt_tokens: 5, cached_tokens: 0, completion_tokens, reasoning_tokens: 0, outcome: Outcome::Completed }
}

#[tokio::test]
async fn streamed_deltas_become_chunks_ending_in_usage_and_done() {
    let events = vec![
        delta("Hel"),
        delta("lo"),
        Event::Finished { choice: 0, reason: FinishReason::Stop },
        Event::Done(usage(2)),
    ];
    let h = harness(Arc::new(ScriptedEngine::new(events, usage(2)))).await;
    let (status, text) = h.chat(body(json!({"stream": true, "stream_options": {"include_usage": true}}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let data = sse_data(&text);
    assert_eq!(data.last().unwrap(), "[DONE]", "{text}");
    let content: String = data.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "Hello");
    let finish: Vec<&Value> = data.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
    assert_eq!(finish, vec!["stop"]);
    let last = &data[data.len() - 2];
    assert_eq!(last["usage"]["completion_tokens"], 2);
    assert_eq!(last["usage"]["total_tokens"], 7);
    assert_eq!(h.billed_completion_tokens().await, 2);
}

#[tokio::test]
async fn an_engine_error_mid_stream_ends_it_with_a_server_error_event_and_bills_what_was_sent() {
    let events = vec![delta("partial"), Event::Error(EngineError::Decode("boom".into()))];
    let report = Usage { outcome: Outcome::Error, ..usage(3) };
    let h = harness(Arc::new(ScriptedEngine::new(events, report))).await;
    let (status, text) = h.chat(body(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&text);
    assert_eq!(data[1]["choices"][0]["delta"]["content"], "partial", "{text}");
    let last = data.last().unwrap();
    assert_eq!(last["error"]["type"], "server_error", "{text}");
    assert!(last["error"]["message"].as_str().unwrap().contains("boom"));
    assert!(!text.contains("[DONE]"), "an error ends the stream without [DONE]: {text}");
    assert_eq!(h.billed_completion_tokens().await, 3);
}

#[tokio::test]
async fn n_beyond_the_engine_slots_is_a_400_naming_n_and_never_reaches_it() {
    let engine = Arc::new(ScriptedEngine::new(vec![Event::Done(usage(1))], usage(1)));
    let h = harness(engine.clone()).await;
    let (status, text) = h.chat(body(json!({"n": 3}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "n");
    assert!(engine.submitted.lock().unwrap().is_empty());
    // At the limit it is served.
    let (status, _) = h.chat(body(json!({"n": 2}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(*engine.submitted.lock().unwrap(), vec![2]);
}

#[tokio::test]
async fn a_prompt_beyond_the_context_is_a_400_context_length_exceeded() {
    let engine = Arc::new(ScriptedEngine::new(vec![Event::Done(usage(1))], usage(1)));
    let h = harness(engine.clone()).await;
    let (status, text) = h.chat(body(json!({"max_tokens": 60}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    assert!(v["error"]["message"].as_str().unwrap().contains("maximum context length is 64 tokens"), "{text}");
    let (status, text) = h.chat(body(json!({"logit_bias": {"1000": 5}}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("\"param\":\"logit_bias\""), "{text}");
    assert!(engine.submitted.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_dead_engine_fails_its_requests_with_server_error_and_health_turns_503() {
    let crashed = EngineError::Crashed("scheduler panicked".into());
    let mut engine =
        ScriptedEngine::new(vec![delta("Hi"), Event::Error(crashed)], Usage { outcome: Outcome::Error, ..usage(4) });
    engine.fail_with = Some("scheduler panicked".into());
    let h = harness(Arc::new(engine)).await;
    assert_eq!(h.health().await.0, StatusCode::OK);

    let (status, text) = h.chat(body(json!({}))).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("scheduler panicked"), "{text}");

    let (status, health) = h.health().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health["status"], "failed");
    // Kubernetes' probes: restart it (liveness), and send it nothing meanwhile (readiness).
    for path in ["/health/live", "/health/ready"] {
        let (status, v) = h.get_json(path).await;
        assert_eq!((status, v["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("failed")), "{path}");
        assert!(v["error"].as_str().unwrap().contains("scheduler panicked"), "{path}: {v}");
    }
    // The tokens generated before the failure are billed.
    assert_eq!(h.billed_completion_tokens().await, 4);
}

#[tokio::test]
async fn readiness_turns_503_while_draining_or_without_the_database_and_liveness_stays_200() {
    let h = harness(Arc::new(ScriptedEngine::new(
        vec![delta("Hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))],
        usage(1),
    )))
    .await;
    let (status, v) = h.get_json("/health/ready").await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"status": "ready", "loaded_models": []})));
    let (status, text) = h.chat(body(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(h.get_json("/health/ready").await.1["loaded_models"], json!(["scripted"]));

    // A shutdown signal: no longer ready, and new requests are turned away with a retry hint.
    h.draining.start();
    let (status, v) = h.get_json("/health/ready").await;
    assert_eq!((status, v["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("draining")));
    assert_eq!(h.get_json("/health/live").await.0, StatusCode::OK, "draining is not dead");
    let request = Request::post("/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Body::from(body(json!({})).to_string()))
        .unwrap();
    let response = h.app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["code"], "server_shutting_down");
}

#[tokio::test]
async fn readiness_says_when_the_accounts_database_does_not_answer() {
    let h = harness(Arc::new(ScriptedEngine::new(vec![Event::Done(usage(0))], usage(0)))).await;
    assert_eq!(h.get_json("/health/ready").await.0, StatusCode::OK);
    h.accounts.close().await;
    // Readiness asks the database at most once a second: the next probe after that sees it gone.
    tokio::time::sleep(crate::health::DATABASE_STATE_TTL).await;
    let (status, v) = h.get_json("/health/ready").await;
    assert_eq!((status, v["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("database_unreachable")), "{v}");
    assert_eq!(h.get_json("/health/live").await.0, StatusCode::OK, "a database outage is no reason to restart");
}
