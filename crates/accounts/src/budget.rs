//! Budgets: admission reserves the most a request can cost, settlement books what it did cost.
//!
//! Each key has one `key_spend` row per budget period holding settled and reserved amounts. A
//! settlement is booked in both kinds of period (the lifetime `total` and its month), so changing
//! a key's `budget_period` keeps what it spent; reservations are held in the period admitted under.
//! Admission is a single conditional `UPDATE … WHERE spent + reserved + this <= budget`, so
//! concurrent requests (in one process or many sharing the database) can never push a key past
//! its budget. Settlement writes the ledger row and moves the reservation to `spent` in one
//! transaction, keyed on the request id, so a retried settlement never counts twice.

use serde::{Deserialize, Serialize};
use sqlx::AnyPool;

use crate::keys::KeyInfo;
use crate::money::{BudgetPeriod, NANOS_PER_USD};
use crate::usage::UsageRecord;
use crate::AccountsError;

/// What a request may spend at most: held against the key's budget while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub request_id: String,
    pub tokens: i64,
    pub nanos: i64,
    /// The server process holding it (see [`crate::Accounts::release_reservations_of`]).
    pub owner: String,
    pub at_ms: i64,
}

/// Settled and reserved amounts of one key in its current budget period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    pub spent_tokens: i64,
    pub spent_nanos: i64,
    pub reserved_tokens: i64,
    pub reserved_nanos: i64,
}

