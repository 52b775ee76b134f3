//! A batch's lines as the servers sharing the database run them. A line is `pending` until a
//! server claims it (`running`, `claimed_by` that server's heartbeat id), then `done` with its
//! answer. A claim lasts while its server's heartbeat does: the lines of a server that died are
//! pending again for any server to take ([`Accounts::reclaim_dead_lines`]). A line run twice
//! that way is billed once: its `request_id` is the ledger's primary key.
//!
//! Claims are made by one guarded `UPDATE … WHERE state = 'pending'`, so two servers never both
//! hold a line, and a batch is finished by one guarded status change, in the transaction that
//! writes its files, so it is finished once.

use super::read;
use crate::files::{insert, NewFile};
use crate::{Accounts, AccountsError, BatchInfo};

/// A line a server claimed, with what it needs to run it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClaimedLine {
    pub batch_id: String,
    pub key_id: i64,
    pub endpoint: String,
    pub line: i64,
    pub request_id: String,
    pub body: String,
}

/// A line as the batch's output files show it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BatchLine {
    pub line: i64,
    pub custom_id: String,
    pub request_id: String,
    pub state: String,
    pub status_code: Option<i64>,
    /// The answer's body (JSON), once done.
    pub response: Option<String>,
}

/// A batch whose lines have all ended, or that may start no more: what it becomes once its
/// files are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finishable {
    pub id: String,
    pub key_id: i64,
    /// `in_progress`, `finalizing` or `cancelling`: the status it is finished from.
    pub from: String,
    /// `completed`, `expired` or `cancelled`.
    pub to: &'static str,
}

