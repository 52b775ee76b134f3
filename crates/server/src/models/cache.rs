//! The model cache: where it is, what is in it, and which file a `--model` name means.

use std::path::{Path, PathBuf};

use super::catalog::{catalog, find, DEFAULT_MODEL};
use super::pull::PullError;

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
