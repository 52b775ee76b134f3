//! Virtual time, for weighted fair sharing: how far each party (a tenant among tenants, or a key
//! among its tenant's keys) has been served, counted in the tokens its requests' rows took,
//! divided by its weight. The waiting party furthest behind goes next, so over time parties that
//! all want more get tokens in proportion to their weights (start-time fair queueing, counted in
//! tokens rather than requests: a request's length is not known when it starts).
//!
//! Idle time earns no credit: a party new to its level (neither waiting nor running) begins at the
//! least time among those waiting, and one that starts waiting while nobody else waits starts the
//! race over (every time of its level is forgotten), so what was served while nobody contended
//! does not count against anyone. A party still running keeps its own time when it waits again
//! (a client that sends its next request as the last one ends is not idle), but no more than
//! `MAX_LAG` behind: what it did not ask for while it ran little is not saved up for later.

use std::collections::HashMap;

/// How far behind the least time of those waiting a running party may be when it waits again,
/// in tokens per unit of weight: a few requests' worth.
const MAX_LAG: f64 = 256.0;

/// The virtual times of one level's parties (tenants, or one tenant's keys). Parties not known
/// are at 0.
#[derive(Debug, Default)]
pub(crate) struct VirtualTimes {
    by_party: HashMap<u64, f64>,
}

impl VirtualTimes {
    /// How far `party` has been served, per unit of weight.
    pub(crate) fn of(&self, party: u64) -> f64 {
        self.by_party.get(&party).copied().unwrap_or(0.0)
    }

    /// `party` starts waiting while `waiting` (its level's other parties waiting) do.
    pub(crate) fn join(&mut self, party: u64, waiting: impl IntoIterator<Item = u64>) {
        let floor = waiting.into_iter().filter(|&p| p != party).map(|p| self.of(p)).min_by(f64::total_cmp);
        match floor {
            Some(floor) => {
                let time = self.by_party.entry(party).or_insert(floor);
                *time = time.max(floor - MAX_LAG);
            }
            None => {
                self.by_party.clear();
                self.by_party.insert(party, 0.0);
            }
        }
    }

    /// `party`, weighing `weight`, was served `tokens`.
    pub(crate) fn charge(&mut self, party: u64, tokens: usize, weight: u32) {
        *self.by_party.entry(party).or_default() += tokens as f64 / f64::from(weight.max(1));
    }

    /// `party` neither waits nor runs: nothing of it is kept.
    pub(crate) fn forget(&mut self, party: u64) {
        self.by_party.remove(&party);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_party.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{VirtualTimes, MAX_LAG};

    #[test]
    fn a_party_that_starts_waiting_gets_no_credit_for_its_idle_time() {
        let mut t = VirtualTimes::default();
        t.join(1, []);
        t.charge(1, 300, 1);
        t.join(2, [1]);
        assert_eq!(t.of(2), 300.0, "new, it starts level with the one waiting");
        t.charge(2, 300, 3);
        assert_eq!(t.of(2), 400.0, "a weight of 3 pays a third");
        // Still running, a party keeps its own time, ahead or a little behind ...
        t.join(2, [1]);
        assert_eq!(t.of(2), 400.0);
        t.charge(1, 200, 1);
        t.join(2, [1]);
        assert_eq!(t.of(2), 400.0);
        // ... but no more than `MAX_LAG` behind.
        t.charge(1, 1000, 1);
        t.join(2, [1]);
        assert_eq!(t.of(2), 1500.0 - MAX_LAG);
    }

    #[test]
    fn joining_alone_starts_the_race_over() {
        let mut t = VirtualTimes::default();
        t.charge(1, 500, 1);
        t.charge(2, 50, 1);
        t.join(2, []);
        assert_eq!((t.of(1), t.of(2)), (0.0, 0.0));
        assert_eq!(t.len(), 1);
        t.forget(2);
        assert_eq!(t.len(), 0);
    }
}
