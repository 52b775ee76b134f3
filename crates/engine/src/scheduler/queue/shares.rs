//! How many requests wait, in all and per key, and whether one more of a key's may join them.
//!
//! One bound for all keys let one key fill the queue and every other tenant got 503 (an audit's
//! flood of `max_tokens: 1` requests refused 55 of a victim's 62). A key may queue up to its
//! share: the bound divided between the keys waiting (itself counted), so a key alone still uses
//! the whole queue, and a newcomer is let in past a full queue until it holds its share, while
//! the key holding more than its share is refused. The total stays under twice the bound.

use std::collections::HashMap;
use std::sync::Mutex;

/// Requests waiting, by key (keys with none are not kept).
#[derive(Debug, Default)]
pub(crate) struct QueueShares {
    by_key: Mutex<HashMap<u64, usize>>,
}

impl QueueShares {
    /// Requests waiting in all.
    pub(crate) fn total(&self) -> usize {
        self.lock().values().sum()
    }

    /// Counts one more request of `key` if it may wait; otherwise the requests waiting in all
    /// (for the 503's message).
    pub(crate) fn try_enter(&self, key: u64, max_queue: usize) -> Result<(), usize> {
        let mut by_key = self.lock();
        let total: usize = by_key.values().sum();
        let mine = by_key.get(&key).copied().unwrap_or(0);
        let keys = by_key.len() + usize::from(mine == 0);
        let share = (max_queue / keys.max(1)).max(1);
        let full = total >= max_queue;
        if (full && mine >= share) || total >= 2 * max_queue.max(1) {
            return Err(total);
        }
        *by_key.entry(key).or_default() += 1;
        Ok(())
    }

    /// One request of `key` stopped waiting (taken, answered, or dropped).
    pub(crate) fn leave(&self, key: u64) {
        let mut by_key = self.lock();
        let Some(n) = by_key.get_mut(&key) else { return };
        *n -= 1;
        if *n == 0 {
            by_key.remove(&key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::QueueShares;

    #[test]
    fn a_key_alone_fills_the_queue_and_a_newcomer_still_gets_its_share() {
        let q = QueueShares::default();
        for _ in 0..8 {
            q.try_enter(1, 8).unwrap();
        }
        assert_eq!(q.try_enter(1, 8), Err(8), "alone, the whole queue and no more");
        // Another key joins a full queue until it holds half; the flooder stays refused.
        for _ in 0..4 {
            q.try_enter(2, 8).unwrap();
        }
        assert_eq!(q.try_enter(2, 8), Err(12));
        assert_eq!(q.try_enter(1, 8), Err(12));
        // A third key gets a third.
        q.try_enter(3, 8).unwrap();
        q.try_enter(3, 8).unwrap();
        assert_eq!(q.try_enter(3, 8), Err(14));
        // As the flooder's requests leave, the queue drains below the bound before it may add.
        for _ in 0..8 {
            q.leave(1);
        }
        assert_eq!(q.total(), 6);
        q.try_enter(1, 8).unwrap();
        q.try_enter(1, 8).unwrap();
        assert_eq!(q.try_enter(1, 8), Err(8));
    }

    #[test]
    fn the_total_never_passes_twice_the_bound() {
        let q = QueueShares::default();
        let admitted = (0..100u64).filter(|&k| q.try_enter(k, 4).is_ok()).count();
        assert_eq!(admitted, 8);
        // Only what entered leaves.
        for k in 0..100u64 {
            q.leave(k);
        }
        assert_eq!(q.total(), 0);
    }
}
