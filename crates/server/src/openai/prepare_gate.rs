//! Bounds how many requests are prepared at once (chat template, tokenization, grammar
//! compiles, on tokio's blocking threads): overall, and per API key, so one key's flood of
//! huge prompts neither takes every blocking thread nor starves the other keys.
//!
//! A request over a bound waits for its turn (first come, first served) rather than getting
//! a 429: it has already passed the rate limits, and OpenAI's clients treat a 429 as "slow
//! down" and retry with backoff, which would only make a burst from a well-behaved client
//! slower. Waiting costs the server an idle connection and the parsed body, both bounded by
//! the rate limits and the body limit. A key can hold at most its own bound of the overall
//! turns, because it takes its key turn first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default overall bound: one preparation per CPU core (the work is CPU-bound).
pub fn default_total() -> usize {
    std::thread::available_parallelism().map_or(4, usize::from)
}

/// The default per-key bound: half the overall bound, so two keys at once never fill it.
pub fn default_per_key(total: usize) -> usize {
    (total / 2).max(1)
}

#[derive(Clone)]
pub struct PrepareGate {
    total: Arc<Semaphore>,
    per_key: usize,
    keys: Arc<Mutex<HashMap<i64, Arc<Semaphore>>>>,
}

/// A request's turn to be prepared; the next waiter goes when it is dropped.
pub struct Turn {
    _total: OwnedSemaphorePermit,
    _key: OwnedSemaphorePermit,
    key_id: i64,
    gate: PrepareGate,
}

impl PrepareGate {
    /// At most `total` preparations at once, at most `per_key` of them for one key (both at
    /// least 1).
    pub fn new(total: usize, per_key: usize) -> Self {
        Self { total: Arc::new(Semaphore::new(total.max(1))), per_key: per_key.max(1), keys: Default::default() }
    }

    /// Waits for the key's turn, then for an overall one. Cancel-safe: a request dropped while
    /// waiting takes no turn.
    pub async fn enter(&self, key_id: i64) -> Turn {
        let key = {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            keys.entry(key_id).or_insert_with(|| Arc::new(Semaphore::new(self.per_key))).clone()
        };
        // The semaphores are never closed, so acquiring cannot fail.
        let key_permit = key.acquire_owned().await.expect("prepare gate semaphores stay open");
        let total = self.total.clone().acquire_owned().await.expect("prepare gate semaphores stay open");
        Turn { _total: total, _key: key_permit, key_id, gate: self.clone() }
    }

    /// Preparations the key may still start now (for tests and the stats).
    pub fn available_for(&self, key_id: i64) -> usize {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let key = keys.get(&key_id).map_or(self.per_key, |s| s.available_permits());
        key.min(self.total.available_permits())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // A key with no other request in preparation or waiting forgets its semaphore, so the
        // map holds only the keys being served. Its only holders are then the map and this
        // turn's permit (waiters hold a clone, taken under the same lock).
        let mut keys = self.gate.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.get(&self.key_id).is_some_and(|sem| Arc::strong_count(sem) == 2) {
            keys.remove(&self.key_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test]
    async fn one_key_waits_for_its_own_turns_while_another_key_goes() {
        let gate = PrepareGate::new(3, 2);
        let a1 = gate.enter(1).await;
        let _a2 = gate.enter(1).await;
        assert_eq!(gate.available_for(1), 0);
        // The key's third request waits, though an overall turn is free...
        let mut a3 = Box::pin(gate.enter(1));
        assert!((&mut a3).now_or_never().is_none());
        // ...and another key is served at once.
        let b1 = gate.enter(2).await;
        assert_eq!(gate.available_for(2), 0, "the overall bound is reached");
        drop(b1);
        assert!((&mut a3).now_or_never().is_none(), "a freed overall turn is not the key's");
        drop(a1);
        let _a3 = a3.await;
        assert_eq!(gate.available_for(1), 0);
    }

    #[tokio::test]
    async fn keys_with_nothing_in_preparation_are_forgotten() {
        let gate = PrepareGate::new(4, 2);
        for key in 0..100 {
            drop(gate.enter(key).await);
        }
        assert!(gate.keys.lock().unwrap().is_empty());
        let held = gate.enter(7).await;
        assert_eq!(gate.keys.lock().unwrap().len(), 1);
        drop(held);
        assert!(gate.keys.lock().unwrap().is_empty());
    }
}
