//! Whose prompt reads first when a step's prompt rows are scarce: deficit round-robin between
//! API keys. Each step a key with a prompt waiting is owed a quantum of rows and pays for the
//! rows its prompts read; the keys owed most go first (`planner::prompt_order`). One key's
//! stream of short prompts, each read whole every step, runs its account down, so another
//! key's long prompt goes first from the next step on and reads its share: no key's prompt
//! waits forever behind another key's. Within a key, a prompt that waited `AGED_AFTER_STEPS`
//! steps goes before the key's shorter ones, so none waits forever behind its own key's either.

use std::collections::HashMap;

/// Steps in a row without a prompt row after which a prompt goes first among its key's.
pub(crate) const AGED_AFTER_STEPS: u32 = 4;

/// How many quanta a key's account may be owed or owe: enough to tell a key that read
/// nothing from one that read a lot, not so much that a key which read a burst waits long
/// after it.
const ACCOUNT_BOUND_QUANTA: i64 = 4;

/// Each key's account, in prompt rows: owed (positive) or overdrawn (negative).
#[derive(Debug, Default)]
pub(crate) struct PromptDeficits {
    by_key: HashMap<u64, i64>,
}

impl PromptDeficits {
    /// What `key` is owed: 0 for a key that had no prompt waiting last step.
    pub(crate) fn of(&self, key: u64) -> i64 {
        self.by_key.get(&key).copied().unwrap_or(0)
    }

    /// After a step: `read` holds, for every prompt that waited to be read, its key and the rows
    /// it read. Each such key is owed `quantum` once and pays its rows; a key without a prompt
    /// waiting is forgotten, so it cannot save up turns while it has nothing to read.
    pub(crate) fn settle(&mut self, read: impl IntoIterator<Item = (u64, usize)>, quantum: usize) {
        let quantum = i64::try_from(quantum).unwrap_or(i64::MAX / 8).min(i64::MAX / 8);
        let bound = quantum.saturating_mul(ACCOUNT_BOUND_QUANTA);
        let mut next: HashMap<u64, i64> = HashMap::new();
        for (key, rows) in read {
            let account = next.entry(key).or_insert_with(|| self.of(key).saturating_add(quantum));
            *account = account.saturating_sub(i64::try_from(rows).unwrap_or(i64::MAX));
        }
        for account in next.values_mut() {
            *account = (*account).clamp(-bound, bound);
        }
        self.by_key = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_read_less_than_its_quantum_is_owed_the_rest() {
        let mut d = PromptDeficits::default();
        d.settle([(1, 200), (1, 200), (2, 0)], 128);
        assert_eq!((d.of(1), d.of(2)), (-272, 128));
        d.settle([(1, 200), (2, 128)], 128);
        assert_eq!((d.of(1), d.of(2)), (-344, 128));
    }

    #[test]
    fn accounts_are_bounded_and_forgotten_when_nothing_waits() {
        let mut d = PromptDeficits::default();
        for _ in 0..10 {
            d.settle([(1, 0), (2, 1000)], 100);
        }
        assert_eq!((d.of(1), d.of(2)), (400, -400));
        d.settle([(2, 0)], 100);
        assert_eq!((d.of(1), d.of(2)), (0, -300), "key 1 had nothing waiting");
    }
}
