//! Stored responses (the Responses API's `store: true`): one row per response, scoped to the key
//! that made it. Every read, continuation and delete names the key, so one key never sees
//! another's; expired rows are never returned and are swept as new ones are written. A row keeps
//! its own turn's items and the id of the response it continued, so a long conversation costs
//! its length once, not once per turn.
//!
//! Each row records its size (`bytes`); a key holds at most [`StoredQuota`] of them, its oldest
//! dropped first when a new one would pass it, and a conversation is read only up to
//! [`MAX_CONVERSATION_BYTES`].

use sqlx::AnyPool;

use crate::AccountsError;

/// How many responses back a conversation may reach.
pub const MAX_CONVERSATION_DEPTH: usize = 1000;
/// The most bytes of stored responses (items and Response objects) one conversation may add up
/// to; past it, continuing it is refused rather than read into memory.
pub const MAX_CONVERSATION_BYTES: u64 = 16 * 1024 * 1024;

/// What one key may keep stored at once. A new response past either bound drops the key's
/// oldest responses until the key is within both again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredQuota {
    pub rows: u64,
    pub bytes: u64,
}

impl NewStoredResponse<'_> {
    /// What the row takes: its items and its Response object.
    pub fn bytes(&self) -> u64 {
        (self.items.len() + self.response.len()) as u64
    }
}

/// A response to keep: its id, the key that made it, when, until when, what it continued, its
/// turn's items and the Response object.
#[derive(Debug, Clone)]
pub struct NewStoredResponse<'a> {
    pub id: &'a str,
    pub key_id: i64,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub previous_id: Option<&'a str>,
    /// This turn's input items and the output items (a JSON array).
    pub items: String,
    /// The Response object (JSON).
    pub response: String,
}

/// Stores `new`, then drops the key's oldest responses past `quota`; returns how many went.
pub(crate) async fn store(
    pool: &AnyPool,
    new: &NewStoredResponse<'_>,
    quota: StoredQuota,
) -> Result<u64, AccountsError> {
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    sqlx::query("DELETE FROM stored_responses WHERE expires_at_ms <= $1").bind(new.created_at_ms).execute(pool).await?;
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO stored_responses (id, key_id, created_at_ms, expires_at_ms, previous_id, items, response, bytes)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(new.id)
    .bind(new.key_id)
    .bind(new.created_at_ms)
    .bind(new.expires_at_ms)
    .bind(new.previous_id)
    .bind(&new.items)
    .bind(&new.response)
    .bind(as_i64(new.bytes()))
    .execute(&mut *tx)
    .await?;
    // Newest first, each row with what it and every newer row take: the rows past either bound
    // are the oldest ones.
    let dropped = sqlx::query(
        "DELETE FROM stored_responses WHERE id IN (
             SELECT id FROM (
                 SELECT id,
                        SUM(bytes) OVER (ORDER BY created_at_ms DESC, id DESC) AS held,
                        ROW_NUMBER() OVER (ORDER BY created_at_ms DESC, id DESC) AS place
                   FROM stored_responses WHERE key_id = $1
             ) AS ranked
              WHERE held > $2 OR place > $3
         )",
    )
    .bind(new.key_id)
    .bind(as_i64(quota.bytes))
    .bind(as_i64(quota.rows))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(dropped.rows_affected())
}

type Row = (Option<String>, String, String);

async fn row(pool: &AnyPool, key_id: i64, id: &str, now_ms: i64) -> Result<Option<Row>, AccountsError> {
    Ok(sqlx::query_as(
        "SELECT previous_id, items, response FROM stored_responses WHERE id = $1 AND key_id = $2 AND expires_at_ms > $3",
    )
    .bind(id)
    .bind(key_id)
    .bind(now_ms)
    .fetch_optional(pool)
    .await?)
}

/// The Response object `id` of this key, unless it expired.
pub(crate) async fn response(
    pool: &AnyPool,
    key_id: i64,
    id: &str,
    now_ms: i64,
) -> Result<Option<String>, AccountsError> {
    Ok(row(pool, key_id, id, now_ms).await?.map(|(_, _, response)| response))
}

