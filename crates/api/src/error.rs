//! The one error type of the HTTP API, rendered as OpenAI's error JSON:
//! `{"error": {"message", "type", "param", "code"}}` (`param`/`code` are `null` when unset).

use axum_core::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Value};

/// An error answered to the client in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_type: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Seconds after which a retry may succeed, sent as `Retry-After` (429s and 503s).
    pub retry_after: Option<u64>,
}

const INVALID_REQUEST: &str = "invalid_request_error";
const SERVER_ERROR: &str = "server_error";

impl ApiError {
    /// General constructor.
    pub fn new(
        status: StatusCode,
        error_type: &'static str,
        message: impl Into<String>,
        param: Option<&str>,
        code: Option<&str>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            error_type,
            param: param.map(str::to_owned),
            code: code.map(str::to_owned),
            retry_after: None,
        }
    }

    /// Adds a `Retry-After` header to the response.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 400 `invalid_request_error`, no code.
    pub fn invalid_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message, param, None)
    }

    /// This error in another dialect's terms: each `(chat, theirs)` field name that is the
    /// parameter, or the start of its path (`chat.x`, `chat[0]`), is replaced by theirs there
    /// and in the message. Already renamed errors stay as they are (`stop_sequences` is not
    /// `stop`'s path).
    pub fn with_fields_renamed(mut self, names: &[(&str, &str)]) -> Self {
        for (chat, theirs) in names {
            let Some(param) = self.param.as_deref() else { return self };
            let rest = param.strip_prefix(chat);
            if rest.is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '['])) {
                self.param = Some(param.replacen(chat, theirs, 1));
                self.message = self.message.replace(chat, theirs);
            }
        }
        self
    }

    /// 400 `invalid_request_error` naming `param`, no code (OpenAI's style for bad values).
    pub fn invalid_value(param: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message, Some(param), None)
    }

    /// 400, code `context_length_exceeded`, param `messages`.
    pub fn context_length_exceeded(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message, Some("messages"), Some("context_length_exceeded"))
    }

    /// 401, code `invalid_api_key`.
    pub fn invalid_api_key(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, INVALID_REQUEST, message, None, Some("invalid_api_key"))
    }

    /// 404, code `model_not_found`, param `model`.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            format!("The model `{model}` does not exist or you do not have access to it."),
            Some("model"),
            Some("model_not_found"),
        )
    }

    /// 404 for unknown routes, code `unknown_url`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, INVALID_REQUEST, message, None, Some("unknown_url"))
    }

    /// 405.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, INVALID_REQUEST, message, None, Some("method_not_allowed"))
    }

    /// 413, code `request_too_large`. `limit_bytes == 0` means "limit unknown".
    pub fn payload_too_large(limit_bytes: u64) -> Self {
        let message = if limit_bytes == 0 {
            "The request body is too large.".to_string()
        } else {
            format!("The request body is too large: the maximum is {limit_bytes} bytes.")
        };
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, INVALID_REQUEST, message, None, Some("request_too_large"))
    }

    /// Wrong `Content-Type`: OpenAI answers 400 `invalid_request_error`.
    pub fn unsupported_media_type(got: Option<&str>) -> Self {
        let got = got.unwrap_or("none");
        Self::invalid_request(format!("Invalid Content-Type header ({got}); expected 'application/json'."), None)
    }

    /// 429, type `requests`, code `rate_limit_exceeded`.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "requests", message, None, Some("rate_limit_exceeded"))
    }

    /// 429, type and code `insufficient_quota`.
    pub fn insufficient_quota(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "insufficient_quota", message, None, Some("insufficient_quota"))
    }

    /// 429, type `server_error`, code `resource_unavailable`, with `Retry-After: 1`: capacity
    /// sold cheaper (`service_tier: "flex"`) was taken back before the request finished. It is
    /// not billed; OpenAI answers flex requests it lacks capacity for with a 429 too, which the
    /// SDKs retry with backoff.
    pub fn resource_unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, SERVER_ERROR, message, None, Some("resource_unavailable"))
            .with_retry_after(1)
    }

    /// 503, type `server_error`, code `server_overloaded`.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, message, None, Some("server_overloaded"))
    }

    /// 503, type `server_error`, code `server_shutting_down`, with `Retry-After: 1`: this server
    /// is draining and takes no new requests; another replica (or this one restarted) will.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            SERVER_ERROR,
            "This server is shutting down and takes no new requests; retry, and another replica will answer.",
            None,
            Some("server_shutting_down"),
        )
        .with_retry_after(1)
    }

    /// 503, type `server_error`, code `service_unavailable`, with `Retry-After: 1`: something this
    /// server depends on (the accounts database) did not answer; the request may succeed if
    /// retried, here or on another replica.
    pub fn temporarily_unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, message, None, Some("service_unavailable"))
            .with_retry_after(1)
    }

    /// 500, type `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, SERVER_ERROR, message, None, None)
    }

    /// `{"error": {"message", "type", "param", "code"}}`; all four keys always present.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.wire_message(),
                "type": self.error_type,
                "param": self.param.as_deref().map(|p| capped(p, MAX_PARAM_BYTES)),
                "code": self.code,
            }
        })
    }
}

impl ApiError {
    /// The message as every dialect sends it: capped, since it may quote what the client sent.
    pub fn wire_message(&self) -> std::borrow::Cow<'_, str> {
        capped(&self.message, MAX_MESSAGE_BYTES)
    }
}

