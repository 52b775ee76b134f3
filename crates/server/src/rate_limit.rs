//! Per-key requests-per-minute and tokens-per-minute limits over a sliding 60-second window,
//! enforced before a request reaches the engine, with OpenAI's `x-ratelimit-*` headers.
//!
//! Tokens are counted as OpenAI counts them at admission: prompt tokens plus the completion
//! budget (`max_tokens`, or what is left of the context). A single server keeps a sliding window
//! in this process; replicas sharing a PostgreSQL database count in a per-minute window stored
//! there ([`admit_shared`]), so one limit holds across all of them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use gantry_accounts::{Accounts, KeyInfo};
use gantry_api::ApiError;

const WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct RateLimiter {
    windows: Mutex<HashMap<i64, Window>>,
}

#[derive(Default)]
struct Window {
    requests: VecDeque<Instant>,
    tokens: VecDeque<(Instant, u64)>,
    token_sum: u64,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while self.requests.front().is_some_and(|&t| now.duration_since(t) >= WINDOW) {
            self.requests.pop_front();
        }
        while let Some(&(t, n)) = self.tokens.front() {
            if now.duration_since(t) < WINDOW {
                break;
            }
            self.token_sum -= n;
            self.tokens.pop_front();
        }
    }

    /// Time until the window has room for `needed` more tokens.
    fn token_wait(&self, limit: u64, needed: u64, now: Instant) -> Duration {
        let mut sum = self.token_sum;
        for &(t, n) in &self.tokens {
            if sum + needed <= limit {
                break;
            }
            sum -= n;
            if sum + needed <= limit {
                return (t + WINDOW).saturating_duration_since(now);
            }
        }
        if sum + needed <= limit { Duration::ZERO } else { WINDOW }
    }
}

/// `x-ratelimit-*` values for one key at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct RateHeaders {
    requests: Option<(u64, u64, Duration)>,
    tokens: Option<(u64, u64, Duration)>,
}

impl RateHeaders {
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (kind, entry) in [("requests", self.requests), ("tokens", self.tokens)] {
            if let Some((limit, remaining, reset)) = entry {
                let mut put = |name: String, value: String| {
                    if let (Ok(n), Ok(v)) = (name.parse::<axum::http::HeaderName>(), HeaderValue::from_str(&value)) {
                        headers.insert(n, v);
                    }
                };
                put(format!("x-ratelimit-limit-{kind}"), limit.to_string());
                put(format!("x-ratelimit-remaining-{kind}"), remaining.to_string());
                put(format!("x-ratelimit-reset-{kind}"), format_reset(reset));
            }
        }
    }
}

