//! The usage ledger: one row per request, recorded exactly once.

use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

use crate::AccountsError;

/// Token usage of one finished (or failed) request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Unique per request; recording the same id twice is a no-op.
    pub request_id: String,
    pub key_id: i64,
    pub model: String,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// `"completed"`, `"length"`, `"cancelled"` or `"error"`.
    pub outcome: String,
    /// Unix milliseconds.
    pub started_at_ms: i64,
    /// Unix milliseconds.
    pub finished_at_ms: i64,
}

/// Usage totals for one key name and model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub key_name: String,
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
}

pub(crate) async fn record_usage(
    pool: &SqlitePool,
    rec: &UsageRecord,
) -> Result<(), AccountsError> {
    let inserted = sqlx::query(
        "INSERT INTO usage_records (request_id, key_id, model, prompt_tokens, cached_tokens, \
         completion_tokens, outcome, started_at_ms, finished_at_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (request_id) DO NOTHING",
    )
    .bind(&rec.request_id)
    .bind(rec.key_id)
    .bind(&rec.model)
    .bind(i64::from(rec.prompt_tokens))
    .bind(i64::from(rec.cached_tokens))
    .bind(i64::from(rec.completion_tokens))
    .bind(&rec.outcome)
    .bind(rec.started_at_ms)
    .bind(rec.finished_at_ms)
    .execute(pool)
    .await?
    .rows_affected();
    if inserted == 0 {
        tracing::debug!(request_id = %rec.request_id, "usage already recorded; ignoring duplicate");
    }
    Ok(())
}

pub(crate) async fn usage_summary(pool: &SqlitePool) -> Result<Vec<UsageRow>, AccountsError> {
    // CASTs keep the result types BIGINT on PostgreSQL too, where SUM(bigint) is NUMERIC.
    let rows: Vec<(String, String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT k.name, u.model, \
                CAST(COUNT(*) AS BIGINT), \
                CAST(COALESCE(SUM(u.prompt_tokens), 0) AS BIGINT), \
                CAST(COALESCE(SUM(u.cached_tokens), 0) AS BIGINT), \
                CAST(COALESCE(SUM(u.completion_tokens), 0) AS BIGINT) \
         FROM usage_records u JOIN api_keys k ON k.id = u.key_id \
         GROUP BY k.name, u.model \
         ORDER BY k.name, u.model",
    )
    .fetch_all(pool)
    .await?;
    let to_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(
            |(key_name, model, requests, prompt, cached, completion)| UsageRow {
                key_name,
                model,
                requests: to_u64(requests),
                prompt_tokens: to_u64(prompt),
                cached_tokens: to_u64(cached),
                completion_tokens: to_u64(completion),
            },
        )
        .collect())
}
