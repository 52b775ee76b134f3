//! The `.part` file every source writes, and the sha256 check it passes before it is renamed
//! into place.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::{io_err, PullError};

/// The buffer for writing, hashing and extracting downloads.
pub(super) const BUF_SIZE: usize = 1 << 20;

/// `path` with `suffix` appended (`model.gguf` → `model.gguf.part`).
pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Removes `path`; a file that is not there is no error.
pub(super) async fn remove_if_exists(path: &Path) -> Result<(), PullError> {
    match tokio::fs::remove_file(path).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(format!("removing {}", path.display()))(e)),
        _ => Ok(()),
    }
}

/// Hex sha256 of a file.
pub(super) async fn sha256_file(path: &Path) -> Result<String, PullError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let ctx = format!("hashing {}", path.display());
        let mut file = std::fs::File::open(&path).map_err(io_err(ctx.clone()))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; BUF_SIZE];
        loop {
            let n = file.read(&mut buf).map_err(io_err(ctx.clone()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(format!("{:x}", hasher.finalize()))
    })
    .await
    .map_err(|e| PullError::Io { context: "hashing".into(), source: std::io::Error::other(e) })?
}
