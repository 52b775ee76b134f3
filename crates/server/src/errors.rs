//! Which status, OpenAI error type and code every failure gets: the one place a failure
//! becomes an [`ApiError`] (OpenAI's `{"error": …}` body, from `gantry-api`). Handlers name the
//! failure (an engine, pool, accounts or admission error, a refused key, a late body); this
//! module answers how the client is told. Errors in what the client sent (a bad parameter, an
//! image over a limit) are reported where they are checked, with the parameter they name.
//!
//! The mapping is a trait rather than `From` impls because of Rust's orphan rule: `ApiError`
//! lives in `gantry-api` and the engine's and accounts' errors in their own crates, none of
//! which depends on another (the API crate stays free of llama.cpp and databases, the engine
//! free of HTTP), so none can host `impl From<PrepareError> for ApiError`, and this crate may
//! not either.

use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gantry_accounts::{AccountsError, KeyInfo, RateRefusal, Refusal, Refused};
use gantry_api::ApiError;
use gantry_engine::{EmbedError, EngineError, ImageError, PrepareError, RawPromptError, SubmitError, TemplateError};

use crate::openai::rate_limit::{self, format_reset};
use crate::pool::PoolError;

pub(crate) trait IntoApiError {
    fn into_api_error(self) -> ApiError;
}

/// An embedding job's failures: the inputs' are the client's to fix (400s naming `input`).
impl IntoApiError for EmbedError {
    fn into_api_error(self) -> ApiError {
        let message = self.to_string();
        match self {
            EmbedError::NotEmbeddingModel { .. } => ApiError::invalid_request(message, Some("model")),
            EmbedError::TooLong { .. } => {
                let mut e = ApiError::invalid_value("input", message);
                e.code = Some("context_length_exceeded".into());
                e
            }
            EmbedError::Empty { .. } | EmbedError::OutsideVocabulary { .. } => {
                ApiError::invalid_value("input", message)
            }
            EmbedError::Decode(_) => ApiError::internal(message),
            EmbedError::Stopped => ApiError::overloaded("The embedding model stopped; try again.").with_retry_after(5),
            EmbedError::QueueFull(_) => ApiError::overloaded(message).with_retry_after(1),
        }
    }
}

/// Refusals before queueing: the client's to fix, so 400s naming the parameter.
impl IntoApiError for PrepareError {
    fn into_api_error(self) -> ApiError {
        let message = self.to_string();
        match self {
            PrepareError::ContextLength { .. } => ApiError::context_length_exceeded(message),
            PrepareError::TooManyChoices { .. } | PrepareError::TooManyChoicesPerKey { .. } => {
                ApiError::invalid_value("n", message)
            }
            PrepareError::LogitBias { .. } => ApiError::invalid_value("logit_bias", message),
            PrepareError::Grammar { param, .. } => ApiError::invalid_value(param, message),
            PrepareError::Template(TemplateError::Missing) => ApiError::invalid_request(message, Some("model")),
            PrepareError::Template(_) => ApiError::invalid_value("messages", message),
            PrepareError::Image(ImageError::Unreadable { param, .. }) => ApiError::invalid_value(&param, message),
            PrepareError::Image(ImageError::Placement { .. }) => ApiError::invalid_value("messages", message),
            PrepareError::Image(ImageError::NoVision) => ApiError::invalid_request(message, Some("messages")),
            PrepareError::RawPrompt(RawPromptError::NoFim) => ApiError::invalid_value("suffix", message),
            PrepareError::RawPrompt(_) => ApiError::invalid_value("prompt", message),
            PrepareError::NotGenerative => ApiError::invalid_request(message, Some("model")),
        }
    }
}

/// The engine could not take the request now: retryable 503s.
impl IntoApiError for SubmitError {
    fn into_api_error(self) -> ApiError {
        match self {
            SubmitError::QueueFull(_) => {
                ApiError::overloaded(format!("The server is overloaded ({self}). Please retry after a short wait."))
                    .with_retry_after(1)
            }
            SubmitError::Stopped => ApiError::overloaded("The server is shutting down.").with_retry_after(5),
            SubmitError::Failed(_) => {
                ApiError::overloaded(format!("The server is restarting: {self}. Please retry.")).with_retry_after(5)
            }
        }
    }
}