/// Holds `r` against the key's budget, or refuses with [`AccountsError::QuotaExceeded`].
/// Keys without a budget still get a reservation row, so settlement is uniform.
pub(crate) async fn reserve(pool: &AnyPool, key: &KeyInfo, r: &Reservation) -> Result<(), AccountsError> {
    let period = key.budget.period.bucket(r.at_ms);
    let mut tx = pool.begin().await?;
    ensure_spend_row(&mut tx, key.id, &period).await?;
    // The budget is read from the key's row inside the statement, so an update made by another
    // replica a moment ago applies.
    let admitted = sqlx::query(
        "UPDATE key_spend SET reserved_tokens = reserved_tokens + $1, reserved_nanos = reserved_nanos + $2 \
         WHERE key_id = $3 AND period = $4 \
           AND ((SELECT budget_tokens FROM api_keys WHERE id = $3) IS NULL \
                OR spent_tokens + reserved_tokens + $1 <= (SELECT budget_tokens FROM api_keys WHERE id = $3)) \
           AND ((SELECT budget_nanos FROM api_keys WHERE id = $3) IS NULL \
                OR spent_nanos + reserved_nanos + $2 <= (SELECT budget_nanos FROM api_keys WHERE id = $3))",
    )
    .bind(r.tokens)
    .bind(r.nanos)
    .bind(key.id)
    .bind(&period)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if admitted == 0 {
        let spend = spend_in(&mut tx, key.id, &period).await?;
        tx.rollback().await?;
        return Err(AccountsError::QuotaExceeded(refusal(key, &spend, r)));
    }
    sqlx::query(
        "INSERT INTO reservations (request_id, key_id, period, tokens, nanos, owner, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&r.request_id)
    .bind(key.id)
    .bind(&period)
    .bind(r.tokens)
    .bind(r.nanos)
    .bind(&r.owner)
    .bind(r.at_ms)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

fn refusal(key: &KeyInfo, s: &Spend, r: &Reservation) -> String {
    let period = match key.budget.period {
        BudgetPeriod::Total => "",
        BudgetPeriod::Month => " this month",
    };
    if let Some(limit) = key.budget.tokens.filter(|&b| s.spent_tokens + s.reserved_tokens + r.tokens > b) {
        let left = (limit - s.spent_tokens - s.reserved_tokens).max(0);
        return format!(
            "You exceeded your current quota: this request may use up to {} tokens (prompt plus max_tokens), \
             but the key has {left} of its {limit}-token budget left{period}. Lower max_tokens or raise the budget.",
            r.tokens
        );
    }
    let limit = key.budget.nanos.unwrap_or(0);
    let left = (limit - s.spent_nanos - s.reserved_nanos).max(0);
    format!(
        "You exceeded your current quota: this request may cost up to ${:.6}, but the key has ${:.6} of its ${:.2} budget left{period}. \
         Lower max_tokens or raise the budget.",
        r.nanos as f64 / NANOS_PER_USD as f64,
        left as f64 / NANOS_PER_USD as f64,
        limit as f64 / NANOS_PER_USD as f64,
    )
}

async fn spend_in(conn: &mut sqlx::AnyConnection, key_id: i64, period: &str) -> Result<Spend, AccountsError> {
    let row: Option<(i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT spent_tokens, spent_nanos, reserved_tokens, reserved_nanos FROM key_spend WHERE key_id = $1 AND period = $2",
    )
    .bind(key_id)
    .bind(period)
    .fetch_optional(conn)
    .await?;
    Ok(row
        .map(|(spent_tokens, spent_nanos, reserved_tokens, reserved_nanos)| Spend {
            spent_tokens,
            spent_nanos,
            reserved_tokens,
            reserved_nanos,
        })
        .unwrap_or_default())
}

/// The key's spend in the budget period containing `at_ms`.
pub(crate) async fn spend(pool: &AnyPool, key: &KeyInfo, at_ms: i64) -> Result<Spend, AccountsError> {
    let mut conn = pool.acquire().await?;
    spend_in(&mut conn, key.id, &key.budget.period.bucket(at_ms)).await
}

/// Writes the ledger row and books its tokens and cost, releasing the request's reservation,
/// all in one transaction. Idempotent on `request_id`.
pub(crate) async fn settle(pool: &AnyPool, rec: &UsageRecord) -> Result<(), AccountsError> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO usage_records (request_id, key_id, tenant, model, prompt_tokens, cached_tokens, \
         completion_tokens, cost_nanos, outcome, started_at_ms, finished_at_ms, client_request_id, \
         reasoning_tokens, service_tier, batch_id) \
         SELECT $1, id, tenant, $2, $3, $4, $5, $6, $7, $8, $9, $11, $12, $13, $14 FROM api_keys WHERE id = $10 \
         ON CONFLICT (request_id) DO NOTHING",
    )
    .bind(&rec.request_id)
    .bind(&rec.model)
    .bind(i64::from(rec.prompt_tokens))
    .bind(i64::from(rec.cached_tokens))
    .bind(i64::from(rec.completion_tokens))
    .bind(rec.cost_nanos)
    .bind(&rec.outcome)
    .bind(rec.started_at_ms)
    .bind(rec.finished_at_ms)
    .bind(rec.key_id)
    .bind(&rec.client_request_id)
    .bind(i64::from(rec.reasoning_tokens))
    .bind(&rec.service_tier)
    .bind(&rec.batch_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT CAST(1 AS BIGINT) FROM usage_records WHERE request_id = $1")
                .bind(&rec.request_id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.rollback().await?;
        if exists.is_none() {
            return Err(AccountsError::NotFound(format!("API key {}", rec.key_id)));
        }
        tracing::debug!(request_id = %rec.request_id, "usage already recorded; ignoring duplicate");
        return Ok(());
    }
    let held: Option<(String, i64, i64)> =
        sqlx::query_as("DELETE FROM reservations WHERE request_id = $1 RETURNING period, tokens, nanos")
            .bind(&rec.request_id)
            .fetch_optional(&mut *tx)
            .await?;
    let tokens = i64::from(rec.prompt_tokens) + i64::from(rec.completion_tokens);
    let (period, held_tokens, held_nanos) = match held {
        Some(h) => h,
        None => {
            // Settled without a reservation (e.g. recorded by a tool): book it in the period the
            // request started in.
            let period: String = sqlx::query_scalar("SELECT budget_period FROM api_keys WHERE id = $1")
                .bind(rec.key_id)
                .fetch_one(&mut *tx)
                .await?;
            let period: BudgetPeriod = period.parse().unwrap_or_default();
            (period.bucket(rec.started_at_ms), 0, 0)
        }
    };
    ensure_spend_row(&mut tx, rec.key_id, &period).await?;
    sqlx::query(
        "UPDATE key_spend SET spent_tokens = spent_tokens + $1, spent_nanos = spent_nanos + $2, \
         reserved_tokens = reserved_tokens - $3, reserved_nanos = reserved_nanos - $4 WHERE key_id = $5 AND period = $6",
    )
    .bind(tokens)
    .bind(rec.cost_nanos)
    .bind(held_tokens)
    .bind(held_nanos)
    .bind(rec.key_id)
    .bind(&period)
    .execute(&mut *tx)
    .await?;
    // Spend is kept in both kinds of period, so a key whose budget_period changes keeps what it
    // spent: the reservation's bucket above, and the other kind's here.
    let other = if period == BudgetPeriod::Total.bucket(rec.started_at_ms) {
        BudgetPeriod::Month.bucket(rec.started_at_ms)
    } else {
        BudgetPeriod::Total.bucket(rec.started_at_ms)
    };
    ensure_spend_row(&mut tx, rec.key_id, &other).await?;
    sqlx::query(
        "UPDATE key_spend SET spent_tokens = spent_tokens + $1, spent_nanos = spent_nanos + $2 \
         WHERE key_id = $3 AND period = $4",
    )
    .bind(tokens)
    .bind(rec.cost_nanos)
    .bind(rec.key_id)
    .bind(&other)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Drops a reservation without booking anything (the request never reached the engine).
pub(crate) async fn release(pool: &AnyPool, request_id: &str) -> Result<(), AccountsError> {
    release_where(pool, "request_id = $1", Bind::Text(request_id)).await.map(drop)
}

/// The key's spend row for `period`, created at zero on first use.
async fn ensure_spend_row(conn: &mut sqlx::AnyConnection, key_id: i64, period: &str) -> Result<(), AccountsError> {
    sqlx::query("INSERT INTO key_spend (key_id, period) VALUES ($1, $2) ON CONFLICT (key_id, period) DO NOTHING")
        .bind(key_id)
        .bind(period)
        .execute(conn)
        .await?;
    Ok(())
}

async fn unreserve(
    conn: &mut sqlx::AnyConnection,
    key_id: i64,
    period: &str,
    tokens: i64,
    nanos: i64,
) -> Result<(), AccountsError> {
    sqlx::query(
        "UPDATE key_spend SET reserved_tokens = reserved_tokens - $1, reserved_nanos = reserved_nanos - $2 \
         WHERE key_id = $3 AND period = $4",
    )
    .bind(tokens)
    .bind(nanos)
    .bind(key_id)
    .bind(period)
    .execute(conn)
    .await?;
    Ok(())
}

/// Releases every reservation held by `owner` (a server that crashed and restarted). Returns
/// how many were released.
pub(crate) async fn release_owner(pool: &AnyPool, owner: &str) -> Result<u64, AccountsError> {
    release_where(pool, "owner = $1", Bind::Text(owner)).await
}

/// Releases reservations made before `cutoff_ms`, whoever holds them: a replica that died and
/// never came back would otherwise hold its share of the budget forever.
pub(crate) async fn release_older_than(pool: &AnyPool, cutoff_ms: i64) -> Result<u64, AccountsError> {
    release_where(pool, "created_at_ms < $1", Bind::Int(cutoff_ms)).await
}

pub(crate) enum Bind<'a> {
    Text(&'a str),
    Int(i64),
}

pub(crate) async fn release_where(pool: &AnyPool, condition: &str, value: Bind<'_>) -> Result<u64, AccountsError> {
    let mut tx = pool.begin().await?;
    let sql = format!("DELETE FROM reservations WHERE {condition} RETURNING key_id, period, tokens, nanos");
    let query = sqlx::query_as(&sql);
    let query = match value {
        Bind::Text(t) => query.bind(t),
        Bind::Int(i) => query.bind(i),
    };
    let held: Vec<(i64, String, i64, i64)> = query.fetch_all(&mut *tx).await?;
    for (key_id, period, tokens, nanos) in &held {
        unreserve(&mut tx, *key_id, period, *tokens, *nanos).await?;
    }
    tx.commit().await?;
    Ok(held.len() as u64)
}
