//! Per-key requests-per-minute and tokens-per-minute limits, checked at admission.
//!
//! Tokens are counted as OpenAI counts them at admission: prompt tokens plus the completion
//! budget. A single server (SQLite) keeps a sliding 60-second window in memory
//! ([`LocalWindows`]); replicas sharing PostgreSQL count per clock minute in the database
//! ([`admit_shared`]), so one limit holds across all of them (a burst straddling a minute
//! boundary may see up to twice the limit within 60 seconds).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::AnyPool;

use crate::AccountsError;

const WINDOW: Duration = Duration::from_secs(60);

/// One limit as the `x-ratelimit-*` headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    pub limit: u64,
    pub remaining: u64,
    /// Until the window has room again.
    pub reset: Duration,
}

/// The key's request and token allowances at admission (`None`: no such limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateStatus {
    pub requests: Option<Allowance>,
    pub tokens: Option<Allowance>,
}

/// Why a request was refused by a rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateRefusal {
    Requests {
        limit: u64,
        retry_after: Duration,
    },
    /// `requested > limit` means the request can never fit.
    Tokens {
        limit: u64,
        used: u64,
        requested: u64,
        retry_after: Duration,
    },
}

/// What one admission step counts against a key's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A request and its tokens at once.
    RequestAndTokens(u64),
    /// The request alone, before its size is known (pre-admission): refused when the request
    /// limit is reached or not one token is left in the window.
    Request,
    /// The tokens of a request already counted by [`Count::Request`].
    Tokens(u64),
}

impl Count {
    fn parts(self) -> (bool, u64) {
        match self {
            Count::RequestAndTokens(tokens) => (true, tokens),
            Count::Request => (true, 0),
            Count::Tokens(tokens) => (false, tokens),
        }
    }
}

/// What the shared window says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindow {
    pub admitted: bool,
    /// Requests and tokens counted in this minute, this request included when admitted.
    pub requests: i64,
    pub tokens: i64,
    /// Milliseconds until the window resets.
    pub reset_ms: i64,
}

/// Sliding 60-second windows kept in this process (one server on SQLite).
#[derive(Default)]
pub struct LocalWindows {
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
        if sum + needed <= limit {
            Duration::ZERO
        } else {
            WINDOW
        }
    }
}

impl LocalWindows {
    /// Counts a request of `tokens` for `key_id`, or refuses it (and counts nothing).
    pub fn admit(
        &self,
        key_id: i64,
        rpm: Option<u64>,
        tpm: Option<u64>,
        tokens: u64,
        now: Instant,
    ) -> (RateStatus, Result<(), RateRefusal>) {
        self.count(key_id, rpm, tpm, Count::RequestAndTokens(tokens), now)
    }

    /// Counts what `count` says for `key_id`, or refuses it (and counts nothing).
    pub fn count(
        &self,
        key_id: i64,
        rpm: Option<u64>,
        tpm: Option<u64>,
        count: Count,
        now: Instant,
    ) -> (RateStatus, Result<(), RateRefusal>) {
        let (request, tokens) = count.parts();
        if rpm.is_none() && tpm.is_none() {
            return (RateStatus::default(), Ok(()));
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let w = windows.entry(key_id).or_default();
        w.expire(now);
        let request_wait = match rpm {
            Some(limit) if request && w.requests.len() as u64 >= limit => {
                let oldest = w.requests[w.requests.len() - limit as usize];
                Some((oldest + WINDOW).saturating_duration_since(now))
            }
            _ => None,
        };
        // Counting no tokens still needs room for one: a key whose window is full is refused.
        let token_wait = tpm.map(|limit| w.token_wait(limit, tokens.max(1), now)).filter(|d| !d.is_zero());
        let verdict = match (request_wait, token_wait) {
            (None, None) => {
                if request {
                    w.requests.push_back(now);
                }
                if tokens > 0 {
                    w.tokens.push_back((now, tokens));
                    w.token_sum += tokens;
                }
                Ok(())
            }
            (Some(retry_after), _) => Err(RateRefusal::Requests { limit: rpm.unwrap_or(0), retry_after }),
            (None, Some(retry_after)) => {
                Err(RateRefusal::Tokens { limit: tpm.unwrap_or(0), used: w.token_sum, requested: tokens, retry_after })
            }
        };
        let first_request = w.requests.front().copied().unwrap_or(now);
        let first_tokens = w.tokens.front().map_or(now, |&(t, _)| t);
        let status = RateStatus {
            requests: rpm.map(|limit| Allowance {
                limit,
                remaining: limit.saturating_sub(w.requests.len() as u64),
                reset: (first_request + WINDOW).saturating_duration_since(now),
            }),
            tokens: tpm.map(|limit| Allowance {
                limit,
                remaining: limit.saturating_sub(w.token_sum),
                reset: (first_tokens + WINDOW).saturating_duration_since(now),
            }),
        };
        (status, verdict)
    }

    /// Takes back `tokens` counted for `key_id` by a request refused after counting (its budget
    /// could not cover it): a refused request uses none of the key's tokens per minute.
    pub fn refund(&self, key_id: i64, tokens: u64) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = windows.get_mut(&key_id) else { return };
        if let Some(i) = w.tokens.iter().rposition(|&(_, n)| n == tokens) {
            w.tokens.remove(i);
            w.token_sum -= tokens;
        }
    }
}