/// OpenAI's reset format: `1s`, `6m0s`, `250ms`.
pub fn format_reset(d: Duration) -> String {
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

impl RateLimiter {
    /// Admits a request of `tokens` for `key`, or says why not (429 with `Retry-After`).
    /// Either way returns the headers to send.
    pub fn admit(&self, key: &KeyInfo, tokens: u64, now: Instant) -> (RateHeaders, Result<(), ApiError>) {
        let (rpm, tpm) = (key.rpm_limit.map(|n| n as u64), key.tpm_limit.map(|n| n as u64));
        if rpm.is_none() && tpm.is_none() {
            return (RateHeaders { requests: None, tokens: None }, Ok(()));
        }
        let mut windows = self.windows.lock().expect("rate limiter lock");
        let w = windows.entry(key.id).or_default();
        w.expire(now);
        let request_wait = match rpm {
            Some(limit) if w.requests.len() as u64 >= limit => {
                let oldest = w.requests[w.requests.len() - limit as usize];
                Some((oldest + WINDOW).saturating_duration_since(now))
            }
            _ => None,
        };
        let token_wait = tpm.map(|limit| w.token_wait(limit, tokens, now)).filter(|d| !d.is_zero());
        let verdict = match (request_wait, token_wait) {
            (None, None) => {
                w.requests.push_back(now);
                w.tokens.push_back((now, tokens));
                w.token_sum += tokens;
                Ok(())
            }
            (Some(wait), _) => Err(ApiError::rate_limited(format!(
                "Rate limit reached for requests on key '{}': limit {} per minute. Please try again in {}.",
                key.name,
                rpm.unwrap_or(0),
                format_reset(wait)
            ))
            .with_retry_after(wait.as_secs().max(1))),
            (None, Some(wait)) => {
                let limit = tpm.unwrap_or(0);
                let message = if tokens > limit {
                    format!(
                        "Request too large for key '{}': limit {limit} tokens per minute, requested {tokens} (prompt plus max_tokens). Reduce max_tokens or the messages.",
                        key.name
                    )
                } else {
                    format!(
                        "Rate limit reached for tokens on key '{}': limit {limit} per minute, used {}, requested {tokens}. Please try again in {}.",
                        key.name,
                        w.token_sum,
                        format_reset(wait)
                    )
                };
                let mut err = ApiError::rate_limited(message).with_retry_after(wait.as_secs().max(1));
                err.error_type = "tokens"; // OpenAI's type for token-rate limits
                Err(err)
            }
        };
        let first_request = w.requests.front().copied().unwrap_or(now);
        let first_tokens = w.tokens.front().map_or(now, |&(t, _)| t);
        let headers = RateHeaders {
            requests: rpm.map(|limit| {
                (limit, limit.saturating_sub(w.requests.len() as u64), (first_request + WINDOW).saturating_duration_since(now))
            }),
            tokens: tpm.map(|limit| {
                (limit, limit.saturating_sub(w.token_sum), (first_tokens + WINDOW).saturating_duration_since(now))
            }),
        };
        (headers, verdict)
    }
}

/// The same check against the window kept in the shared database (fixed clock minutes: a
/// burst straddling a minute boundary can see up to twice the limit within 60 seconds).
pub async fn admit_shared(accounts: &Accounts, key: &KeyInfo, tokens: u64, now_ms: i64) -> (RateHeaders, Result<(), ApiError>) {
    let (rpm, tpm) = (key.rpm_limit, key.tpm_limit);
    if rpm.is_none() && tpm.is_none() {
        return (RateHeaders { requests: None, tokens: None }, Ok(()));
    }
    let w = match accounts.rate_admit(key.id, now_ms, tokens as i64, rpm, tpm).await {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "shared rate-limit check failed");
            let err = ApiError::internal("The server could not check your rate limits; please retry.");
            return (RateHeaders { requests: None, tokens: None }, Err(err));
        }
    };
    let reset = Duration::from_millis(w.reset_ms.max(0) as u64);
    let headers = RateHeaders {
        requests: rpm.map(|l| (l as u64, (l - w.requests).max(0) as u64, reset)),
        tokens: tpm.map(|l| (l as u64, (l - w.tokens).max(0) as u64, reset)),
    };
    if w.admitted {
        return (headers, Ok(()));
    }
    let wait = reset.as_secs().max(1);
    let verdict = match rpm {
        Some(limit) if w.requests + 1 > limit => ApiError::rate_limited(format!(
            "Rate limit reached for requests on key '{}': limit {limit} per minute. Please try again in {}.",
            key.name,
            format_reset(reset)
        ))
        .with_retry_after(wait),
        _ => {
            let limit = tpm.unwrap_or(0);
            let mut err = ApiError::rate_limited(format!(
                "Rate limit reached for tokens on key '{}': limit {limit} per minute, used {}, requested {tokens}. Please try again in {}.",
                key.name,
                w.tokens,
                format_reset(reset)
            ))
            .with_retry_after(wait);
            err.error_type = "tokens";
            err
        }
    };
    (headers, Err(verdict))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(rpm: Option<i64>, tpm: Option<i64>) -> KeyInfo {
        KeyInfo {
            id: 1,
            name: "k".into(),
            tenant: "default".into(),
            prefix: "sk-gantry-x".into(),
            created_at: 0,
            revoked_at: None,
            expires_at: None,
            rpm_limit: rpm,
            tpm_limit: tpm,
            budget: Default::default(),
            allowed_models: None,
        }
    }

    #[test]
    fn requests_per_minute_slide() {
        let rl = RateLimiter::default();
        let k = key(Some(2), None);
        let t0 = Instant::now();
        assert!(rl.admit(&k, 10, t0).1.is_ok());
        assert!(rl.admit(&k, 10, t0 + Duration::from_secs(10)).1.is_ok());
        let (headers, verdict) = rl.admit(&k, 10, t0 + Duration::from_secs(20));
        let err = verdict.unwrap_err();
        assert_eq!(err.status.as_u16(), 429);
        assert_eq!(err.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(err.retry_after, Some(40));
        assert_eq!(headers.requests, Some((2, 0, Duration::from_secs(40))));
        assert!(rl.admit(&k, 10, t0 + Duration::from_secs(61)).1.is_ok(), "the oldest request left the window");
    }

    #[test]
    fn tokens_per_minute_count_the_budget() {
        let rl = RateLimiter::default();
        let k = key(None, Some(100));
        let t0 = Instant::now();
        assert!(rl.admit(&k, 60, t0).1.is_ok());
        let (headers, verdict) = rl.admit(&k, 50, t0 + Duration::from_secs(5));
        assert_eq!(verdict.unwrap_err().error_type, "tokens");
        assert_eq!(headers.tokens.unwrap().1, 40);
        assert!(rl.admit(&k, 40, t0 + Duration::from_secs(5)).1.is_ok());
        let too_big = rl.admit(&k, 500, t0 + Duration::from_secs(100)).1.unwrap_err();
        assert!(too_big.message.contains("too large"), "{}", too_big.message);
    }

    #[test]
    fn unlimited_keys_get_no_headers() {
        let rl = RateLimiter::default();
        let (headers, verdict) = rl.admit(&key(None, None), 1_000_000, Instant::now());
        assert!(verdict.is_ok());
        let mut map = HeaderMap::new();
        headers.apply(&mut map);
        assert!(map.is_empty());
    }

    #[test]
    fn reset_format_matches_openai() {
        assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
        assert_eq!(format_reset(Duration::from_millis(1500)), "2s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
    }
}
