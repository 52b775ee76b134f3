//! A short-lived memory of secrets the database did not know, so the same fake key presented
//! again and again costs one query per TTL instead of one per request. Only misses are kept:
//! a found key is looked up every time, so revocation takes effect at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a secret stays known as unknown. A key created by another process (the CLI, another
/// replica) works at the latest this long after it was last refused here; keys created through
/// this handle work at once.
pub const UNKNOWN_KEY_TTL: Duration = Duration::from_secs(10);
/// Most secrets remembered; beyond that expired entries are dropped, then the oldest ones.
pub const UNKNOWN_KEY_CAPACITY: usize = 10_000;

#[derive(Debug, Default)]
pub(crate) struct UnknownKeys {
    /// SHA-256 hex of the secret (never the secret itself) → when it was found unknown.
    entries: Mutex<HashMap<String, Instant>>,
    /// Key lookups that reached the database, for tests and metrics.
    lookups: AtomicU64,
}

impl UnknownKeys {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Whether `hash` was found unknown less than [`UNKNOWN_KEY_TTL`] ago.
    pub(crate) fn contains(&self, hash: &str) -> bool {
        let mut entries = self.entries.lock().expect("unknown keys lock");
        match entries.get(hash) {
            Some(at) if at.elapsed() < UNKNOWN_KEY_TTL => true,
            Some(_) => {
                entries.remove(hash);
                false
            }
            None => false,
        }
    }

    pub(crate) fn insert(&self, hash: String) {
        let mut entries = self.entries.lock().expect("unknown keys lock");
        if entries.len() >= UNKNOWN_KEY_CAPACITY {
            entries.retain(|_, at| at.elapsed() < UNKNOWN_KEY_TTL);
        }
        if entries.len() >= UNKNOWN_KEY_CAPACITY {
            // Still full of fresh entries (a spray of distinct fake keys): forget the oldest
            // half rather than grow; those secrets cost one more query each.
            let mut ages: Vec<Instant> = entries.values().copied().collect();
            ages.sort_unstable();
            let cutoff = ages[ages.len() / 2];
            entries.retain(|_, at| *at > cutoff);
        }
        entries.insert(hash, Instant::now());
    }

    /// A secret that now belongs to a key must not be refused from memory.
    pub(crate) fn forget(&self, hash: &str) {
        self.entries.lock().expect("unknown keys lock").remove(hash);
    }

    pub(crate) fn count_lookup(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_remembered_forgotten_and_bounded() {
        let cache = UnknownKeys::new();
        cache.insert("a".into());
        assert!(cache.contains("a"));
        assert!(!cache.contains("b"));
        cache.forget("a");
        assert!(!cache.contains("a"));
        for i in 0..UNKNOWN_KEY_CAPACITY + 10 {
            cache.insert(format!("k{i}"));
        }
        assert!(cache.len() <= UNKNOWN_KEY_CAPACITY, "{}", cache.len());
        // The newest entry always survives the trim.
        assert!(cache.contains(&format!("k{}", UNKNOWN_KEY_CAPACITY + 9)));
    }
}
