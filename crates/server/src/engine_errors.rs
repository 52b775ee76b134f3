//! The engine's typed errors as OpenAI errors.
//!
//! This is a trait rather than `From` impls only because of Rust's orphan rule: `ApiError`
//! lives in `gantry-api` and the engine's errors in `gantry-engine`, and neither crate depends on
//! the other (the API crate stays free of llama.cpp, the engine free of HTTP), so neither can
//! host `impl From<PrepareError> for ApiError`, and this crate may not either. Every engine
//! error reaches the client through this one mapping.

use gantry_api::ApiError;
use gantry_engine::{EngineError, ImageError, PrepareError, SubmitError};

pub(crate) trait IntoApiError {
    fn into_api_error(self) -> ApiError;
}

/// Refusals before queueing: the client's to fix, so 400s naming the parameter.
impl IntoApiError for PrepareError {
    fn into_api_error(self) -> ApiError {
        let message = self.to_string();
        match self {
            PrepareError::ContextLength { .. } => ApiError::context_length_exceeded(message),
            PrepareError::TooManyChoices { .. } => ApiError::invalid_value("n", message),
            PrepareError::LogitBias { .. } => ApiError::invalid_value("logit_bias", message),
            PrepareError::Grammar { param, .. } => ApiError::invalid_value(param, message),
            PrepareError::Template(_) => ApiError::invalid_value("messages", message),
            PrepareError::Image(ImageError::Unreadable { param, .. }) => ApiError::invalid_value(&param, message),
            PrepareError::Image(ImageError::Placement { .. }) => ApiError::invalid_value("messages", message),
            PrepareError::Image(ImageError::NoVision) => ApiError::invalid_request(message, Some("messages")),
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
        ApiError::internal(self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_errors_are_400s_naming_their_parameter() {
        let cases: Vec<(PrepareError, &str, Option<&str>)> = vec![
            (
                PrepareError::ContextLength { limit: 10, prompt_tokens: 8, max_tokens: Some(5) },
                "messages",
                Some("context_length_exceeded"),
            ),
            (PrepareError::TooManyChoices { n: 5, slots: 4 }, "n", None),
            (PrepareError::LogitBias { token: -1, n_vocab: 9 }, "logit_bias", None),
            (PrepareError::Grammar { param: "response_format", reason: "bad".into() }, "response_format", None),
            (PrepareError::Grammar { param: "tools", reason: "bad".into() }, "tools", None),
        ];
        for (error, param, code) in cases {
            let shown = error.to_string();
            let api = error.into_api_error();
            assert_eq!(api.status.as_u16(), 400, "{shown}");
            assert_eq!(api.error_type, "invalid_request_error", "{shown}");
            assert_eq!(api.param.as_deref(), Some(param), "{shown}");
            assert_eq!(api.code.as_deref(), code, "{shown}");
            assert_eq!(api.message, shown);
        }
    }

    #[test]
    fn engine_failures_are_server_errors() {
        for error in [EngineError::Decode("x".into()), EngineError::ShuttingDown, EngineError::Crashed("p".into())] {
            let api = error.into_api_error();
            assert_eq!((api.status.as_u16(), api.error_type), (500, "server_error"));
        }
        let api = SubmitError::Failed("p".into()).into_api_error();
        assert_eq!((api.status.as_u16(), api.error_type, api.retry_after), (503, "server_error", Some(5)));
    }
}
