//! The usage ledger: one row per request, recorded exactly once, and reports over it.

use serde::{Deserialize, Serialize};
use sqlx::AnyPool;

use crate::db::Backend;
use crate::money::NANOS_PER_USD;
use crate::AccountsError;

/// Token usage of one finished (or failed) request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// The server's id of the request, unique; recording the same id twice is a no-op.
    pub request_id: String,
    /// The `x-request-id` the client sent, if any: not unique (clients reuse ids).
    #[serde(default)]
    pub client_request_id: Option<String>,
    pub key_id: i64,
    pub model: String,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// The completion tokens spent thinking, already inside `completion_tokens`. Outbox lines
    /// written before the field existed read as 0.
    #[serde(default)]
    pub reasoning_tokens: u32,
    /// Cost at the model's configured price, USD × 1e9 (0 when the model has no price).
    pub cost_nanos: i64,
    /// The service tier it ran in: `default`, `flex` or `priority`. Outbox lines written before
    /// the field existed read as `default`.
    #[serde(default = "default_tier")]
    pub service_tier: String,
    /// The batch it was a line of, if any.
    #[serde(default)]
    pub batch_id: Option<String>,
    /// `"completed"`, `"length"`, `"cancelled"` or `"error"`.
    pub outcome: String,
    /// Unix milliseconds.
    pub started_at_ms: i64,
    /// Unix milliseconds.
    pub finished_at_ms: i64,
}

fn default_tier() -> String {
    "default".into()
}

/// Usage totals for one group (key, tenant, model, service tier, batch and, when asked for, day). Keys are
/// grouped by id: two keys may share a name, and a renamed key keeps its usage under its current name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    #[serde(default)]
    pub key_id: i64,
    pub key_name: String,
    pub tenant: String,
    pub model: String,
    /// `YYYY-MM-DD` (UTC) when grouped by day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<String>,
    #[serde(default = "default_tier")]
    pub service_tier: String,
    /// The batch whose lines these are; `None` for requests outside any batch. Each batch's spend
    /// is a group of its own.
    #[serde(default)]
    pub batch_id: Option<String>,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Part of `completion_tokens`: the tokens spent thinking.
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// USD.
    pub cost: f64,
}

/// Filters and grouping of a usage report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageQuery {
    pub key_name: Option<String>,
    pub tenant: Option<String>,
    pub model: Option<String>,
    /// Requests started at or after this moment (unix milliseconds).
    pub since_ms: Option<i64>,
    /// Requests started before this moment (unix milliseconds).
    pub until_ms: Option<i64>,
    /// Only the lines of this batch.
    pub batch_id: Option<String>,
    /// One row per UTC day as well.
    pub by_day: bool,
}

/// One request of the ledger, as `gantry usage --requests` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRow {
    pub request_id: String,
    pub client_request_id: Option<String>,
    pub key_name: String,
    pub tenant: String,
    pub model: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Part of `completion_tokens`: the tokens spent thinking.
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// USD.
    pub cost: f64,
    /// `completed`, `length`, `cancelled` or `error`.
    pub outcome: String,
    /// Unix milliseconds.
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    #[serde(default = "default_tier")]
    pub service_tier: String,
    #[serde(default)]
    pub batch_id: Option<String>,
}

type RequestTuple =
    (String, Option<String>, String, String, String, i64, i64, i64, i64, i64, String, i64, i64, String, Option<String>);

