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
//! A key may be capped at some running sequences; while at its cap, it is passed over (it keeps
//! its requests, in order). A request needing more sequences than are free (`n` choices) is not
//! passed over for ever: when its turn comes and it does not fit, the free sequences are held for
//! it, and the ones that free up next are added, until it fits. Smaller requests go ahead of it
//! only until its turn comes.

pub(crate) mod shares;
mod virtual_time;

use std::collections::{HashMap, VecDeque};

use virtual_time::VirtualTimes;

use crate::request::Owner;

/// What the queue needs to know of a waiting request.
pub(crate) trait Waiting {
    /// Whose request it is, for fairness.
    fn owner(&self) -> Owner;
    /// Sequences it needs at once (one per choice).
    fn sequences(&self) -> usize;
}

pub(crate) struct FairQueue<J> {
    /// Tenants with waiting requests, in turn order: among those equally far behind, the first.
    line: VecDeque<TenantLine<J>>,
    /// Tenants' virtual times.
    tenant_times: VirtualTimes,
    /// Every tenant that waits or runs: its running sequences and its keys' virtual times.
    tenants: HashMap<u64, TenantState>,
    /// Sequences running per key (keys with none are absent).
    running: HashMap<u64, usize>,
    /// The key whose first request does not fit yet: free sequences are held for it.
    reserved_for: Option<u64>,
    /// Most sequences one key may run at once; `None` is no limit.
    max_running_per_key: Option<usize>,
    len: usize,
}

#[derive(Default)]
struct TenantState {
    running: usize,
    key_times: VirtualTimes,
}

/// A tenant's keys with waiting requests, in turn order.
struct TenantLine<J> {
    tenant: u64,
    keys: VecDeque<KeyLine<J>>,
}

/// A key's waiting requests, in arrival order.
struct KeyLine<J> {
    key: u64,
    jobs: VecDeque<J>,
}

