//! Per-key request and token counts per clock minute, kept in the database so that every
//! replica sharing it enforces one limit. (A single server uses its in-process sliding window
//! instead; see the server's rate_limit module.)

use sqlx::AnyPool;

use crate::AccountsError;

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

pub(crate) async fn admit(
    pool: &AnyPool,
    key_id: i64,
    now_ms: i64,
    tokens: i64,
    rpm: Option<i64>,
    tpm: Option<i64>,
) -> Result<RateWindow, AccountsError> {
    let minute = now_ms.div_euclid(60_000);
    let reset_ms = (minute + 1) * 60_000 - now_ms;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO rate_windows (key_id, minute) VALUES ($1, $2) ON CONFLICT (key_id, minute) DO NOTHING")
        .bind(key_id)
        .bind(minute)
        .execute(&mut *tx)
        .await?;
    let counted: Option<(i64, i64)> = sqlx::query_as(
        "UPDATE rate_windows SET requests = requests + 1, tokens = tokens + $3 \
         WHERE key_id = $1 AND minute = $2 AND ($4 IS NULL OR requests + 1 <= $4) AND ($5 IS NULL OR tokens + $3 <= $5) \
         RETURNING requests, tokens",
    )
    .bind(key_id)
    .bind(minute)
    .bind(tokens)
    .bind(rpm)
    .bind(tpm)
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
