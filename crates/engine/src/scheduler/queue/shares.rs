//! How many requests wait, in all, per tenant and per key, and whether one more of an owner's
//! may join them.
//!
//! One bound for all keys let one key fill the queue and every other tenant got 503 (an audit's
//! flood of `max_tokens: 1` requests refused 55 of a victim's 62). A key may queue up to its
//! share: the bound divided between the tenants waiting, then a tenant's part between its keys
//! waiting (itself counted in both). A key alone still uses the whole queue, a tenant's many
//! keys together get one tenant's part, and a newcomer is let in past a full queue until it
//! holds its share, while a key holding more than its share is refused. The total stays under
//! twice the bound. Shares of the bound are equal, whatever the weights: it protects the queue's
//! memory and wait, while the weights share the sequences (`lane`).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::request::Owner;

/// Requests waiting, by tenant and key (those with none are not kept).
#[derive(Debug, Default)]
pub(crate) struct QueueShares {
    by_tenant: Mutex<HashMap<u64, HashMap<u64, usize>>>,
}

impl QueueShares {
    /// Requests waiting in all.
    pub(crate) fn total(&self) -> usize {
        self.lock().values().flat_map(HashMap::values).sum()
    }

    /// Counts one more request of `owner` if it may wait; otherwise the requests waiting in all
    /// (for the 503's message).
    pub(crate) fn try_enter(&self, owner: Owner, max_queue: usize) -> Result<(), usize> {
        let mut by_tenant = self.lock();
        let total: usize = by_tenant.values().flat_map(HashMap::values).sum();
        let tenants = by_tenant.len() + usize::from(!by_tenant.contains_key(&owner.tenant));
        let keys = by_tenant.get(&owner.tenant);
        let mine = keys.and_then(|keys| keys.get(&owner.key)).copied().unwrap_or(0);
        let siblings = keys.map_or(0, HashMap::len) + usize::from(mine == 0);
        let share = (max_queue / tenants.max(1) / siblings.max(1)).max(1);
        let full = total >= max_queue;
        if (full && mine >= share) || total >= 2 * max_queue.max(1) {
            return Err(total);
        }
        *by_tenant.entry(owner.tenant).or_default().entry(owner.key).or_default() += 1;
        Ok(())
    }

    /// One request of `owner` stopped waiting (taken, answered, or dropped).
    pub(crate) fn leave(&self, owner: Owner) {
        let mut by_tenant = self.lock();
        let Some(keys) = by_tenant.get_mut(&owner.tenant) else { return };
        let Some(n) = keys.get_mut(&owner.key) else { return };
        *n -= 1;
        if *n == 0 {
            keys.remove(&owner.key);
            if keys.is_empty() {
                by_tenant.remove(&owner.tenant);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, HashMap<u64, usize>>> {
        self.by_tenant.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::QueueShares;
    use crate::request::Owner;

    fn key(key: u64) -> Owner {
        Owner::key(key)
    }

    fn of(tenant: u64, key: u64) -> Owner {
        Owner { tenant, ..Owner::key(key) }
    }

    #[test]
    fn a_key_alone_fills_the_queue_and_a_newcomer_still_gets_its_share() {
        let q = QueueShares::default();
        for _ in 0..8 {
            q.try_enter(key(1), 8).unwrap();
        }
        assert_eq!(q.try_enter(key(1), 8), Err(8), "alone, the whole queue and no more");
        // Another key joins a full queue until it holds half; the flooder stays refused.
        for _ in 0..4 {
            q.try_enter(key(2), 8).unwrap();
        }
        assert_eq!(q.try_enter(key(2), 8), Err(12));
        assert_eq!(q.try_enter(key(1), 8), Err(12));
        // A third key gets a third.
        q.try_enter(key(3), 8).unwrap();
        q.try_enter(key(3), 8).unwrap();
        assert_eq!(q.try_enter(key(3), 8), Err(14));
        // As the flooder's requests leave, the queue drains below the bound before it may add.
        for _ in 0..8 {
            q.leave(key(1));
        }
        assert_eq!(q.total(), 6);
        q.try_enter(key(1), 8).unwrap();
        q.try_enter(key(1), 8).unwrap();
        assert_eq!(q.try_enter(key(1), 8), Err(8));
    }

    #[test]
    fn a_tenants_many_keys_together_get_one_tenants_share() {
        let q = QueueShares::default();
        // Tenant 1 fills the queue through ten keys.
        for k in 0..16u64 {
            q.try_enter(of(1, k % 10), 16).unwrap();
        }
        // Tenant 2's one key joins past the full queue until it holds half, as a second tenant
        // does: had tenant 1's keys counted as ten owners, it would have got 16 / 11 = 1.
        for _ in 0..8 {
            q.try_enter(of(2, 50), 16).unwrap();
        }
        assert_eq!(q.try_enter(of(2, 50), 16), Err(24));
        // Tenant 1's keys hold more than their part of its half (8 / 10, at least 1).
        for k in 0..10u64 {
            assert_eq!(q.try_enter(of(1, k), 16), Err(24), "key {k}");
        }
    }

    #[test]
    fn within_a_tenant_a_flooding_key_leaves_room_for_its_sibling() {
        let q = QueueShares::default();
        for _ in 0..8 {
            q.try_enter(of(1, 1), 8).unwrap();
        }
        // The sibling is let in up to half the tenant's share; the flooder is refused.
        for _ in 0..4 {
            q.try_enter(of(1, 2), 8).unwrap();
        }
        assert_eq!(q.try_enter(of(1, 2), 8), Err(12));
        assert_eq!(q.try_enter(of(1, 1), 8), Err(12));
    }

    #[test]
    fn the_total_never_passes_twice_the_bound() {
        let q = QueueShares::default();
        let admitted = (0..100u64).filter(|&k| q.try_enter(of(k, k), 4).is_ok()).count();
        assert_eq!(admitted, 8);
        // Only what entered leaves.
        for k in 0..100u64 {
            q.leave(of(k, k));
        }
        assert_eq!(q.total(), 0);
    }
}