/// Failures of an admitted request: OpenAI's `server_error`.
impl IntoApiError for EngineError {
    fn into_api_error(self) -> ApiError {
        match self {
            // Retryable and unbilled: the batch runner runs the line again; a `flex` client
            // is told what OpenAI tells it when flex capacity runs out.
            EngineError::Preempted => ApiError::resource_unavailable(self.to_string()),
            _ => ApiError::internal(self.to_string()),
        }
    }
}

/// A model that does not exist is a 404; one that cannot be loaded now a retryable 503; one
/// that may not be unloaded now a 409.
impl IntoApiError for PoolError {
    fn into_api_error(self) -> ApiError {
        let message = self.to_string();
        match self {
            PoolError::NotFound(id) => ApiError::model_not_found(&id),
            PoolError::Busy { .. } => {
                ApiError::overloaded(format!("{message}. Please retry after a short wait.")).with_retry_after(5)
            }
            PoolError::LoadFailed { .. } | PoolError::TooLarge { .. } => {
                ApiError::overloaded(message).with_retry_after(30)
            }
            PoolError::InUse { .. } => {
                ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message, None, Some("model_in_use"))
            }
        }
    }
}

/// The admin API's accounts errors: the operator's mistakes as 400s and 404s; a database
/// failure is logged and answered without its details.
impl IntoApiError for AccountsError {
    fn into_api_error(self) -> ApiError {
        match self {
            AccountsError::NotFound(m) => ApiError::not_found(m),
            AccountsError::Ambiguous(m) | AccountsError::Invalid(m) => ApiError::invalid_request(m, None),
            AccountsError::KeyRevoked => ApiError::invalid_request("That key is revoked.", None),
            other => {
                tracing::error!(error = %other, "admin API accounts error");
                ApiError::internal("The accounts database failed; see the server log.")
            }
        }
    }
}

/// Why an API key was refused (`/v1` routes).
#[derive(Debug)]
pub(crate) enum KeyRefusal {
    /// No `Authorization: Bearer` header, or an empty key.
    Missing,
    /// Not a key, or no key with that secret; `redacted` shows only its ends.
    Incorrect { redacted: String },
    /// The address made too many failed authentications; it may retry in this many seconds.
    Throttled { retry_after: u64 },
    /// The key's expiry has passed.
    Expired { prefix: String },
    /// The accounts database did not answer the lookup.
    LookupFailed,
}

impl IntoApiError for KeyRefusal {
    fn into_api_error(self) -> ApiError {
        match self {
            KeyRefusal::Missing => ApiError::invalid_api_key(
                "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or in an x-api-key header.",
            ),
            KeyRefusal::Incorrect { redacted } => {
                ApiError::invalid_api_key(format!("Incorrect API key provided: {redacted}."))
            }
            KeyRefusal::Throttled { retry_after } => ApiError::rate_limited(
                "Too many requests with invalid API keys from your address; check your key and retry later.",
            )
            .with_retry_after(retry_after),
            KeyRefusal::Expired { prefix } => ApiError::invalid_api_key(format!("The API key {prefix}… has expired.")),
            KeyRefusal::LookupFailed => {
                ApiError::temporarily_unavailable("The server could not check your API key; please retry.")
            }
        }
    }
}

/// Why the admin token was refused (`/admin/v1`).
#[derive(Debug)]
pub(crate) enum AdminRefusal {
    /// No admin token is configured: the admin API is off.
    Disabled,
    /// The token presented is missing or wrong.
    WrongToken,
    /// The address guessed wrong too often; it may retry after this long.
    Throttled { wait: Duration },
}