/// [`LocalWindows::refund`] for the window in the shared database: the minute it was counted in
/// (`counted_at_ms`) gives the tokens back.
pub(crate) async fn refund_shared(
    pool: &AnyPool,
    key_id: i64,
    counted_at_ms: i64,
    tokens: u64,
) -> Result<(), AccountsError> {
    let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
    sqlx::query("UPDATE rate_windows SET tokens = tokens - $3 WHERE key_id = $1 AND minute = $2 AND tokens >= $3")
        .bind(key_id)
        .bind(counted_at_ms.div_euclid(60_000))
        .bind(tokens)
        .execute(pool)
        .await?;
    Ok(())
}

/// The same check against the per-minute window kept in the shared database.
pub(crate) async fn admit_shared(
    pool: &AnyPool,
    key_id: i64,
    rpm: Option<i64>,
    tpm: Option<i64>,
    count: Count,
    now_ms: i64,
) -> Result<(RateStatus, Result<(), RateRefusal>), AccountsError> {
    if rpm.is_none() && tpm.is_none() {
        return Ok((RateStatus::default(), Ok(())));
    }
    let (request, tokens) = count.parts();
    let w = count_shared(pool, key_id, now_ms, count, rpm, tpm).await?;
    let reset = Duration::from_millis(w.reset_ms.max(0) as u64);
    let status = RateStatus {
        requests: rpm.map(|l| Allowance { limit: l as u64, remaining: (l - w.requests).max(0) as u64, reset }),
        tokens: tpm.map(|l| Allowance { limit: l as u64, remaining: (l - w.tokens).max(0) as u64, reset }),
    };
    if w.admitted {
        return Ok((status, Ok(())));
    }
    let refusal = match rpm {
        Some(limit) if request && w.requests + 1 > limit => {
            RateRefusal::Requests { limit: limit as u64, retry_after: reset }
        }
        _ => RateRefusal::Tokens {
            limit: tpm.unwrap_or(0) as u64,
            used: w.tokens.max(0) as u64,
            requested: tokens,
            retry_after: reset,
        },
    };
    Ok((status, Err(refusal)))
}

pub(crate) async fn admit(
    pool: &AnyPool,
    key_id: i64,
    now_ms: i64,
    tokens: i64,
    rpm: Option<i64>,
    tpm: Option<i64>,
) -> Result<RateWindow, AccountsError> {
    count_shared(pool, key_id, now_ms, Count::RequestAndTokens(tokens.max(0) as u64), rpm, tpm).await
}

