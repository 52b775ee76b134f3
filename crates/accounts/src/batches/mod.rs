//! Batches (OpenAI's Batch API): a key's file of requests, run when the server has room, each
//! line's answer kept until the batch is finished and its output written as files of the key.
//! Every read names the key, so one key never sees another's batch.
//!
//! A batch's `status` is the one place its state lives: `failed` (its file did not validate),
//! `in_progress` (its lines run), `cancelling` (no new line starts), then `completed`,
//! `expired` or `cancelled` once [`Accounts::finish_batch`] wrote its files. The lines' own
//! states, and how servers share them, are in `lines.rs`.

mod lines;

use sqlx::AnyPool;

use crate::{Accounts, AccountsError, FileQuota};

pub use lines::{BatchLine, ClaimedLine, Finishable};

/// A batch as the API describes it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BatchInfo {
    pub id: String,
    pub key_id: i64,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: String,
    /// A JSON object, if the batch was given metadata.
    pub metadata: Option<String>,
    /// A JSON array of validation errors, if it failed validation.
    pub errors: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: i64,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    /// Lines in all, answered 200, and answered otherwise.
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
    /// What its lines were billed for, from the usage ledger.
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub reasoning_tokens: i64,
}

/// A batch to create: `lines` empty and `errors` set for one whose file did not validate.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub id: String,
    pub key_id: i64,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub metadata: Option<String>,
    pub errors: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub lines: Vec<NewLine>,
}

/// One request of a new batch.
#[derive(Debug, Clone)]
pub struct NewLine {
    pub custom_id: String,
    /// Its id in the output and the ledger.
    pub request_id: String,
    /// The request body (JSON) as the endpoint takes it.
    pub body: String,
}

const BATCH_COLUMNS: &str = "b.id, b.key_id, b.endpoint, b.input_file_id, b.completion_window, b.status, \
     b.metadata, b.errors, b.output_file_id, b.error_file_id, b.created_at, b.in_progress_at, b.expires_at, \
     b.finalizing_at, b.completed_at, b.failed_at, b.expired_at, b.cancelling_at, b.cancelled_at, \
     CAST(COALESCE(b.total_lines, (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = b.id)) AS BIGINT) AS total, \
     CAST(COALESCE(b.completed_lines, (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = b.id AND l.state = 'done' AND l.status_code = 200)) AS BIGINT) AS completed, \
     CAST(COALESCE(b.failed_lines, (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = b.id AND l.state = 'done' AND l.status_code <> 200)) AS BIGINT) AS failed, \
     (SELECT CAST(COALESCE(SUM(u.prompt_tokens), 0) AS BIGINT) FROM usage_records u WHERE u.batch_id = b.id) AS prompt_tokens, \
     (SELECT CAST(COALESCE(SUM(u.cached_tokens), 0) AS BIGINT) FROM usage_records u WHERE u.batch_id = b.id) AS cached_tokens, \
     (SELECT CAST(COALESCE(SUM(u.completion_tokens), 0) AS BIGINT) FROM usage_records u WHERE u.batch_id = b.id) AS completion_tokens, \
     (SELECT CAST(COALESCE(SUM(u.reasoning_tokens), 0) AS BIGINT) FROM usage_records u WHERE u.batch_id = b.id) AS reasoning_tokens";

async fn read(pool: &AnyPool, id: &str, key_id: Option<i64>) -> Result<Option<BatchInfo>, AccountsError> {
    let sql = format!("SELECT {BATCH_COLUMNS} FROM batches b WHERE b.id = $1 AND ($2 < 0 OR b.key_id = $2)");
    Ok(sqlx::query_as(&sql).bind(id).bind(key_id.unwrap_or(-1)).fetch_optional(pool).await?)
}