impl IntoApiError for AdminRefusal {
    fn into_api_error(self) -> ApiError {
        match self {
            AdminRefusal::Disabled => ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "The admin API is disabled; start the server with --admin-token (or GANTRY_ADMIN_TOKEN) to enable it (/metrics: or serve it with --admin-listen or --public-metrics).",
                None,
                Some("admin_api_disabled"),
            ),
            AdminRefusal::WrongToken => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "The admin API needs the admin token (Authorization: Bearer <admin token>); API keys are not accepted here.",
                None,
                Some("invalid_admin_token"),
            ),
            AdminRefusal::Throttled { wait } => {
                let seconds = crate::openai::rate_limit::retry_after_secs(wait);
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "invalid_request_error",
                    format!("Too many wrong admin tokens from this address; try again in {seconds} s."),
                    None,
                    Some("admin_auth_throttled"),
                )
                .with_retry_after(seconds)
            }
        }
    }
}

/// A refused admission (`key` names the key in the message): 429 for a rate limit or an
/// exhausted budget, 503 when the accounts database could not be asked.
pub(crate) fn admission_refused(key: &KeyInfo, reason: Refusal) -> ApiError {
    match reason {
        Refusal::RateLimited(RateRefusal::Requests { limit, retry_after }) => ApiError::rate_limited(format!(
            "Rate limit reached for requests on key '{}': limit {limit} per minute. Please try again in {}.",
            key.name,
            format_reset(retry_after)
        ))
        .with_retry_after(crate::openai::rate_limit::retry_after_secs(retry_after)),
        Refusal::RateLimited(RateRefusal::Tokens { limit, used, requested, retry_after }) => {
            let message = if requested > limit {
                format!(
                    "Request too large for key '{}': limit {limit} tokens per minute, requested {requested} (prompt plus max_tokens). Reduce max_tokens or the messages.",
                    key.name
                )
            } else {
                format!(
                    "Rate limit reached for tokens on key '{}': limit {limit} per minute, used {used}, requested {requested}. Please try again in {}.",
                    key.name,
                    format_reset(retry_after)
                )
            };
            let mut err = ApiError::rate_limited(message)
                .with_retry_after(crate::openai::rate_limit::retry_after_secs(retry_after));
            err.error_type = "tokens"; // OpenAI's type for token-rate limits
            err
        }
        Refusal::Quota(message) => ApiError::insufficient_quota(message),
        Refusal::Unavailable(e) => {
            tracing::error!(error = %e, "admission could not reach the accounts database");
            ApiError::temporarily_unavailable("The server could not check your rate limits and budget; please retry.")
        }
    }
}

/// The answer to a refused admission, with the rate-limit headers.
pub(crate) fn refusal_response(key: &KeyInfo, refused: Refused) -> Response {
    let mut response = admission_refused(key, refused.reason).into_response();
    rate_limit::apply(&refused.rate, response.headers_mut());
    response
}

/// The request body did not arrive within `--body-read-timeout`: 408.
pub(crate) fn body_timed_out(timeout: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        format!("The request body did not arrive within {} seconds.", timeout.as_secs_f64()),
        None,
        Some("request_timeout"),
    )
}

/// A blocking task (image or prompt preparation, named by `what`) panicked or was cancelled.
pub(crate) fn task_failed(what: &str, e: tokio::task::JoinError) -> ApiError {
    ApiError::internal(format!("{what} failed: {e}"))
}

/// A failure the client is told nothing about: a handler's panic, or a bare 5xx.
pub(crate) fn internal_error() -> ApiError {
    ApiError::internal("The server had an error while processing your request.")
}

/// The image client could not be built.
pub(crate) fn image_client_failed(e: reqwest::Error) -> ApiError {
    ApiError::internal(format!("image client: {e}"))
}

/// No route has this path.
pub(crate) async fn unknown_route(req: Request) -> ApiError {
    ApiError::not_found(format!("Invalid URL ({} {})", req.method(), req.uri().path()))
}

/// The path exists, but not with this method.
pub(crate) async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(format!("Method {} is not allowed for {}", req.method(), req.uri().path()))
}

