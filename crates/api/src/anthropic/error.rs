//! Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, the type
//! following the status as Anthropic's API sets it.

use http::StatusCode;
use serde_json::{json, Value};

use crate::ApiError;

/// Anthropic's error type for an answer of `status`; `openai_type` tells a spent budget
/// (`insufficient_quota`, Anthropic's `billing_error`) from a rate limit.
pub fn error_type(status: StatusCode, openai_type: &str) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 if openai_type == "insufficient_quota" => "billing_error",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `error` in Anthropic's shape.
pub fn error_body(error: &ApiError) -> Value {
    let kind = error_type(error.status, error.error_type);
    json!({"type": "error", "error": {"type": kind, "message": error.wire_message()}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_the_status_and_a_spent_budget_is_billing() {
        let cases = [
            (400, "invalid_request_error", "invalid_request_error"),
            (401, "invalid_request_error", "authentication_error"),
            (403, "x", "permission_error"),
            (404, "invalid_request_error", "not_found_error"),
            (413, "invalid_request_error", "request_too_large"),
            (429, "requests", "rate_limit_error"),
            (429, "insufficient_quota", "billing_error"),
            (500, "server_error", "api_error"),
            (503, "server_error", "overloaded_error"),
        ];
        for (status, openai, expected) in cases {
            assert_eq!(error_type(StatusCode::from_u16(status).unwrap(), openai), expected, "{status} {openai}");
        }
    }

    #[test]
    fn an_api_error_is_rendered_in_anthropics_shape() {
        let limited = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "requests", "no", None, Some("rate_limit_exceeded"));
        let body = error_body(&limited);
        assert_eq!(body, json!({"type": "error", "error": {"type": "rate_limit_error", "message": "no"}}));
        let missing = ApiError::model_not_found("m");
        assert_eq!(error_body(&missing)["error"]["type"], "not_found_error");
    }
}