/// Messages and params quote what the client sent (a model name, a role, a field's name), which
/// may be megabytes: an error body says enough within these.
const MAX_MESSAGE_BYTES: usize = 2048;
const MAX_PARAM_BYTES: usize = 256;

/// `s` cut to at most `max` bytes on a character boundary, marked with "…" where cut.
fn capped(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.to_json().to_string();
        let mut response = Response::new(axum_core::body::Body::from(body));
        *response.status_mut() = self.status;
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        // The typed error rides along, so a dialect renders it in its own shape without
        // parsing the body back (as axum carries its rejections).
        response.extensions_mut().insert(self);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_renamed_by_path_once() {
        let names = [("stop", "stop_sequences"), ("messages", "input")];
        let e = ApiError::invalid_value("stop", "Invalid 'stop'.").with_fields_renamed(&names);
        assert_eq!((e.param.as_deref(), e.message.as_str()), (Some("stop_sequences"), "Invalid 'stop_sequences'."));
        let again = e.with_fields_renamed(&names);
        assert_eq!(again.param.as_deref(), Some("stop_sequences"), "renamed once");
        let e = ApiError::invalid_value("messages[2].content", "x").with_fields_renamed(&names);
        assert_eq!(e.param.as_deref(), Some("input[2].content"));
        let e = ApiError::invalid_value("messages_extra", "x").with_fields_renamed(&names);
        assert_eq!(e.param.as_deref(), Some("messages_extra"));
    }

    #[test]
    fn json_shape_always_has_all_keys() {
        let v = ApiError::internal("boom").to_json();
        let obj = v["error"].as_object().unwrap();
        let mut keys: Vec<_> = obj.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["code", "message", "param", "type"]);
        assert_eq!(v["error"]["param"], Value::Null);
        assert_eq!(v["error"]["code"], Value::Null);
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(v["error"]["message"], "boom");
        assert_eq!(v.as_object().unwrap().len(), 1);
    }

    type Case = (ApiError, u16, &'static str, Option<&'static str>, Option<&'static str>);

    #[test]
    fn constructors_table() {
        let cases: Vec<Case> = vec![
            (ApiError::invalid_request("x", Some("stop")), 400, INVALID_REQUEST, Some("stop"), None),
            (ApiError::invalid_value("n", "x"), 400, INVALID_REQUEST, Some("n"), None),
            (
                ApiError::context_length_exceeded("x"),
                400,
                INVALID_REQUEST,
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            (ApiError::invalid_api_key("x"), 401, INVALID_REQUEST, None, Some("invalid_api_key")),
            (ApiError::model_not_found("m"), 404, INVALID_REQUEST, Some("model"), Some("model_not_found")),
            (ApiError::not_found("x"), 404, INVALID_REQUEST, None, Some("unknown_url")),
            (ApiError::method_not_allowed("x"), 405, INVALID_REQUEST, None, Some("method_not_allowed")),
            (ApiError::payload_too_large(10), 413, INVALID_REQUEST, None, Some("request_too_large")),
            (ApiError::unsupported_media_type(Some("text/plain")), 400, INVALID_REQUEST, None, None),
            (ApiError::rate_limited("x"), 429, "requests", None, Some("rate_limit_exceeded")),
            (ApiError::insufficient_quota("x"), 429, "insufficient_quota", None, Some("insufficient_quota")),
            (ApiError::resource_unavailable("x"), 429, SERVER_ERROR, None, Some("resource_unavailable")),
            (ApiError::overloaded("x"), 503, SERVER_ERROR, None, Some("server_overloaded")),
            (ApiError::temporarily_unavailable("x"), 503, SERVER_ERROR, None, Some("service_unavailable")),
            (ApiError::shutting_down(), 503, SERVER_ERROR, None, Some("server_shutting_down")),
            (ApiError::internal("x"), 500, SERVER_ERROR, None, None),
        ];
        for (e, status, ty, param, code) in cases {
            assert_eq!(e.status.as_u16(), status, "{e:?}");
            assert_eq!(e.error_type, ty, "{e:?}");
            assert_eq!(e.param.as_deref(), param, "{e:?}");
            assert_eq!(e.code.as_deref(), code, "{e:?}");
            let j = e.to_json();
            assert_eq!(j["error"]["code"], code.map_or(Value::Null, Value::from));
        }
        assert_eq!(
            ApiError::model_not_found("gpt-x").message,
            "The model `gpt-x` does not exist or you do not have access to it."
        );
        assert!(ApiError::payload_too_large(10).message.contains("10 bytes"));
        assert!(ApiError::unsupported_media_type(Some("text/plain")).message.contains("text/plain"));
    }

    #[test]
    fn into_response_sets_status_and_content_type() {
        let r = ApiError::model_not_found("m").into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let r = ApiError::overloaded("busy").with_retry_after(2).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn display_includes_message() {
        assert!(ApiError::internal("kaput").to_string().contains("kaput"));
    }

    #[test]
    fn an_error_quoting_a_huge_value_stays_small() {
        let huge = "é".repeat(40_000);
        let e = ApiError::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            format!("The model '{huge}' does not exist"),
            Some(&huge),
            None,
        );
        let body = e.to_json();
        let (message, param) = (body["error"]["message"].as_str().unwrap(), body["error"]["param"].as_str().unwrap());
        assert!(message.len() <= MAX_MESSAGE_BYTES && message.starts_with("The model 'éé") && message.ends_with('…'));
        assert!(param.len() <= MAX_PARAM_BYTES && param.ends_with('…'));
        assert_eq!(capped("short", 8), "short");
    }
}
