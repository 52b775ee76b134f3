//! OpenAI's `x-ratelimit-*` headers and 429 answers for what admission decided (the limits
//! themselves are counted by `gantry_accounts::Meter`).

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use gantry_accounts::{KeyInfo, RateRefusal, RateStatus, Refusal, Refused};
use gantry_api::ApiError;

/// Sets `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the limits the key has.
pub(crate) fn apply(status: &RateStatus, headers: &mut HeaderMap) {
    for (kind, entry) in [("requests", status.requests), ("tokens", status.tokens)] {
        if let Some(a) = entry {
            let mut put = |name: String, value: String| {
                if let (Ok(n), Ok(v)) = (name.parse::<axum::http::HeaderName>(), HeaderValue::from_str(&value)) {
                    headers.insert(n, v);
                }
            };
            put(format!("x-ratelimit-limit-{kind}"), a.limit.to_string());
            put(format!("x-ratelimit-remaining-{kind}"), a.remaining.to_string());
            put(format!("x-ratelimit-reset-{kind}"), format_reset(a.reset));
        }
    }
}

/// OpenAI's reset format: `1s`, `6m0s`, `250ms`.
pub(crate) fn format_reset(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}s", ms.div_ceil(1000))
    } else {
        let s = ms.div_ceil(1000);
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// The answer to a refused admission, with the rate-limit headers.
pub(crate) fn refusal_response(key: &KeyInfo, refused: Refused) -> Response {
    let mut response = to_api_error(key, refused.reason).into_response();
    apply(&refused.rate, response.headers_mut());
    response
}

fn to_api_error(key: &KeyInfo, reason: Refusal) -> ApiError {
    match reason {
        Refusal::RateLimited(RateRefusal::Requests { limit, retry_after }) => ApiError::rate_limited(format!(
            "Rate limit reached for requests on key '{}': limit {limit} per minute. Please try again in {}.",
            key.name,
            format_reset(retry_after)
        ))
        .with_retry_after(retry_after.as_secs().max(1)),
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
            let mut err = ApiError::rate_limited(message).with_retry_after(retry_after.as_secs().max(1));
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

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_accounts::Allowance;

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
        }
    }

    #[test]
    fn refusals_become_openai_429s_with_headers() {
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
        let too_big = to_api_error(
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

    #[test]
    fn unlimited_keys_get_no_headers() {
        let mut map = HeaderMap::new();
        apply(&RateStatus::default(), &mut map);
        assert!(map.is_empty());
    }

    #[test]
    fn reset_format_matches_openai() {
        assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
        assert_eq!(format_reset(Duration::from_millis(1500)), "2s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
    }
}
