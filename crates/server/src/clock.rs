//! Wall-clock time as the API and the ledger write it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix seconds (`created` in completions).
pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Unix milliseconds (the ledger's timestamps).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