/// axum's own rejections (body too large, …) are plain text; rewrite any non-JSON error body
/// into OpenAI's shape so clients always get `{"error": …}`. Only the body and its type change:
/// the other headers stay, among them `Connection: close` on a refusal whose body was left
/// unread, without which a client reuses a connection the server is closing.
pub(crate) async fn errors_as_json(req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (parts, _) = response.into_parts();
    let mut rewritten = from_status(status).into_response();
    let own = rewritten.headers().clone();
    for (name, value) in &parts.headers {
        if !own.contains_key(name) && name != axum::http::header::CONTENT_LENGTH {
            rewritten.headers_mut().append(name, value.clone());
        }
    }
    rewritten
}

/// The OpenAI error for a bare status code, keeping that status.
fn from_status(status: StatusCode) -> ApiError {
    let mut err = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::payload_too_large(0),
        s if s.is_server_error() => internal_error(),
        s => ApiError::invalid_request(s.canonical_reason().unwrap_or("Bad request").to_string(), None),
    };
    err.status = status;
    err
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::StatusCode;
    use gantry_accounts::{Allowance, RateStatus};

    use super::*;

    fn key() -> KeyInfo {
        KeyInfo {
            id: 1,
            name: "k".into(),
            tenant: "default".into(),
            prefix: "sk-gantry-x".into(),
            created_at: 0,
            revoked_at: None,
            expires_at: None,
            rpm_limit: Some(2),
            tpm_limit: None,
            budget: Default::default(),
            allowed_models: None,
            cache_scope: Default::default(),
            weight: 1,
            tenant_weight: 1,
            priority_tier: false,
        }
    }

    fn request(method: &str, path: &str) -> Request {
        Request::builder().method(method).uri(path).body(Body::empty()).unwrap()
    }

    /// A failure kind, its error, and the status, `type`, `code`, `param` and `Retry-After` it
    /// must get.
    type Row = (&'static str, ApiError, u16, &'static str, Option<&'static str>, Option<&'static str>, Option<u64>);

    /// Every failure kind the server answers, with its status, OpenAI `type`, `code`, `param`
    /// and `Retry-After`. A change to any of these is a change to the API.
    #[tokio::test]
    async fn every_failure_kind_gets_its_status_type_and_code() {
        const BAD: &str = "invalid_request_error";
        const SERVER: &str = "server_error";
        let seconds = |s| Duration::from_secs(s);
        let cancelled = tokio::spawn(std::future::pending::<()>());
        cancelled.abort();
        let joined = cancelled.await.unwrap_err();
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            // The engine refuses the request before queueing it: the client's to fix.
            ("prompt too long", PrepareError::ContextLength { limit: 10, prompt_tokens: 8, max_tokens: Some(5) }.into_api_error(), 400, BAD, Some("context_length_exceeded"), Some("messages"), None),
            ("too many choices", PrepareError::TooManyChoices { n: 5, slots: 4 }.into_api_error(), 400, BAD, None, Some("n"), None),
            ("bad logit bias", PrepareError::LogitBias { token: -1, n_vocab: 9 }.into_api_error(), 400, BAD, None, Some("logit_bias"), None),
            ("bad response_format", PrepareError::Grammar { param: "response_format", reason: "bad".into() }.into_api_error(), 400, BAD, None, Some("response_format"), None),
            ("bad tools", PrepareError::Grammar { param: "tools", reason: "bad".into() }.into_api_error(), 400, BAD, None, Some("tools"), None),
            ("template refuses", PrepareError::Template(gantry_engine::TemplateError::Render("no".into())).into_api_error(), 400, BAD, None, Some("messages"), None),
            ("no chat template", PrepareError::Template(TemplateError::Missing).into_api_error(), 400, BAD, None, Some("model"), None),
            ("an embedding model", PrepareError::NotGenerative.into_api_error(), 400, BAD, None, Some("model"), None),
            ("chat on a base model", crate::openai::chat::no_chat_template("base"), 400, BAD, None, Some("model"), None),
            ("unreadable image", PrepareError::Image(ImageError::Unreadable { param: "messages[0].content[1]".into(), reason: "x".into() }).into_api_error(), 400, BAD, None, Some("messages[0].content[1]"), None),
            ("image places", PrepareError::Image(ImageError::Placement { markers: 1, images: 2 }).into_api_error(), 400, BAD, None, Some("messages"), None),
            ("model cannot see", PrepareError::Image(ImageError::NoVision).into_api_error(), 400, BAD, None, Some("messages"), None),
            // The engine cannot take the request now: retryable.
            ("queue full", SubmitError::QueueFull(8).into_api_error(), 503, SERVER, Some("server_overloaded"), None, Some(1)),
            ("engine stopped", SubmitError::Stopped.into_api_error(), 503, SERVER, Some("server_overloaded"), None, Some(5)),
            ("engine failed", SubmitError::Failed("p".into()).into_api_error(), 503, SERVER, Some("server_overloaded"), None, Some(5)),
            // An admitted request fails.
            ("decode failed", EngineError::Decode("x".into()).into_api_error(), 500, SERVER, None, None, None),
            ("engine shutting down", EngineError::ShuttingDown.into_api_error(), 500, SERVER, None, None, None),
            ("engine crashed", EngineError::Crashed("p".into()).into_api_error(), 500, SERVER, None, None, None),
            ("preparation task died", task_failed("prompt preparation", joined), 500, SERVER, None, None, None),
            ("image client broken", image_client_failed(reqwest::Client::builder().user_agent("\n").build().unwrap_err()), 500, SERVER, None, None, None),
            // The model pool.
            ("no such model", PoolError::NotFound("m".into()).into_api_error(), 404, BAD, Some("model_not_found"), Some("model"), None),
            ("memory busy", PoolError::Busy { id: "m".into() }.into_api_error(), 503, SERVER, Some("server_overloaded"), None, Some(5)),
            ("load failed", PoolError::LoadFailed { id: "m".into(), reason: "x".into() }.into_api_error(), 503, SERVER, Some("server_overloaded"), None, Some(30)),
            ("model too large", PoolError::TooLarge { id: "m".into(), need: 2, budget: 1 }.into_api_error(), 503, SERVER, Some("server_overloaded"), None, Some(30)),
            ("model in use", PoolError::InUse { id: "m".into(), running: 1 }.into_api_error(), 409, BAD, Some("model_in_use"), None, None),
            // The accounts, behind the admin API.
            ("no such key", AccountsError::NotFound("k".into()).into_api_error(), 404, BAD, Some("unknown_url"), None, None),
            ("ambiguous key", AccountsError::Ambiguous("k".into()).into_api_error(), 400, BAD, None, None, None),
            ("invalid settings", AccountsError::Invalid("k".into()).into_api_error(), 400, BAD, None, None, None),
            ("key revoked", AccountsError::KeyRevoked.into_api_error(), 400, BAD, None, None, None),
            ("database failed", AccountsError::Io(std::io::Error::other("disk")).into_api_error(), 500, SERVER, None, None, None),
            // API keys.
            ("no key", KeyRefusal::Missing.into_api_error(), 401, BAD, Some("invalid_api_key"), None, None),
            ("wrong key", KeyRefusal::Incorrect { redacted: "sk-abc***wxyz".into() }.into_api_error(), 401, BAD, Some("invalid_api_key"), None, None),
            ("key expired", KeyRefusal::Expired { prefix: "sk-gantry-x".into() }.into_api_error(), 401, BAD, Some("invalid_api_key"), None, None),
            ("too many wrong keys", KeyRefusal::Throttled { retry_after: 7 }.into_api_error(), 429, "requests", Some("rate_limit_exceeded"), None, Some(7)),
            ("key lookup failed", KeyRefusal::LookupFailed.into_api_error(), 503, SERVER, Some("service_unavailable"), None, Some(1)),
            // The admin token.
            ("admin API off", AdminRefusal::Disabled.into_api_error(), 403, BAD, Some("admin_api_disabled"), None, None),
            ("wrong admin token", AdminRefusal::WrongToken.into_api_error(), 401, BAD, Some("invalid_admin_token"), None, None),
            ("too many wrong tokens", AdminRefusal::Throttled { wait: seconds(90) }.into_api_error(), 429, BAD, Some("admin_auth_throttled"), None, Some(90)),
            // Admission: rate limits and budgets.
            ("requests per minute", admission_refused(&key(), Refusal::RateLimited(RateRefusal::Requests { limit: 2, retry_after: seconds(40) })), 429, "requests", Some("rate_limit_exceeded"), None, Some(40)),
            ("tokens per minute", admission_refused(&key(), Refusal::RateLimited(RateRefusal::Tokens { limit: 100, used: 90, requested: 50, retry_after: seconds(20) })), 429, "tokens", Some("rate_limit_exceeded"), None, Some(20)),
            ("budget spent", admission_refused(&key(), Refusal::Quota("spent".into())), 429, "insufficient_quota", Some("insufficient_quota"), None, None),
            ("admission database down", admission_refused(&key(), Refusal::Unavailable(AccountsError::Io(std::io::Error::other("x")))), 503, SERVER, Some("service_unavailable"), None, Some(1)),
            // The HTTP layer.
            ("body too slow", body_timed_out(seconds(10)), 408, BAD, Some("request_timeout"), None, None),
            ("unknown route", unknown_route(request("GET", "/nowhere")).await, 404, BAD, Some("unknown_url"), None, None),
            ("wrong method", method_not_allowed(request("DELETE", "/v1/models")).await, 405, BAD, Some("method_not_allowed"), None, None),
            ("handler panicked", internal_error(), 500, SERVER, None, None, None),
            ("plain 413", from_status(StatusCode::PAYLOAD_TOO_LARGE), 413, BAD, Some("request_too_large"), None, None),
            ("plain 502", from_status(StatusCode::BAD_GATEWAY), 502, SERVER, None, None, None),
            ("plain 415", from_status(StatusCode::UNSUPPORTED_MEDIA_TYPE), 415, BAD, None, None, None),
        ];
        for (kind, api, status, error_type, code, param, retry_after) in table {
            assert_eq!(api.status.as_u16(), status, "{kind}: status");
            assert_eq!(api.error_type, error_type, "{kind}: type");
            assert_eq!(api.code.as_deref(), code, "{kind}: code");
            assert_eq!(api.param.as_deref(), param, "{kind}: param");
            assert_eq!(api.retry_after, retry_after, "{kind}: Retry-After");
        }
    }

    #[test]
    fn prepare_errors_keep_the_engines_message() {
        let error = PrepareError::LogitBias { token: -1, n_vocab: 9 };
        let shown = error.to_string();
        assert_eq!(error.into_api_error().message, shown);
    }

    #[test]
    fn a_refused_admission_carries_the_rate_limit_headers() {
        let rate = RateStatus {
            requests: Some(Allowance { limit: 2, remaining: 0, reset: Duration::from_secs(40) }),
            tokens: None,
        };
        let refused = Refused {
            rate,
            reason: Refusal::RateLimited(RateRefusal::Requests { limit: 2, retry_after: Duration::from_secs(40) }),
        };
        let response = refusal_response(&key(), refused);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "40");
        assert_eq!(response.headers()["x-ratelimit-remaining-requests"], "0");
        assert_eq!(response.headers()["x-ratelimit-reset-requests"], "40s");
        let too_big = admission_refused(
            &key(),
            Refusal::RateLimited(RateRefusal::Tokens {
                limit: 100,
                used: 0,
                requested: 500,
                retry_after: Duration::from_secs(60),
            }),
        );
        assert!(too_big.message.contains("too large"), "{}", too_big.message);
        assert_eq!(too_big.error_type, "tokens");
    }
}