/// The Response object `id` of this key and the items of its own turn (its input, then its
/// output), unless it expired.
pub(crate) async fn response_and_items(
    pool: &AnyPool,
    key_id: i64,
    id: &str,
    now_ms: i64,
) -> Result<Option<(String, String)>, AccountsError> {
    Ok(row(pool, key_id, id, now_ms).await?.map(|(_, items, response)| (response, items)))
}

/// The conversation that ends with response `id`: each turn's items (JSON arrays), oldest
/// first, read in one recursive query. `None` when `id`, or a response it continued, is not this
/// key's or has expired or been deleted; `Invalid` past [`MAX_CONVERSATION_DEPTH`] turns or
/// [`MAX_CONVERSATION_BYTES`] (the walk stops one row past either, so no more is read).
pub(crate) async fn conversation(
    pool: &AnyPool,
    key_id: i64,
    id: &str,
    now_ms: i64,
) -> Result<Option<Vec<String>>, AccountsError> {
    // The rows' sizes are summed before their text is fetched: the walk stops at the bound.
    let steps: Vec<(String, i64)> = sqlx::query_as(
        "WITH RECURSIVE chain (id, previous_id, depth, held) AS (
             SELECT id, previous_id, 0, bytes FROM stored_responses
              WHERE id = $1 AND key_id = $2 AND expires_at_ms > $3
             UNION ALL
             SELECT s.id, s.previous_id, c.depth + 1, c.held + s.bytes FROM stored_responses s
               JOIN chain c ON s.id = c.previous_id
              WHERE s.key_id = $2 AND s.expires_at_ms > $3 AND c.depth < $4 AND c.held <= $5
         )
         SELECT id, held FROM chain ORDER BY depth DESC",
    )
    .bind(id)
    .bind(key_id)
    .bind(now_ms)
    .bind(i64::try_from(MAX_CONVERSATION_DEPTH).unwrap_or(i64::MAX))
    .bind(i64::try_from(MAX_CONVERSATION_BYTES).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    if steps.len() > MAX_CONVERSATION_DEPTH {
        return Err(AccountsError::Invalid(format!("conversation longer than {MAX_CONVERSATION_DEPTH} responses")));
    }
    if steps.first().is_some_and(|&(_, held)| held as u64 > MAX_CONVERSATION_BYTES) {
        return Err(AccountsError::Invalid(format!(
            "conversation larger than {} MiB of stored responses",
            MAX_CONVERSATION_BYTES / (1024 * 1024)
        )));
    }
    let rows: Vec<(Option<String>, String)> = sqlx::query_as(
        "WITH RECURSIVE chain (id, previous_id, items, depth) AS (
             SELECT id, previous_id, items, 0 FROM stored_responses
              WHERE id = $1 AND key_id = $2 AND expires_at_ms > $3
             UNION ALL
             SELECT s.id, s.previous_id, s.items, c.depth + 1 FROM stored_responses s
               JOIN chain c ON s.id = c.previous_id
              WHERE s.key_id = $2 AND s.expires_at_ms > $3 AND c.depth < $4
         )
         SELECT previous_id, items FROM chain ORDER BY depth DESC",
    )
    .bind(id)
    .bind(key_id)
    .bind(now_ms)
    .bind(i64::try_from(steps.len().saturating_sub(1)).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    // The oldest turn continues nothing, or the chain broke at a response that is gone.
    match rows.first() {
        Some((None, _)) => Ok(Some(rows.into_iter().map(|(_, items)| items).collect())),
        _ => Ok(None),
    }
}

/// Whether a row of this key's was deleted.
pub(crate) async fn delete(pool: &AnyPool, key_id: i64, id: &str) -> Result<bool, AccountsError> {
    let done = sqlx::query("DELETE FROM stored_responses WHERE id = $1 AND key_id = $2")
        .bind(id)
        .bind(key_id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

pub(crate) async fn delete_all_of(pool: &AnyPool, key_id: i64) -> Result<u64, AccountsError> {
    let done = sqlx::query("DELETE FROM stored_responses WHERE key_id = $1").bind(key_id).execute(pool).await?;
    Ok(done.rows_affected())
}
