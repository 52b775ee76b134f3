//! The sha256 check every download passes before it is renamed into place.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::error::io_err;
use super::{PullError, BUF_SIZE};

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
