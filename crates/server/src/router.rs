//! The router: which routes each listener serves, behind the layers every listener shares.

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;

use crate::admin::{self, console};
use crate::openai::auth_failures::AuthFailures;
use crate::openai::{auth, models};
use crate::state::AppState;
use crate::{anthropic, cors, errors, health, pipeline, request_id, responses, telemetry, tokenize};

pub struct RouterOptions {
    pub body_limit: usize,
    /// The whole request body must arrive within this long of the request head (else 408).
    pub body_read_timeout: std::time::Duration,
    /// Failed authentications an address may make per minute before it gets 429 without a
    /// key lookup; 0 disables the limit.
    pub auth_failures_per_minute: u32,
    /// `/metrics` without the admin token on every listener (`--public-metrics`).
    pub public_metrics: bool,
    /// The accounts database's state as readiness last saw it; one per server, shared by its
    /// listeners.
    pub database_state: health::DatabaseState,
}

impl Default for RouterOptions {
    fn default() -> Self {
        Self {
            body_limit: 4 * 1024 * 1024,
            body_read_timeout: std::time::Duration::from_secs(crate::connections::DEFAULT_BODY_READ_TIMEOUT_SECS),
            auth_failures_per_minute: crate::openai::auth_failures::DEFAULT_AUTH_FAILURES_PER_MINUTE,
            public_metrics: false,
            database_state: health::DatabaseState::default(),
        }
    }
}

/// Which routes a listener serves; health answers on every listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    /// The API and the operator's routes (admin API, console, metrics): the one listener without
    /// `--admin-listen`. `/metrics` takes the admin token there, as a bearer token, unless
    /// `--public-metrics`.
    All,
    /// The API and the operator's routes on the admin listener (the console's playground calls
    /// the API on its own origin); `/metrics` is open there, for Prometheus to scrape.
    Admin,
    /// The API only: the public listener with `--admin-listen` (and `/metrics` with
    /// `--public-metrics`).
    Public,
    /// `/metrics` to anyone, and health: `--metrics-listen`.
    Metrics,
}

/// Everything on one listener: what `gantry serve` does without `--admin-listen`.
pub fn router(state: AppState, opts: RouterOptions) -> Router {
    routes(state, opts, Routes::All)
}

/// The routes `which` names, behind the layers every listener shares.
pub fn routes(state: AppState, opts: RouterOptions, which: Routes) -> Router {
    let key_auth = auth::KeyAuth { state: state.clone(), failures: AuthFailures::new(opts.auth_failures_per_minute) };
    let authed = Router::new()
        .route("/v1/chat/completions", post(pipeline::chat_completions))
        .route("/v1/completions", post(pipeline::completions))
        .route("/v1/chat/completions/render", post(crate::render::chat_render))
        .route("/v1/completions/render", post(crate::render::completions_render))
        .route("/v1/embeddings", post(crate::openai::embeddings::embeddings))
        .route("/v1/rerank", post(crate::rerank::rerank))
        .route("/rerank", post(crate::rerank::rerank))
        .route("/infill", post(pipeline::infill))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/v1/messages", post(pipeline::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(pipeline::responses))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/v1/models", get(models::list_models))
        .route("/v1/models/{*id}", get(models::get_model))
        .merge(crate::batches::routes(state.batches.max_file_bytes))
        .layer(DefaultBodyLimit::max(opts.body_limit))
        .route_layer(middleware::from_fn_with_state(key_auth, auth::require_api_key));
    // Outside the key check: a refused key's request is traced too. Only when traces are
    // exported (started before the routes are built), so that otherwise a request pays nothing.
    let authed = if telemetry::traces::enabled() {
        authed.route_layer(middleware::from_fn(telemetry::traces::trace_request))
    } else {
        authed
    };
    let health = Router::new()
        .route("/health", get(health::live))
        // Liveness is what /health always said: restart only once the engine failed.
        .route("/health/live", get(health::live))
        .route("/health/ready", {
            let database = opts.database_state.clone();
            get(move |state: axum::extract::State<AppState>| health::ready(state, database))
        });
    let open_metrics = || Router::new().route("/metrics", get(telemetry::render));
    // Prometheus scrapes the admin listener without credentials; the one listener of a server
    // without it is public, so there /metrics is an operator's route like the admin API.
    let gate = admin::AdminGate::new(state.clone());
    let operator = || admin::router(&gate);
    let app = match which {
        Routes::Metrics => health.merge(open_metrics()),
        Routes::Public if opts.public_metrics => health.merge(authed).merge(open_metrics()),
        Routes::Public => health.merge(authed),
        Routes::Admin => {
            health.merge(authed).merge(open_metrics()).nest("/admin/v1", operator()).merge(console::router())
        }
        Routes::All => {
            let metrics = if opts.public_metrics { open_metrics() } else { admin::guarded(&gate, open_metrics()) };
            health.merge(authed).merge(metrics).nest("/admin/v1", operator()).merge(console::router())
        }
    };
    app.fallback(errors::unknown_route)
        .method_not_allowed_fallback(errors::method_not_allowed)
        .with_state(state)
        .layer(middleware::from_fn_with_state(
            crate::body_guard::BodyGuard::new(opts.body_read_timeout),
            crate::body_guard::guard_body,
        ))
        .layer(middleware::from_fn(errors::errors_as_json))
        .layer(CatchPanicLayer::custom(|_| errors::internal_error().into_response()))
        .layer(middleware::from_fn(anthropic::errors_in_anthropic_shape))
        .layer(middleware::from_fn(telemetry::track_http))
        .layer(middleware::from_fn(request_id::assign))
        .layer(middleware::from_fn(cors::api_cors))
}
