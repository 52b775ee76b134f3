//! Which waiting request gets free sequences next: weighted fair sharing between tenants, and
//! within a tenant between its API keys, so one key's or tenant's backlog cannot hold back
//! everyone else's requests, and an operator can give one tenant or key more than another.
//!
//! Two levels: tenants share the server by their weights, and a tenant's keys share what it
//! gets by theirs, so a tenant's many keys together get its one weight. At each level the
//! party furthest behind in virtual time (tokens served divided by weight, `virtual_time`) goes
//! next; ties go to the party whose turn came least recently, so with nothing served yet the
//! parties take turns (round robin): a request whose key has nothing else waiting is admitted
//! after at most one request of each other waiting key, however many those keys queued. The
//! step charges every row it computes to its request's owner (`FairQueue::charge`), so shares
//! follow tokens, prompt rows included, not request counts.
//!
//! Service tiers: `flex` requests wait in a lane of their own, shared the same way, and start only
//! on sequences no other request waits for (idle capacity); a `priority` request goes ahead of its
//! own key's other requests, not of other keys' (the server allows it only to keys it may).
//!
//! A key may be capped at some running sequences (both lanes together); while at its cap, it is
//! passed over (it keeps its requests, in order). A request needing more sequences than are free
//! (`n` choices) is not passed over for ever: when its turn comes and it does not fit, the free
//! sequences are held for it, and the ones that free up next are added, until it fits. Smaller
//! requests go ahead of it only until its turn comes.

mod lane;
pub(crate) mod shares;
mod virtual_time;

use lane::Lane;

use crate::request::{Owner, ServiceTier};

/// What the queue needs to know of a waiting request.
pub(crate) trait Waiting {
    /// Whose request it is, for fairness.
    fn owner(&self) -> Owner;
    /// Sequences it needs at once (one per choice).
    fn sequences(&self) -> usize;
    /// Its lane: `flex` requests wait behind every other.
    fn tier(&self) -> ServiceTier;
}

pub(crate) struct FairQueue<J> {
    /// `default` and `priority` requests.
    standard: Lane<J>,
    /// `flex` requests.
    flex: Lane<J>,
    /// Most sequences one key may run at once, both lanes together; `None` is no limit.
    max_running_per_key: Option<usize>,
}

impl<J: Waiting> FairQueue<J> {
    pub(crate) fn new(max_running_per_key: Option<usize>) -> Self {
        Self { standard: Lane::new(), flex: Lane::new(), max_running_per_key: max_running_per_key.map(|n| n.max(1)) }
    }

    pub(crate) fn len(&self) -> usize {
        self.standard.len + self.flex.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn push(&mut self, job: J) {
        self.lane(job.tier()).push(job);
    }

    /// The next request to start with `free` sequences free, counted as running from now on
    /// (until [`FairQueue::finished`]); `None` when none may start now. A `flex` one only while no
    /// other request holds the free sequences (one that does not fit yet reserves them).
    pub(crate) fn pop(&mut self, free: usize) -> Option<J> {
        // Nothing starts: whose turn comes is decided when something frees, by the times then.
        if free == 0 {
            return None;
        }
        let cap = self.max_running_per_key;
        if let Some(job) = self.standard.pop(free, cap, &self.flex.running) {
            return Some(job);
        }
        if self.standard.reserved_for.is_some() {
            return None;
        }
        self.flex.pop(free, cap, &self.standard.running)
    }

    /// Whether a `default` or `priority` request waits.
    pub(crate) fn standard_waits(&self) -> bool {
        self.standard.len > 0
    }

    /// The sequences a `default` or `priority` request waits for beyond the `free` ones: the one
    /// [`FairQueue::pop`] would start next, were they free. What preempting batch work may free.
    pub(crate) fn standard_wants(&self, free: usize) -> Option<usize> {
        self.standard.wants(free, self.max_running_per_key, &self.flex.running)
    }

    /// The step computed `rows` for a running request of `owner` in `tier` (prompt, token and
    /// draft rows).
    pub(crate) fn charge(&mut self, owner: Owner, tier: ServiceTier, rows: usize) {
        self.lane(tier).charge(owner, rows);
    }

    /// A request of `owner` in `tier` started by [`FairQueue::pop`] gave back its `sequences`.
    pub(crate) fn finished(&mut self, owner: Owner, tier: ServiceTier, sequences: usize) {
        self.lane(tier).finished(owner, sequences);
    }

    /// Takes every waiting request for which `gone` holds (their clients went away).
    pub(crate) fn remove_where(&mut self, mut gone: impl FnMut(&J) -> bool) -> Vec<J> {
        let mut removed = self.standard.remove_where(&mut gone);
        removed.extend(self.flex.remove_where(gone));
        removed
    }

    /// Every waiting request, in turn order, `flex` ones last.
    pub(crate) fn drain(&mut self) -> Vec<J> {
        let mut jobs = self.standard.drain();
        jobs.extend(self.flex.drain());
        jobs
    }

    fn lane(&mut self, tier: ServiceTier) -> &mut Lane<J> {
        match tier {
            ServiceTier::Flex | ServiceTier::Batch => &mut self.flex,
            ServiceTier::Default | ServiceTier::Priority => &mut self.standard,
        }
    }
}

/// Whether a key running `running` sequences may start a request of `need` more under its `cap`:
/// always when it runs nothing (`prepare` refuses a request larger than the cap; one built in code
/// still runs, alone, rather than waiting forever).
pub(super) fn under_cap(cap: Option<usize>, running: usize, need: usize) -> bool {
    match cap {
        Some(cap) => running == 0 || running + need <= cap,
        None => true,
    }
}

#[cfg(test)]
mod tests;
