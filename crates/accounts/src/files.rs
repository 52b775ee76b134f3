//! Files (OpenAI's Files API): text a key uploaded (a batch's input) or a batch wrote for it (its
//! output). Every read and delete names the key, so one key never sees another's file; a key holds
//! at most [`FileQuota`], counting its files (its batches' output included) and its unfinished
//! batches (each one file to come, and the requests it copied from its input): an upload or a
//! batch past it is refused (nothing is dropped to make room), so no key can fill the database
//! by submitting one file many times. Content lives in the database, so every replica sharing it
//! serves the same files.

use crate::{Accounts, AccountsError};

/// What one key may keep at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileQuota {
    pub files: u64,
    pub bytes: u64,
}

/// A file as the API describes it, without its content.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct FileInfo {
    pub id: String,
    pub key_id: i64,
    pub purpose: String,
    pub filename: String,
    pub bytes: i64,
    /// Seconds since the epoch.
    pub created_at: i64,
}

/// A file to keep; `content.len()` is its size.
#[derive(Debug, Clone)]
pub struct NewFile {
    pub id: String,
    pub key_id: i64,
    pub purpose: String,
    pub filename: String,
    pub created_at: i64,
    pub content: String,
}

/// Which of a key's files a listing shows, newest first unless `ascending`.
#[derive(Debug, Clone, Default)]
pub struct FileQuery {
    pub purpose: Option<String>,
    /// Only files after this one in the listing's order.
    pub after: Option<String>,
    pub limit: u32,
    pub ascending: bool,
}

const FILE_COLUMNS: &str = "id, key_id, purpose, filename, bytes, created_at";

pub(crate) async fn insert(conn: &mut sqlx::AnyConnection, file: &NewFile) -> Result<FileInfo, AccountsError> {
    sqlx::query(
        "INSERT INTO files (id, key_id, purpose, filename, bytes, created_at, content) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&file.id)
    .bind(file.key_id)
    .bind(&file.purpose)
    .bind(&file.filename)
    .bind(file.content.len() as i64)
    .bind(file.created_at)
    .bind(&file.content)
    .execute(conn)
    .await?;
    Ok(FileInfo {
        id: file.id.clone(),
        key_id: file.key_id,
        purpose: file.purpose.clone(),
        filename: file.filename.clone(),
        bytes: file.content.len() as i64,
        created_at: file.created_at,
    })
}

/// What the key holds against its [`FileQuota`]: its files, and its unfinished batches as one
/// file each (its output to come); their bytes, and the characters of those batches' requests
/// (only unfinished batches keep lines).
pub(crate) async fn held_by<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Any>,
    key_id: i64,
) -> Result<(u64, u64), AccountsError> {
    let (files, bytes): (i64, i64) = sqlx::query_as(
        "SELECT \
         CAST((SELECT COUNT(*) FROM files WHERE key_id = $1) \
            + (SELECT COUNT(*) FROM batches WHERE key_id = $1 AND status IN ('in_progress', 'finalizing', 'cancelling')) AS BIGINT), \
         CAST((SELECT COALESCE(SUM(bytes), 0) FROM files WHERE key_id = $1) \
            + (SELECT COALESCE(SUM(LENGTH(l.body)), 0) FROM batch_lines l JOIN batches b ON b.id = l.batch_id WHERE b.key_id = $1) AS BIGINT)",
    )
    .bind(key_id)
    .fetch_one(db)
    .await?;
    Ok((files as u64, bytes as u64))
}

impl Accounts {
    /// Keeps an uploaded file, unless the key would then hold more than `quota`
    /// ([`AccountsError::QuotaExceeded`], naming the bound).
    pub async fn store_file(&self, file: &NewFile, quota: FileQuota) -> Result<FileInfo, AccountsError> {
        // Written first, then counted with the rest: the transaction takes the write lock at its
        // first statement (SQLite cannot upgrade a read under a concurrent writer).
        let mut tx = self.pool.begin().await?;
        let info = insert(&mut tx, file).await?;
        let (files, bytes) = held_by(&mut *tx, file.key_id).await?;
        if files > quota.files {
            tx.rollback().await?;
            return Err(AccountsError::QuotaExceeded(format!(
                "This key already holds {} files, the most it may; delete some before uploading more.",
                files - 1
            )));
        }
        if bytes > quota.bytes {
            tx.rollback().await?;
            return Err(AccountsError::QuotaExceeded(format!(
                "This file would bring the key's files to more than the {} bytes it may hold; delete some first.",
                quota.bytes
            )));
        }
        tx.commit().await?;
        Ok(info)
    }

    /// What the key holds against its quota: its files and unfinished batches, and their bytes (see `held_by`).
    pub async fn file_usage(&self, key_id: i64) -> Result<(u64, u64), AccountsError> {
        held_by(&self.pool, key_id).await
    }

    /// The key's file `id`; another key's is `None`.
    pub async fn file(&self, key_id: i64, id: &str) -> Result<Option<FileInfo>, AccountsError> {
        Ok(sqlx::query_as(&format!("SELECT {FILE_COLUMNS} FROM files WHERE id = $1 AND key_id = $2"))
            .bind(id)
            .bind(key_id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The content of the key's file `id`; another key's is `None`.
    pub async fn file_content(&self, key_id: i64, id: &str) -> Result<Option<String>, AccountsError> {
        let row: Option<(String,)> = sqlx::query_as("SELECT content FROM files WHERE id = $1 AND key_id = $2")
            .bind(id)
            .bind(key_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(content,)| content))
    }

    /// The key's files as `query` asks, at most `query.limit + 1` (one more tells that more follow).
    pub async fn list_files(&self, key_id: i64, query: &FileQuery) -> Result<Vec<FileInfo>, AccountsError> {
        let (cmp, order) = if query.ascending { (">", "ASC") } else { ("<", "DESC") };
        let after = match &query.after {
            Some(after) => self.file(key_id, after).await?.map(|f| (f.created_at, f.id)),
            None => None,
        };
        if query.after.is_some() && after.is_none() {
            return Ok(Vec::new());
        }
        let (after_at, after_id) = after.unwrap_or_default();
        let sql = format!(
            "SELECT {FILE_COLUMNS} FROM files WHERE key_id = $1 AND ($2 = '' OR purpose = $2) \
             AND ($3 = 0 OR (created_at, id) {cmp} ($4, $5)) \
             ORDER BY created_at {order}, id {order} LIMIT $6"
        );
        Ok(sqlx::query_as(&sql)
            .bind(key_id)
            .bind(query.purpose.clone().unwrap_or_default())
            .bind(i64::from(query.after.is_some()))
            .bind(after_at)
            .bind(after_id)
            .bind(i64::from(query.limit) + 1)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Deletes the key's file `id`; whether there was one.
    pub async fn delete_file(&self, key_id: i64, id: &str) -> Result<bool, AccountsError> {
        let done = sqlx::query("DELETE FROM files WHERE id = $1 AND key_id = $2")
            .bind(id)
            .bind(key_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
