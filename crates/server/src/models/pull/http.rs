//! The `Source::Url` source: a resumable HTTP download into a `.part` file, resumed with
//! `Range` after an interruption. The PyPI source fetches each wheel with it too.

use std::path::Path;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use tokio::io::AsyncWriteExt;

use super::error::{http_err, io_err, PullError};
use super::progress::{progress_bar, say};
use super::verify::{remove_if_exists, BUF_SIZE};

/// Parse `Content-Range: bytes START-END/TOTAL` (or `bytes */TOTAL`) into (START, TOTAL).
fn content_range(headers: &HeaderMap) -> (Option<u64>, Option<u64>) {
    let Some(v) = headers.get(CONTENT_RANGE).and_then(|v| v.to_str().ok()) else {
        return (None, None);
    };
    let Some(spec) = v.trim().strip_prefix("bytes") else {
        return (None, None);
    };
    let (range, total) = spec.trim().split_once('/').unwrap_or((spec.trim(), "*"));
    let start = range.split_once('-').and_then(|(s, _)| s.trim().parse().ok());
    (start, total.trim().parse().ok())
}

/// GET `url` into `part`, resuming from the bytes already there. Returns the file's length.
pub(super) async fn download_resumable(
    client: &reqwest::Client,
    url: &str,
    part: &Path,
    label: &str,
    quiet: bool,
) -> Result<u64, PullError> {
    let mut restarted = false;
    loop {
        let have = match tokio::fs::metadata(part).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err(format!("reading {}", part.display()))(e)),
        };
        let mut req = client.get(url);
        if have > 0 {
            req = req.header(RANGE, format!("bytes={have}-"));
        }
        let resp = req.send().await.map_err(|e| http_err(url, e))?;
        let status = resp.status();
        let (start, total) = match status {
            StatusCode::OK => (0, resp.content_length()),
            StatusCode::PARTIAL_CONTENT => match content_range(resp.headers()) {
                (Some(start), total) if start == have => (have, total),
                _ if !restarted => {
                    // Not the range we asked for: start again from zero.
                    drop(resp);
                    restarted = true;
                    remove_if_exists(part).await?;
                    continue;
                }
                _ => return Err(PullError::Http { url: url.into(), message: "unusable 206 response".into() }),
            },
            StatusCode::RANGE_NOT_SATISFIABLE if have > 0 => {
                if content_range(resp.headers()).1 == Some(have) {
                    return Ok(have); // the .part is already complete
                }
                if restarted {
                    return Err(PullError::Status { url: url.into(), status: status.as_u16() });
                }
                drop(resp);
                restarted = true;
                remove_if_exists(part).await?;
                continue;
            }
            _ => return Err(PullError::Status { url: url.into(), status: status.as_u16() }),
        };
        if have > 0 {
            if start == have {
                say(quiet, format!("resuming {label} at byte {have}"));
            } else {
                say(quiet, format!("{url} does not resume; starting {label} from the beginning"));
            }
        }

        let mut open = tokio::fs::OpenOptions::new();
        if start > 0 {
            open.append(true);
        } else {
            open.write(true).create(true).truncate(true);
        }
        let file = open.open(part).await.map_err(io_err(format!("opening {}", part.display())))?;
        let mut out = tokio::io::BufWriter::with_capacity(BUF_SIZE, file);
        let bar = progress_bar(total, label, quiet);
        bar.set_position(start);
        let mut written = start;
        let mut body = resp.bytes_stream();
        let mut failure = None;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(bytes) => {
                    if let Err(e) = out.write_all(&bytes).await {
                        failure = Some(io_err(format!("writing {}", part.display()))(e));
                        break;
                    }
                    written += bytes.len() as u64;
                    bar.set_position(written);
                }
                Err(e) => {
                    let mut err = http_err(url, e);
                    if let PullError::Http { message, .. } = &mut err {
                        message.insert_str(0, &format!("download interrupted after {written} bytes: "));
                    }
                    failure = Some(err);
                    break;
                }
            }
        }
        // Keep what arrived, even on failure, so the next attempt can resume.
        let flushed = out.flush().await;
        bar.finish_and_clear();
        if let Some(e) = failure {
            return Err(e);
        }
        flushed.map_err(io_err(format!("writing {}", part.display())))?;
        out.into_inner().sync_all().await.map_err(io_err(format!("syncing {}", part.display())))?;
        if let Some(total) = total {
            if written < total {
                return Err(PullError::Truncated { url: url.into(), got: written, expected: total });
            }
        }
        return Ok(written);
    }
}