/// The requests matching `q` (its `by_day` is ignored), oldest first.
pub(crate) async fn requests(pool: &AnyPool, q: &UsageQuery) -> Result<Vec<RequestRow>, AccountsError> {
    let rows: Vec<RequestTuple> = sqlx::query_as(
        "SELECT u.request_id, u.client_request_id, k.name, u.tenant, u.model, u.prompt_tokens, u.cached_tokens, \
                u.completion_tokens, u.reasoning_tokens, u.cost_nanos, u.outcome, u.started_at_ms, u.finished_at_ms, \
                u.service_tier, u.batch_id \
         FROM usage_records u JOIN api_keys k ON k.id = u.key_id \
         WHERE ($1 IS NULL OR k.name = $1) AND ($2 IS NULL OR u.tenant = $2) AND ($3 IS NULL OR u.model = $3) \
           AND ($4 IS NULL OR u.started_at_ms >= $4) AND ($5 IS NULL OR u.started_at_ms < $5) \
           AND ($6 IS NULL OR u.batch_id = $6) \
         ORDER BY u.started_at_ms, u.request_id",
    )
    .bind(&q.key_name)
    .bind(&q.tenant)
    .bind(&q.model)
    .bind(q.since_ms)
    .bind(q.until_ms)
    .bind(&q.batch_id)
    .fetch_all(pool)
    .await?;
    let to_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(
            |(
                request_id,
                client_request_id,
                key_name,
                tenant,
                model,
                p,
                c,
                o,
                r,
                nanos,
                outcome,
                started,
                finished,
                service_tier,
                batch_id,
            )| {
                RequestRow {
                    request_id,
                    client_request_id,
                    key_name,
                    tenant,
                    model,
                    prompt_tokens: to_u64(p),
                    cached_tokens: to_u64(c),
                    completion_tokens: to_u64(o),
                    reasoning_tokens: to_u64(r),
                    cost: nanos as f64 / NANOS_PER_USD as f64,
                    outcome,
                    started_at_ms: started,
                    finished_at_ms: finished,
                    service_tier,
                    batch_id,
                }
            },
        )
        .collect())
}

type ReportRow = (i64, String, String, String, Option<String>, String, Option<String>, i64, i64, i64, i64, i64, i64);

pub(crate) async fn report(pool: &AnyPool, backend: Backend, q: &UsageQuery) -> Result<Vec<UsageRow>, AccountsError> {
    let day = if q.by_day { backend.day_of_ms("u.started_at_ms") } else { "CAST(NULL AS TEXT)".to_string() };
    // CASTs keep the result types BIGINT on PostgreSQL too, where SUM(bigint) is NUMERIC. SQLite
    // sorts NULL first and PostgreSQL last: the COALESCE puts requests outside a batch first on both.
    let sql = format!(
        "SELECT k.id, k.name, u.tenant, u.model, {day} AS day, u.service_tier, u.batch_id, \
                CAST(COUNT(*) AS BIGINT), \
                CAST(COALESCE(SUM(u.prompt_tokens), 0) AS BIGINT), \
                CAST(COALESCE(SUM(u.cached_tokens), 0) AS BIGINT), \
                CAST(COALESCE(SUM(u.completion_tokens), 0) AS BIGINT), \
                CAST(COALESCE(SUM(u.reasoning_tokens), 0) AS BIGINT), \
                CAST(COALESCE(SUM(u.cost_nanos), 0) AS BIGINT) \
         FROM usage_records u JOIN api_keys k ON k.id = u.key_id \
         WHERE ($1 IS NULL OR k.name = $1) AND ($2 IS NULL OR u.tenant = $2) AND ($3 IS NULL OR u.model = $3) \
           AND ($4 IS NULL OR u.started_at_ms >= $4) AND ($5 IS NULL OR u.started_at_ms < $5) \
           AND ($6 IS NULL OR u.batch_id = $6) \
         GROUP BY k.id, k.name, u.tenant, u.model, day, u.service_tier, u.batch_id \
         ORDER BY k.name, k.id, u.tenant, u.model, day, u.service_tier, COALESCE(u.batch_id, '')"
    );
    let rows: Vec<ReportRow> = sqlx::query_as(&sql)
        .bind(&q.key_name)
        .bind(&q.tenant)
        .bind(&q.model)
        .bind(q.since_ms)
        .bind(q.until_ms)
        .bind(&q.batch_id)
        .fetch_all(pool)
        .await?;
    let to_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(
            |(
                key_id,
                key_name,
                tenant,
                model,
                day,
                service_tier,
                batch_id,
                requests,
                prompt,
                cached,
                completion,
                reasoning,
                nanos,
            )| {
                UsageRow {
                    key_id,
                    key_name,
                    tenant,
                    model,
                    day,
                    service_tier,
                    batch_id,
                    requests: to_u64(requests),
                    prompt_tokens: to_u64(prompt),
                    cached_tokens: to_u64(cached),
                    completion_tokens: to_u64(completion),
                    reasoning_tokens: to_u64(reasoning),
                    cost: nanos as f64 / NANOS_PER_USD as f64,
                }
            },
        )
        .collect())
}
