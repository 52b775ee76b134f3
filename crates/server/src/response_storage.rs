//! What stored responses (the Responses API's `store: true`) may take of the server's disk: a
//! ceiling on one response, a quota per key (its oldest responses go first past it), and a free
//! space floor on the data directory, below which no new response is stored, so that the usage
//! ledger and outbox it shares a disk with keep room (`docs/security.md`).

use std::path::PathBuf;

use axum::http::StatusCode;
use gantry_accounts::StoredQuota;
use gantry_api::ApiError;

/// `--max-stored-response-bytes`: above `--body-limit`'s 4 MiB, so any request it accepts can
/// be stored with its answer.
pub const DEFAULT_MAX_STORED_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;
/// `--stored-responses-per-key`.
pub const DEFAULT_STORED_RESPONSES_PER_KEY: u64 = 10_000;
/// `--stored-response-bytes-per-key`.
pub const DEFAULT_STORED_RESPONSE_BYTES_PER_KEY: u64 = 256 * 1024 * 1024;
/// `--min-free-disk`.
pub const DEFAULT_MIN_FREE_DISK: u64 = 1024 * 1024 * 1024;

/// The limits on stored responses, as `gantry serve` was told them.
#[derive(Debug, Clone)]
pub struct ResponseStorage {
    /// What one key may keep; a new response past it drops the key's oldest.
    pub quota: StoredQuota,
    /// The most one stored response (its items and Response object) may take; a larger one is
    /// answered but not stored.
    pub max_response_bytes: u64,
    /// The directory whose free space is watched (the data directory: the SQLite database and
    /// the usage outbox); `None` watches nothing.
    pub watched_dir: Option<PathBuf>,
    /// Below this many free bytes there, no new response is stored; 0 turns the check off.
    pub min_free_bytes: u64,
}

impl Default for ResponseStorage {
    fn default() -> Self {
        Self {
            quota: StoredQuota { rows: DEFAULT_STORED_RESPONSES_PER_KEY, bytes: DEFAULT_STORED_RESPONSE_BYTES_PER_KEY },
            max_response_bytes: DEFAULT_MAX_STORED_RESPONSE_BYTES,
            watched_dir: None,
            min_free_bytes: DEFAULT_MIN_FREE_DISK,
        }
    }
}

impl ResponseStorage {
    /// Whether a response of `bytes` may be stored: within the ceiling, and within the key's
    /// quota (else storing it would drop every other response of the key and then itself).
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        bytes <= self.max_response_bytes.min(self.quota.bytes)
    }

    /// Refuses a request that asks to store its response while the watched disk is below its
    /// floor: 507, naming `store` (the same request with `store: false` is served).
    pub(crate) fn check_room(&self) -> Result<(), ApiError> {
        if self.has_room() {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "server_error",
            "This server is low on disk space and stores no new responses now; send the request with `store: false` (its answer is not kept for `previous_response_id` or `GET /v1/responses/{id}`), or retry later.",
            Some("store"),
            Some("insufficient_storage"),
        ))
    }

    /// Whether the watched directory has at least the floor free. A directory that cannot be
    /// measured counts as having room: the check protects the ledger, it must not stop serving.
    pub(crate) fn has_room(&self) -> bool {
        let Some(dir) = self.watched_dir.as_deref().filter(|_| self.min_free_bytes > 0) else { return true };
        match free_bytes(dir) {
            Ok(free) => free >= self.min_free_bytes,
            Err(e) => {
                tracing::warn!(error = %e, dir = %dir.display(), "could not measure the data directory's free space");
                true
            }
        }
    }
}

/// Bytes an unprivileged process may still write under `dir`.
#[cfg(unix)]
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let stats = rustix::fs::statvfs(dir)?;
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

#[cfg(not(unix))]
fn free_bytes(_dir: &std::path::Path) -> std::io::Result<u64> {
    Err(std::io::Error::other("free disk space is measured on Unix only"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_refuses_storing_only_below_it() {
        let dir = tempfile::tempdir().unwrap();
        let watching = |min_free_bytes| ResponseStorage {
            watched_dir: Some(dir.path().to_path_buf()),
            min_free_bytes,
            ..Default::default()
        };
        assert!(watching(1).check_room().is_ok());
        assert!(watching(0).check_room().is_ok(), "0 turns it off");
        let e = watching(u64::MAX).check_room().unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (507, Some("store")));
        assert_eq!(e.code.as_deref(), Some("insufficient_storage"));
        assert!(e.message.contains("store: false"), "{}", e.message);
    }

    #[test]
    fn a_response_fits_within_the_ceiling_and_the_quota() {
        let storage = ResponseStorage {
            quota: StoredQuota { rows: 10, bytes: 1_000 },
            max_response_bytes: 2_000,
            ..Default::default()
        };
        assert!(storage.fits(1_000) && !storage.fits(1_001), "the quota is the lower bound here");
        assert!(ResponseStorage::default().fits(DEFAULT_MAX_STORED_RESPONSE_BYTES));
        assert!(!ResponseStorage::default().fits(DEFAULT_MAX_STORED_RESPONSE_BYTES + 1));
    }
}