impl Accounts {
    /// Creates a batch and its lines in one transaction, unless the key would then hold more
    /// than `quota` (its files, and its unfinished batches with their requests; see
    /// [`crate::files`]): [`AccountsError::QuotaExceeded`], naming the bound.
    pub async fn create_batch(&self, new: &NewBatch, quota: FileQuota) -> Result<BatchInfo, AccountsError> {
        // Written first, then counted with the rest (see `store_file`).
        let mut tx = self.pool.begin().await?;
        let (status, in_progress_at, failed_at) = match new.errors {
            Some(_) => ("failed", None, Some(new.created_at)),
            None => ("in_progress", Some(new.created_at), None),
        };
        sqlx::query(
            "INSERT INTO batches (id, key_id, endpoint, input_file_id, completion_window, status, metadata, errors, \
             created_at, in_progress_at, expires_at, failed_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&new.id)
        .bind(new.key_id)
        .bind(&new.endpoint)
        .bind(&new.input_file_id)
        .bind(&new.completion_window)
        .bind(status)
        .bind(&new.metadata)
        .bind(&new.errors)
        .bind(new.created_at)
        .bind(in_progress_at)
        .bind(new.expires_at)
        .bind(failed_at)
        .execute(&mut *tx)
        .await?;
        for (n, line) in new.lines.iter().enumerate() {
            sqlx::query(
                "INSERT INTO batch_lines (batch_id, line, custom_id, request_id, body, state) \
                 VALUES ($1, $2, $3, $4, $5, 'pending')",
            )
            .bind(&new.id)
            .bind(n as i64 + 1)
            .bind(&line.custom_id)
            .bind(&line.request_id)
            .bind(&line.body)
            .execute(&mut *tx)
            .await?;
        }
        let (files, bytes) = crate::files::held_by(&mut *tx, new.key_id).await?;
        if files > quota.files || bytes > quota.bytes {
            tx.rollback().await?;
            return Err(AccountsError::QuotaExceeded(format!(
                "This batch would bring what the key holds (its files, and its unfinished batches with the requests they copied) to {files} files and {bytes} bytes, past its quota of {} files and {} bytes; wait for its batches to finish, or delete files.",
                quota.files, quota.bytes
            )));
        }
        tx.commit().await?;
        read(&self.pool, &new.id, None).await?.ok_or_else(|| AccountsError::NotFound(new.id.clone()))
    }

    /// The key's batch `id`; another key's is `None`.
    pub async fn batch(&self, key_id: i64, id: &str) -> Result<Option<BatchInfo>, AccountsError> {
        read(&self.pool, id, Some(key_id)).await
    }

    /// The key's batches, newest first, after the batch `after` if given: at most `limit + 1`
    /// (one more tells that more follow).
    pub async fn list_batches(
        &self,
        key_id: i64,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchInfo>, AccountsError> {
        let after = match after {
            Some(id) => match self.batch(key_id, id).await? {
                Some(b) => Some((b.created_at, b.id)),
                None => return Ok(Vec::new()),
            },
            None => None,
        };
        let sql = format!(
            "SELECT {BATCH_COLUMNS} FROM batches b WHERE b.key_id = $1 \
             AND ($2 = 0 OR (b.created_at, b.id) < ($3, $4)) \
             ORDER BY b.created_at DESC, b.id DESC LIMIT $5"
        );
        let (has_after, (at, id)) = (after.is_some(), after.unwrap_or_default());
        Ok(sqlx::query_as(&sql)
            .bind(key_id)
            .bind(i64::from(has_after))
            .bind(at)
            .bind(id)
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Stops the key's batch `id` from starting more lines (`cancelling`); it is `cancelled`
    /// once the lines already running end. Cancelling a batch already cancelling is a no-op; one
    /// that ended is [`AccountsError::Invalid`], naming its status.
    pub async fn cancel_batch(&self, key_id: i64, id: &str, now: i64) -> Result<BatchInfo, AccountsError> {
        sqlx::query(
            "UPDATE batches SET status = 'cancelling', cancelling_at = $3 \
             WHERE id = $1 AND key_id = $2 AND status IN ('validating', 'in_progress')",
        )
        .bind(id)
        .bind(key_id)
        .bind(now)
        .execute(&self.pool)
        .await?;
        let batch = read(&self.pool, id, Some(key_id)).await?.ok_or_else(|| AccountsError::NotFound(id.into()))?;
        match batch.status.as_str() {
            "cancelling" | "cancelled" => Ok(batch),
            status => Err(AccountsError::Invalid(format!("Cannot cancel a batch with status '{status}'."))),
        }
    }
}
