//! OpenAI's Files and Batch APIs. A key uploads a file of requests (`files.rs`), makes a batch of
//! it (`routes.rs`, each line checked by `validate.rs`), and the runner (`runner.rs`) sends every
//! line through the same routes an interactive request takes (`endpoint.rs` lists those a batch
//! may name), marked as a batch's line (`BatchLine`): it runs only where it does not slow
//! interactive requests, outside the key's per-minute windows, billed in the `batch` tier. Once
//! every line ended, or the batch
//! was cancelled or expired, `output.rs` writes its output and error files. Files, batches and
//! lines live in the accounts database, so a batch survives a restart and replicas share it.

mod endpoint;
mod files;
#[cfg(test)]
mod files_tests;
mod output;
mod routes;
mod runner;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use gantry_accounts::FileQuota;

use crate::state::AppState;

pub(crate) use runner::start_runner;

/// Marks a request the batch runner (`runner.rs`) sends through the routes: a line of this
/// batch. It runs in the engine's `ServiceTier::Batch` (behind every interactive request, and
/// preempted for them), outside the key's per-minute windows, and is billed in the `batch` tier
/// with the batch's id on its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchLine {
    pub batch_id: String,
}

/// `--max-file-bytes`.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;
/// `--files-per-key`.
pub const DEFAULT_FILES_PER_KEY: u64 = 1000;
/// `--file-bytes-per-key`.
pub const DEFAULT_FILE_BYTES_PER_KEY: u64 = 1024 * 1024 * 1024;
/// `--batch-concurrency`.
pub const DEFAULT_BATCH_CONCURRENCY: usize = 4;
/// The most requests one batch may hold, as OpenAI allows.
pub const MAX_BATCH_LINES: usize = 50_000;
/// The only completion window OpenAI offers.
pub const COMPLETION_WINDOW: (&str, Duration) = ("24h", Duration::from_secs(24 * 3600));

/// What `gantry serve` was told about files and batches, and the runner's wake-up call.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    /// What one key may keep in files, its batches' output files included.
    pub quota: FileQuota,
    /// The largest file one upload may be.
    pub max_file_bytes: u64,
    /// Lines this server runs at once; 0 runs none (another replica does).
    pub concurrency: usize,
    /// A line claimed by a server without a heartbeat for this long is taken back.
    pub claim_timeout: Duration,
    /// Rung when a batch is made or a line ends, so that lines start, and a batch is finished,
    /// without waiting for a poll.
    pub wake: Arc<tokio::sync::Notify>,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            quota: FileQuota { files: DEFAULT_FILES_PER_KEY, bytes: DEFAULT_FILE_BYTES_PER_KEY },
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            concurrency: DEFAULT_BATCH_CONCURRENCY,
            claim_timeout: Duration::from_secs(60),
            wake: Arc::default(),
        }
    }
}

/// The Files and Batch routes, for the key-authenticated router.
pub(crate) fn routes(max_file_bytes: u64) -> Router<AppState> {
    // Room for the multipart framing around the largest file.
    let upload_limit = usize::try_from(max_file_bytes.saturating_add(64 * 1024)).unwrap_or(usize::MAX);
    Router::new()
        .route("/v1/files", post(files::upload).layer(DefaultBodyLimit::max(upload_limit)).get(files::list))
        .route("/v1/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batches", post(routes::create).get(routes::list))
        .route("/v1/batches/{id}", get(routes::retrieve))
        .route("/v1/batches/{id}/cancel", post(routes::cancel))
}

/// A new id with OpenAI's prefix for its kind (`file-`, `batch_`, `batch_req_`).
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}