impl<J: Waiting> FairQueue<J> {
    pub(crate) fn new(max_running_per_key: Option<usize>) -> Self {
        Self {
            line: VecDeque::new(),
            tenant_times: VirtualTimes::default(),
            tenants: HashMap::new(),
            running: HashMap::new(),
            reserved_for: None,
            max_running_per_key: max_running_per_key.map(|n| n.max(1)),
            len: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `job` behind its key's earlier ones; a key or tenant new to the line takes the
    /// last turn among those equally far behind.
    pub(crate) fn push(&mut self, job: J) {
        let Owner { key, tenant, .. } = job.owner();
        self.len += 1;
        let state = self.tenants.entry(tenant).or_default();
        match self.line.iter_mut().find(|t| t.tenant == tenant) {
            Some(line) => match line.keys.iter_mut().find(|k| k.key == key) {
                Some(k) => k.jobs.push_back(job),
                None => {
                    state.key_times.join(key, line.keys.iter().map(|k| k.key));
                    line.keys.push_back(KeyLine { key, jobs: VecDeque::from([job]) });
                }
            },
            None => {
                self.tenant_times.join(tenant, self.line.iter().map(|t| t.tenant));
                state.key_times.join(key, []);
                let keys = VecDeque::from([KeyLine { key, jobs: VecDeque::from([job]) }]);
                self.line.push_back(TenantLine { tenant, keys });
            }
        }
    }

    /// The next request to start with `free` sequences free, counted as running from now on
    /// (until [`FairQueue::finished`]); `None` when none may start now.
    pub(crate) fn pop(&mut self, free: usize) -> Option<J> {
        // Nothing starts: whose turn comes is decided when something frees, by the times then.
        if free == 0 {
            return None;
        }
        if let Some(key) = self.reserved_for {
            match self.find(key) {
                Some((t, k)) if self.line[t].keys[k].jobs[0].sequences() > free => return None,
                Some((t, k)) => {
                    self.reserved_for = None;
                    return Some(self.take(t, k));
                }
                // Its requests were cancelled.
                None => self.reserved_for = None,
            }
        }
        let (t, k) = self.next()?;
        let first = &self.line[t].keys[k];
        if first.jobs[0].sequences() > free {
            self.reserved_for = Some(first.key);
            return None;
        }
        Some(self.take(t, k))
    }

    /// The step computed `rows` for a running request of `owner` (prompt, token and draft rows).
    pub(crate) fn charge(&mut self, owner: Owner, rows: usize) {
        // Only running requests are served: a charge after the end keeps nothing alive.
        if rows == 0 || !self.running.contains_key(&owner.key) {
            return;
        }
        self.tenant_times.charge(owner.tenant, rows, owner.tenant_weight);
        if let Some(state) = self.tenants.get_mut(&owner.tenant) {
            state.key_times.charge(owner.key, rows, owner.key_weight);
        }
    }

    /// A request of `owner` started by [`FairQueue::pop`] gave back its `sequences`.
    pub(crate) fn finished(&mut self, owner: Owner, sequences: usize) {
        if let Some(n) = self.running.get_mut(&owner.key) {
            *n = n.saturating_sub(sequences);
            if *n == 0 {
                self.running.remove(&owner.key);
            }
        }
        if let Some(state) = self.tenants.get_mut(&owner.tenant) {
            state.running = state.running.saturating_sub(sequences);
        }
        self.tidy(owner);
    }

    /// Takes every waiting request for which `gone` holds (their clients went away).
    pub(crate) fn remove_where(&mut self, mut gone: impl FnMut(&J) -> bool) -> Vec<J> {
        let mut removed = Vec::new();
        for key in self.line.iter_mut().flat_map(|t| &mut t.keys) {
            let (out, kept): (Vec<J>, Vec<J>) = std::mem::take(&mut key.jobs).into_iter().partition(&mut gone);
            key.jobs = kept.into();
            removed.extend(out);
        }
        self.line.iter_mut().for_each(|t| t.keys.retain(|k| !k.jobs.is_empty()));
        self.line.retain(|t| !t.keys.is_empty());
        self.len -= removed.len();
        for job in &removed {
            self.tidy(job.owner());
        }
        removed
    }

    /// Every waiting request, in turn order.
    pub(crate) fn drain(&mut self) -> Vec<J> {
        self.len = 0;
        self.reserved_for = None;
        let jobs: Vec<J> =
            std::mem::take(&mut self.line).into_iter().flat_map(|t| t.keys).flat_map(|k| k.jobs).collect();
        for job in &jobs {
            self.tidy(job.owner());
        }
        jobs
    }

    /// Where `key`'s waiting requests are in the line.
    fn find(&self, key: u64) -> Option<(usize, usize)> {
        self.line.iter().enumerate().find_map(|(t, line)| Some((t, line.keys.iter().position(|k| k.key == key)?)))
    }

    /// The tenant furthest behind among those with a key that may start its first request now,
    /// and within it the key furthest behind; ties to the earlier in turn order.
    fn next(&self) -> Option<(usize, usize)> {
        let mut best: Option<(f64, usize, usize)> = None;
        for (t, line) in self.line.iter().enumerate() {
            let time = self.tenant_times.of(line.tenant);
            if best.is_some_and(|(b, ..)| b <= time) {
                continue;
            }
            let Some(state) = self.tenants.get(&line.tenant) else { continue };
            let key = line
                .keys
                .iter()
                .enumerate()
                .filter(|(_, k)| self.may_start(k.key, k.jobs[0].sequences()))
                .map(|(k, line)| (state.key_times.of(line.key), k))
                .reduce(|a, b| if b.0 < a.0 { b } else { a });
            if let Some((_, k)) = key {
                best = Some((time, t, k));
            }
        }
        best.map(|(_, t, k)| (t, k))
    }

    /// Whether `key` may start a request of `need` sequences under its cap: always when it runs
    /// nothing (`prepare` refuses a request larger than the cap; one built in code still runs,
    /// alone, rather than waiting forever).
    fn may_start(&self, key: u64, need: usize) -> bool {
        let running = self.running.get(&key).copied().unwrap_or(0);
        match self.max_running_per_key {
            Some(cap) => running == 0 || running + need <= cap,
            None => true,
        }
    }

    /// Starts the first request of the `k`th key of the `t`th tenant in line; their turns are
    /// over.
    fn take(&mut self, t: usize, k: usize) -> J {
        let mut tenant = self.line.remove(t).expect("a tenant in line");
        let mut key = tenant.keys.remove(k).expect("a key in line");
        let job = key.jobs.pop_front().expect("keys in line have requests");
        self.len -= 1;
        let n = job.sequences();
        *self.running.entry(key.key).or_default() += n;
        self.tenants.entry(tenant.tenant).or_default().running += n;
        if !key.jobs.is_empty() {
            tenant.keys.push_back(key);
        }
        if !tenant.keys.is_empty() {
            self.line.push_back(tenant);
        }
        job
    }

    /// Forgets what is kept of `owner`'s key and tenant once they neither wait nor run.
    fn tidy(&mut self, owner: Owner) {
        let Owner { key, tenant, .. } = owner;
        let line = self.line.iter().find(|t| t.tenant == tenant);
        let Some(state) = self.tenants.get_mut(&tenant) else { return };
        if !self.running.contains_key(&key) && !line.is_some_and(|t| t.keys.iter().any(|k| k.key == key)) {
            state.key_times.forget(key);
        }
        if state.running == 0 && line.is_none() {
            self.tenants.remove(&tenant);
            self.tenant_times.forget(tenant);
        }
    }
}

#[cfg(test)]
mod tests;
