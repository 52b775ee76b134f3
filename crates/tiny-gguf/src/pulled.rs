//! Real models where `gantry models pull` put them, for the tests that check against them: the
//! cache the CLI reads (`GANTRY_CACHE_DIR`, else `~/.cache/gantry`). `make test` pulls the default
//! model first and sets `GANTRY_REQUIRE_PULLED_MODEL=1`, so there a test that wants it and does not
//! find it fails; elsewhere it skips, saying on stderr what goes unchecked.

use std::path::PathBuf;

/// The file of the catalogue's default model, the one `make test` pulls.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// Where pulled models are kept.
pub fn models_dir() -> PathBuf {
    let base = match std::env::var_os("GANTRY_CACHE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/gantry"),
    };
    base.join("models")
}

/// The default model, where it was pulled; else `None`, said on stderr with what goes `unchecked`.
///
/// # Panics
/// Where `make test` promised the model (`GANTRY_REQUIRE_PULLED_MODEL`) and it is missing.
pub fn default_model(unchecked: &str) -> Option<PathBuf> {
    pulled_models(&[DEFAULT_MODEL], unchecked).pop()
}

/// Those of `files` pulled here, in their order; none is said on stderr with what goes
/// `unchecked`.
///
/// # Panics
/// Where none was pulled, `files` names the default model and `make test` promised it.
pub fn pulled_models(files: &[&str], unchecked: &str) -> Vec<PathBuf> {
    let dir = models_dir();
    let found: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).filter(|p| p.is_file()).collect();
    if found.is_empty() {
        assert!(
            !files.contains(&DEFAULT_MODEL) || std::env::var_os("GANTRY_REQUIRE_PULLED_MODEL").is_none(),
            "{DEFAULT_MODEL} was not pulled into {} (make test pulls it first)",
            dir.display()
        );
        eprintln!("SKIPPED: none of {files:?} pulled into {}: {unchecked}", dir.display());
    }
    found
}