async fn count_shared(
    pool: &AnyPool,
    key_id: i64,
    now_ms: i64,
    count: Count,
    rpm: Option<i64>,
    tpm: Option<i64>,
) -> Result<RateWindow, AccountsError> {
    let (request, tokens) = count.parts();
    let (requests, tokens, needed) = (i64::from(request), tokens as i64, tokens.max(1) as i64);
    let minute = now_ms.div_euclid(60_000);
    let reset_ms = (minute + 1) * 60_000 - now_ms;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO rate_windows (key_id, minute) VALUES ($1, $2) ON CONFLICT (key_id, minute) DO NOTHING")
        .bind(key_id)
        .bind(minute)
        .execute(&mut *tx)
        .await?;
    let counted: Option<(i64, i64)> = sqlx::query_as(
        "UPDATE rate_windows SET requests = requests + $6, tokens = tokens + $3 \
         WHERE key_id = $1 AND minute = $2 AND ($4 IS NULL OR requests + $6 <= $4) AND ($5 IS NULL OR tokens + $7 <= $5) \
         RETURNING requests, tokens",
    )
    .bind(key_id)
    .bind(minute)
    .bind(tokens)
    .bind(rpm)
    .bind(tpm)
    .bind(requests)
    .bind(needed)
    .fetch_optional(&mut *tx)
    .await?;
    let window = match counted {
        Some((requests, tokens)) => RateWindow { admitted: true, requests, tokens, reset_ms },
        None => {
            let (requests, tokens): (i64, i64) =
                sqlx::query_as("SELECT requests, tokens FROM rate_windows WHERE key_id = $1 AND minute = $2")
                    .bind(key_id)
                    .bind(minute)
                    .fetch_one(&mut *tx)
                    .await?;
            RateWindow { admitted: false, requests, tokens, reset_ms }
        }
    };
    // Old minutes are never read again.
    sqlx::query("DELETE FROM rate_windows WHERE key_id = $1 AND minute < $2")
        .bind(key_id)
        .bind(minute)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_per_minute_slide() {
        let rl = LocalWindows::default();
        let t0 = Instant::now();
        assert!(rl.admit(1, Some(2), None, 10, t0).1.is_ok());
        assert!(rl.admit(1, Some(2), None, 10, t0 + Duration::from_secs(10)).1.is_ok());
        let (status, verdict) = rl.admit(1, Some(2), None, 10, t0 + Duration::from_secs(20));
        assert_eq!(verdict, Err(RateRefusal::Requests { limit: 2, retry_after: Duration::from_secs(40) }));
        assert_eq!(status.requests, Some(Allowance { limit: 2, remaining: 0, reset: Duration::from_secs(40) }));
        assert!(
            rl.admit(1, Some(2), None, 10, t0 + Duration::from_secs(61)).1.is_ok(),
            "the oldest request left the window"
        );
    }

    #[test]
    fn refunded_tokens_leave_the_window() {
        let rl = LocalWindows::default();
        let t0 = Instant::now();
        assert!(rl.admit(1, None, Some(100), 60, t0).1.is_ok());
        assert!(rl.admit(1, None, Some(100), 30, t0).1.is_ok());
        rl.refund(1, 30);
        rl.refund(2, 30);
        let (status, verdict) = rl.admit(1, None, Some(100), 40, t0 + Duration::from_secs(1));
        assert!(verdict.is_ok(), "{verdict:?}");
        assert_eq!(status.tokens.unwrap().remaining, 0);
    }

    #[test]
    fn tokens_per_minute_count_the_budget() {
        let rl = LocalWindows::default();
        let t0 = Instant::now();
        assert!(rl.admit(1, None, Some(100), 60, t0).1.is_ok());
        let (status, verdict) = rl.admit(1, None, Some(100), 50, t0 + Duration::from_secs(5));
        assert!(matches!(verdict, Err(RateRefusal::Tokens { limit: 100, used: 60, requested: 50, .. })), "{verdict:?}");
        assert_eq!(status.tokens.unwrap().remaining, 40);
        assert!(rl.admit(1, None, Some(100), 40, t0 + Duration::from_secs(5)).1.is_ok());
        let too_big = rl.admit(1, None, Some(100), 500, t0 + Duration::from_secs(100)).1;
        assert!(matches!(too_big, Err(RateRefusal::Tokens { requested: 500, limit: 100, .. })));
    }

    #[test]
    fn a_pre_admitted_request_is_counted_once() {
        let rl = LocalWindows::default();
        let t0 = Instant::now();
        let (status, verdict) = rl.count(1, Some(2), Some(100), Count::Request, t0);
        assert!(verdict.is_ok());
        assert_eq!((status.requests.unwrap().remaining, status.tokens.unwrap().remaining), (1, 100));
        // Its tokens, once known, are counted without counting the request again.
        let (status, verdict) = rl.count(1, Some(2), Some(100), Count::Tokens(100), t0);
        assert!(verdict.is_ok());
        assert_eq!((status.requests.unwrap().remaining, status.tokens.unwrap().remaining), (1, 0));
        // With no token left, even a request whose size is unknown is refused, and not counted.
        let (status, verdict) = rl.count(1, Some(2), Some(100), Count::Request, t0);
        assert!(matches!(verdict, Err(RateRefusal::Tokens { limit: 100, used: 100, .. })), "{verdict:?}");
        assert_eq!(status.requests.unwrap().remaining, 1);
        let later = t0 + Duration::from_secs(61);
        assert!(rl.count(1, Some(2), Some(100), Count::Request, later).1.is_ok());
        assert!(rl.count(1, Some(2), Some(100), Count::Request, later).1.is_ok());
        let (_, verdict) = rl.count(1, Some(2), Some(100), Count::Request, later);
        assert!(matches!(verdict, Err(RateRefusal::Requests { limit: 2, .. })), "{verdict:?}");
    }

    #[test]
    fn unlimited_keys_report_no_limits() {
        let rl = LocalWindows::default();
        let (status, verdict) = rl.admit(1, None, None, 1_000_000, Instant::now());
        assert!(verdict.is_ok());
        assert_eq!(status, RateStatus::default());
    }
}
