//! Whose prompt reads first when a step's prompt rows are scarce: weighted deficit round-robin
//! between API keys. Each step a key with a prompt waiting is owed its quantum of rows and pays
//! for the rows its prompts read; the keys owed most go first (`plan::prompt_order`). Quanta
//! follow the owners' weights as the fair queue's shares do (`queue`): a tenant's weight is split
//! among its keys with prompts waiting by their weights, and the largest part gets the whole
//! quantum. One key's
//! stream of short prompts, each read whole every step, runs its account down, so another
//! key's long prompt goes first from the next step on and reads its share: no key's prompt
//! waits forever behind another key's. Within a key, a prompt that waited `AGED_AFTER_STEPS`
//! steps goes before the key's shorter ones, so none waits forever behind its own key's either.

use std::collections::HashMap;

use crate::request::Owner;

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

    /// After a step: `read` holds, for every prompt that waited to be read, its owner and the
    /// rows it read. Each such key is owed its quantum (`quantum` for the largest part) once and
    /// pays its rows; a key without a prompt waiting is forgotten, so it cannot save up turns
    /// while it has nothing to read.
    pub(crate) fn settle(&mut self, read: &[(Owner, usize)], quantum: usize) {
        let quantum = i64::try_from(quantum).unwrap_or(i64::MAX / 8).min(i64::MAX / 8);
        let bound = quantum.saturating_mul(ACCOUNT_BOUND_QUANTA);
        let parts = parts(read.iter().map(|(owner, _)| owner));
        let largest = parts.values().copied().fold(f64::MIN_POSITIVE, f64::max);
        let mut next: HashMap<u64, i64> = HashMap::new();
        for (owner, rows) in read {
            // A part is at most the largest: at most `quantum`, which is an i64.
            #[allow(clippy::cast_possible_truncation)]
            let owed = ((quantum as f64 * parts[&owner.key] / largest).round() as i64).max(1);
            let account = next.entry(owner.key).or_insert_with(|| self.of(owner.key).saturating_add(owed));
            *account = account.saturating_sub(i64::try_from(*rows).unwrap_or(i64::MAX));
        }
        for account in next.values_mut() {
            *account = (*account).clamp(-bound, bound);
        }
        self.by_key = next;
    }
}

/// Each key's part of the whole, from the owners with prompts waiting: its tenant's weight, split
/// among the tenant's keys by their weights.
fn parts<'a>(owners: impl Iterator<Item = &'a Owner> + Clone) -> HashMap<u64, f64> {
    let mut keys_weight: HashMap<u64, HashMap<u64, u32>> = HashMap::new();
    for o in owners.clone() {
        keys_weight.entry(o.tenant).or_default().insert(o.key, o.key_weight.max(1));
    }
    owners
        .map(|o| {
            let tenant_keys: u32 = keys_weight[&o.tenant].values().sum();
            let part = f64::from(o.tenant_weight.max(1)) * f64::from(o.key_weight.max(1)) / f64::from(tenant_keys);
            (o.key, part)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(read: &[(u64, usize)]) -> Vec<(Owner, usize)> {
        read.iter().map(|&(key, rows)| (Owner::key(key), rows)).collect()
    }

    #[test]
    fn a_key_that_read_less_than_its_quantum_is_owed_the_rest() {
        let mut d = PromptDeficits::default();
        d.settle(&keyed(&[(1, 200), (1, 200), (2, 0)]), 128);
        assert_eq!((d.of(1), d.of(2)), (-272, 128));
        d.settle(&keyed(&[(1, 200), (2, 128)]), 128);
        assert_eq!((d.of(1), d.of(2)), (-344, 128));
    }

    #[test]
    fn accounts_are_bounded_and_forgotten_when_nothing_waits() {
        let mut d = PromptDeficits::default();
        for _ in 0..10 {
            d.settle(&keyed(&[(1, 0), (2, 1000)]), 100);
        }
        assert_eq!((d.of(1), d.of(2)), (400, -400));
        d.settle(&keyed(&[(2, 0)]), 100);
        assert_eq!((d.of(1), d.of(2)), (0, -300), "key 1 had nothing waiting");
    }

    #[test]
    fn quanta_follow_tenant_and_key_weights() {
        let (heavy, light) =
            (Owner { tenant_weight: 3, tenant: 1, ..Owner::key(1) }, Owner { tenant: 2, ..Owner::key(2) });
        let mut d = PromptDeficits::default();
        d.settle(&[(heavy, 0), (light, 0)], 120);
        assert_eq!((d.of(1), d.of(2)), (120, 40), "3:1");
        // A tenant's two keys, weighing 2 and 1, split its weight of 3: parts 2 and 1.
        let a = Owner { key_weight: 2, ..heavy };
        let b = Owner { key: 3, ..heavy };
        let mut d = PromptDeficits::default();
        d.settle(&[(a, 0), (b, 0), (light, 0)], 120);
        assert_eq!((d.of(1), d.of(3), d.of(2)), (120, 60, 60));
        // Many keys of one tenant together are owed what one key of an equal tenant is.
        let many: Vec<(Owner, usize)> = (10..20)
            .map(|k| (Owner { tenant: 5, ..Owner::key(k) }, 0))
            .chain([(Owner { tenant: 6, ..Owner::key(30) }, 0)])
            .collect();
        let mut d = PromptDeficits::default();
        d.settle(&many, 100);
        assert_eq!((10..20).map(|k| d.of(k)).sum::<i64>(), 100);
        assert_eq!(d.of(30), 100);
    }
}
