//! OpenAI's `x-ratelimit-*` headers for what admission decided (the limits themselves are
//! counted by `gantry_accounts::Meter`; the 429 answers are in [`crate::errors`]).

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use gantry_accounts::RateStatus;

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
    // Whole seconds round up: waiting what it says is always enough.
    let s = ms.div_ceil(1000);
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// `Retry-After` in whole seconds, rounded up (a client that waits exactly that long must find
/// room), at least 1.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    (d.as_millis() as u64).div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(format_reset(Duration::from_millis(59_500)), "1m0s", "never 60s");
        assert_eq!(format_reset(Duration::from_millis(59_000)), "59s");
        assert_eq!((retry_after_secs(Duration::from_millis(59_200)), retry_after_secs(Duration::ZERO)), (60, 1));
    }
}
