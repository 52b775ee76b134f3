//! One lane of the fair queue: tenants in line, each with its keys in line, each with its waiting
//! requests, and the virtual times that decide whose turn comes (see the module above).

use std::collections::{HashMap, VecDeque};

use super::virtual_time::VirtualTimes;
use super::{under_cap, Waiting};
use crate::request::{Owner, ServiceTier};

pub(super) struct Lane<J> {
    /// Tenants with waiting requests, in turn order: among those equally far behind, the first.
    pub(super) line: VecDeque<TenantLine<J>>,
    /// Tenants' virtual times.
    pub(super) tenant_times: VirtualTimes,
    /// Every tenant that waits or runs: its running sequences and its keys' virtual times.
    pub(super) tenants: HashMap<u64, TenantState>,
    /// Sequences running per key from this lane (keys with none are absent).
    pub(super) running: HashMap<u64, usize>,
    /// The key whose first request does not fit yet: free sequences are held for it.
    pub(super) reserved_for: Option<u64>,
    pub(super) len: usize,
}

#[derive(Default)]
pub(super) struct TenantState {
    running: usize,
    key_times: VirtualTimes,
}

/// A tenant's keys with waiting requests, in turn order.
pub(super) struct TenantLine<J> {
    tenant: u64,
    pub(super) keys: VecDeque<KeyLine<J>>,
}

/// A key's waiting requests, in arrival order.
pub(super) struct KeyLine<J> {
    pub(super) key: u64,
    jobs: VecDeque<J>,
}

impl<J: Waiting> Lane<J> {
    pub(super) fn new() -> Self {
        Self {
            line: VecDeque::new(),
            tenant_times: VirtualTimes::default(),
            tenants: HashMap::new(),
            running: HashMap::new(),
            reserved_for: None,
            len: 0,
        }
    }

    /// Queues `job` behind its key's earlier ones (a `priority` one ahead of the key's others);
    /// a key or tenant new to the line takes the last turn among those equally far behind.
    pub(super) fn push(&mut self, job: J) {
        let Owner { key, tenant, .. } = job.owner();
        self.len += 1;
        let state = self.tenants.entry(tenant).or_default();
        match self.line.iter_mut().find(|t| t.tenant == tenant) {
            Some(line) => match line.keys.iter_mut().find(|k| k.key == key) {
                Some(k) if job.tier() == ServiceTier::Priority => {
                    let at = k.jobs.iter().position(|j| j.tier() != ServiceTier::Priority).unwrap_or(k.jobs.len());
                    k.jobs.insert(at, job);
                }
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

    /// The next request to start with `free` sequences free (at least one), counted as running
    /// from now on (until [`Lane::finished`]); `None` when none may start now. Each key may run
    /// up to `cap` sequences, counting those it runs from the other lane (`elsewhere`).
    pub(super) fn pop(&mut self, free: usize, cap: Option<usize>, elsewhere: &HashMap<u64, usize>) -> Option<J> {
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
        let (t, k) = self.next(cap, elsewhere)?;
        let first = &self.line[t].keys[k];
        if first.jobs[0].sequences() > free {
            self.reserved_for = Some(first.key);
            return None;
        }
        Some(self.take(t, k))
    }

    /// The sequences the request [`Lane::pop`] would start next needs, when `free` are too few
    /// for it; `None` when it would start, or none waits (or every waiting key is at its cap).
    pub(super) fn wants(&self, free: usize, cap: Option<usize>, elsewhere: &HashMap<u64, usize>) -> Option<usize> {
        let (t, k) = match self.reserved_for.and_then(|key| self.find(key)) {
            Some(found) => found,
            None => self.next(cap, elsewhere)?,
        };
        let need = self.line[t].keys[k].jobs[0].sequences();
        (need > free).then_some(need)
    }

    /// The step computed `rows` for a running request of `owner` (prompt, token and draft rows).
    pub(super) fn charge(&mut self, owner: Owner, rows: usize) {
        // Only running requests are served: a charge after the end keeps nothing alive.
        if rows == 0 || !self.running.contains_key(&owner.key) {
            return;
        }
        self.tenant_times.charge(owner.tenant, rows, owner.tenant_weight);
        if let Some(state) = self.tenants.get_mut(&owner.tenant) {
            state.key_times.charge(owner.key, rows, owner.key_weight);
        }
    }

    /// A request of `owner` started by [`Lane::pop`] gave back its `sequences`.
    pub(super) fn finished(&mut self, owner: Owner, sequences: usize) {
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
    pub(super) fn remove_where(&mut self, mut gone: impl FnMut(&J) -> bool) -> Vec<J> {
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
    pub(super) fn drain(&mut self) -> Vec<J> {
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
    fn next(&self, cap: Option<usize>, elsewhere: &HashMap<u64, usize>) -> Option<(usize, usize)> {
        let running =
            |key: &u64| self.running.get(key).copied().unwrap_or(0) + elsewhere.get(key).copied().unwrap_or(0);
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
                .filter(|(_, k)| under_cap(cap, running(&k.key), k.jobs[0].sequences()))
                .map(|(k, line)| (state.key_times.of(line.key), k))
                .reduce(|a, b| if b.0 < a.0 { b } else { a });
            if let Some((_, k)) = key {
                best = Some((time, t, k));
            }
        }
        best.map(|(_, t, k)| (t, k))
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