impl Accounts {
    /// Claims for `owner` one pending line of a batch in progress (not past its expiry), from
    /// the key with the fewest lines running, then the oldest batch; `None` when there is none.
    pub async fn claim_batch_line(&self, owner: &str, now: i64) -> Result<Option<ClaimedLine>, AccountsError> {
        // Batches with a line to start, their key's running lines first: one key's huge batch
        // does not hold every slot while another key's waits.
        let candidates: Vec<(String, i64)> = sqlx::query_as(
            "SELECT b.id, (SELECT COUNT(*) FROM batch_lines r JOIN batches rb ON rb.id = r.batch_id \
                           WHERE r.state = 'running' AND rb.key_id = b.key_id) AS running \
             FROM batches b WHERE b.status = 'in_progress' AND b.expires_at > $1 \
             AND EXISTS (SELECT 1 FROM batch_lines p WHERE p.state = 'pending' AND p.batch_id = b.id) \
             ORDER BY running, b.created_at, b.id LIMIT 16",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        for (batch_id, _) in candidates {
            // Another server may take the line first: then the next one.
            for _ in 0..4 {
                let line: Option<(i64,)> = sqlx::query_as(
                    "SELECT line FROM batch_lines WHERE state = 'pending' AND batch_id = $1 ORDER BY line LIMIT 1",
                )
                .bind(&batch_id)
                .fetch_optional(&self.pool)
                .await?;
                let Some((line,)) = line else { break };
                let claimed = sqlx::query(
                    "UPDATE batch_lines SET state = 'running', claimed_by = $3 \
                     WHERE batch_id = $1 AND line = $2 AND state = 'pending' \
                     AND batch_id IN (SELECT id FROM batches WHERE status = 'in_progress')",
                )
                .bind(&batch_id)
                .bind(line)
                .bind(owner)
                .execute(&self.pool)
                .await?;
                if claimed.rows_affected() == 1 {
                    let claimed: ClaimedLine = sqlx::query_as(
                        "SELECT l.batch_id, b.key_id, b.endpoint, l.line, l.request_id, l.body \
                         FROM batch_lines l JOIN batches b ON b.id = l.batch_id \
                         WHERE l.batch_id = $1 AND l.line = $2",
                    )
                    .bind(&batch_id)
                    .bind(line)
                    .fetch_one(&self.pool)
                    .await?;
                    return Ok(Some(claimed));
                }
            }
        }
        Ok(None)
    }

    /// Keeps the answer of a line `owner` ran; `false` if the claim was lost (the server was
    /// taken for dead and another took the line), when the answer is dropped.
    pub async fn finish_batch_line(
        &self,
        line: &ClaimedLine,
        owner: &str,
        status_code: u16,
        response: &str,
    ) -> Result<bool, AccountsError> {
        let done = sqlx::query(
            "UPDATE batch_lines SET state = 'done', claimed_by = NULL, status_code = $4, response = $5 \
             WHERE batch_id = $1 AND line = $2 AND state = 'running' AND claimed_by = $3",
        )
        .bind(&line.batch_id)
        .bind(line.line)
        .bind(owner)
        .bind(i64::from(status_code))
        .bind(response)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives back a line `owner` claimed but could not run now (the server is draining, the
    /// engine's queue is full): pending again.
    pub async fn release_batch_line(&self, line: &ClaimedLine, owner: &str) -> Result<(), AccountsError> {
        sqlx::query(
            "UPDATE batch_lines SET state = 'pending', claimed_by = NULL \
             WHERE batch_id = $1 AND line = $2 AND state = 'running' AND claimed_by = $3",
        )
        .bind(&line.batch_id)
        .bind(line.line)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Makes pending again every line `owner` claimed: called by a server as it starts, so that
    /// lines an earlier process of the same instance id held when it was killed run again (its
    /// heartbeat, fresh again, would keep them claimed forever).
    pub async fn release_lines_of(&self, owner: &str) -> Result<u64, AccountsError> {
        let done = sqlx::query(
            "UPDATE batch_lines SET state = 'pending', claimed_by = NULL WHERE state = 'running' AND claimed_by = $1",
        )
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Makes pending again every line claimed by a server without a heartbeat since `cutoff_ms`
    /// (killed, or stopped before its lines ended); returns how many.
    pub async fn reclaim_dead_lines(&self, cutoff_ms: i64) -> Result<u64, AccountsError> {
        let done = sqlx::query(
            "UPDATE batch_lines SET state = 'pending', claimed_by = NULL WHERE state = 'running' \
             AND (claimed_by IS NULL OR claimed_by NOT IN (SELECT id FROM instances WHERE heartbeat_at_ms >= $1))",
        )
        .bind(cutoff_ms)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Moves every batch in progress past its expiry with lines still pending to `finalizing`,
    /// where no line starts any more; returns how many. Its lines running go on, and are
    /// delivered and billed; [`Self::finishable_batches`] finishes it once they ended.
    pub async fn close_expired_batches(&self, now: i64) -> Result<u64, AccountsError> {
        let closed = sqlx::query(
            "UPDATE batches SET status = 'finalizing', finalizing_at = $1 \
             WHERE status = 'in_progress' AND expires_at <= $1 \
             AND EXISTS (SELECT 1 FROM batch_lines p WHERE p.state = 'pending' AND p.batch_id = batches.id)",
        )
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(closed.rows_affected())
    }

    /// Batches that may be finished now, each with no line still running: in progress or
    /// finalizing with every line done (`completed`), cancelling (`cancelled`), or finalizing
    /// with lines never run (`expired`). A batch finalizing is finished only from the second
    /// after it was closed: a claim that read it in progress just before has ended by then, and
    /// shows as a running line, so no line runs and is billed outside the batch's output.
    pub async fn finishable_batches(&self, now: i64) -> Result<Vec<Finishable>, AccountsError> {
        let rows: Vec<(String, i64, String, Option<i64>, i64)> = sqlx::query_as(
            "SELECT b.id, b.key_id, b.status, b.finalizing_at, \
                    (SELECT COUNT(*) FROM batch_lines p WHERE p.state = 'pending' AND p.batch_id = b.id) \
             FROM batches b WHERE b.status IN ('in_progress', 'finalizing', 'cancelling') \
             AND NOT EXISTS (SELECT 1 FROM batch_lines r WHERE r.state = 'running' AND r.batch_id = b.id)",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, key_id, from, finalizing_at, pending)| {
                let settled = finalizing_at.is_some_and(|at| at < now);
                let to = match from.as_str() {
                    "cancelling" => "cancelled",
                    "finalizing" if !settled => return None,
                    _ if pending == 0 => "completed",
                    "finalizing" => "expired",
                    _ => return None,
                };
                Some(Finishable { id, key_id, from, to })
            })
            .collect())
    }

    /// The batch's lines in order, with their answers.
    pub async fn batch_lines(&self, batch_id: &str) -> Result<Vec<BatchLine>, AccountsError> {
        Ok(sqlx::query_as(
            "SELECT line, custom_id, request_id, state, status_code, response FROM batch_lines \
             WHERE batch_id = $1 ORDER BY line",
        )
        .bind(batch_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Finishes `batch` with its output and error files, in one transaction guarded by its
    /// status: `None` if another server finished it first.
    pub async fn finish_batch(
        &self,
        batch: &Finishable,
        now: i64,
        output: Option<&NewFile>,
        errors: Option<&NewFile>,
    ) -> Result<Option<BatchInfo>, AccountsError> {
        let mut tx = self.pool.begin().await?;
        let at_column = match batch.to {
            "completed" => "completed_at",
            "expired" => "expired_at",
            _ => "cancelled_at",
        };
        let changed = sqlx::query(&format!(
            "UPDATE batches SET status = $3, finalizing_at = COALESCE(finalizing_at, $4), {at_column} = $4, output_file_id = $5, \
             error_file_id = $6 WHERE id = $1 AND status = $2"
        ))
        .bind(&batch.id)
        .bind(&batch.from)
        .bind(batch.to)
        .bind(now)
        .bind(output.map(|f| f.id.clone()))
        .bind(errors.map(|f| f.id.clone()))
        .execute(&mut *tx)
        .await?;
        if changed.rows_affected() != 1 {
            return Ok(None);
        }
        for file in output.into_iter().chain(errors) {
            insert(&mut tx, file).await?;
        }
        // Its answers are in the files now: the counts stay on its row, the lines go, so that a
        // key's finished batches hold nothing more than its files do.
        sqlx::query(
            "UPDATE batches SET \
             total_lines = (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = $1), \
             completed_lines = (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = $1 AND l.state = 'done' AND l.status_code = 200), \
             failed_lines = (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = $1 AND l.state = 'done' AND l.status_code <> 200) \
             WHERE id = $1",
        )
        .bind(&batch.id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM batch_lines WHERE batch_id = $1").bind(&batch.id).execute(&mut *tx).await?;
        tx.commit().await?;
        read(&self.pool, &batch.id, None).await
    }
}
