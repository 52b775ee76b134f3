//! Which waiting request gets free sequences next: fair between API keys, so one key's backlog
//! cannot hold back everyone else's requests.
//!
//! Each key has its own queue, in arrival order. Keys take turns (round robin): a turn admits one
//! request, then the key goes to the back of the line, so a request whose key has nothing else
//! waiting is admitted after at most one request of each other waiting key, however many those
//! keys queued. A key may be capped at some running sequences; while at its cap, its turns are
//! skipped (it keeps its place in its own queue).
//!
//! A request needing more sequences than are free (`n` choices) is not passed over for ever: when
//! its turn comes and it does not fit, the free sequences are held for it, and the ones that free
//! up next are added, until it fits. Smaller requests go ahead of it only until its turn comes,
//! at most one per other key.

pub(crate) mod shares;

use std::collections::{HashMap, VecDeque};

/// What the queue needs to know of a waiting request.
pub(crate) trait Waiting {
    /// Whose request it is (the API key), for fairness.
    fn fairness_key(&self) -> u64;
    /// Sequences it needs at once (one per choice).
    fn sequences(&self) -> usize;
}

pub(crate) struct FairQueue<J> {
    /// Keys with waiting requests, in turn order: the front key's turn is next.
    keys: VecDeque<KeyQueue<J>>,
    /// Sequences running per key (keys with none are absent).
    running: HashMap<u64, usize>,
    /// The key whose first request does not fit yet: free sequences are held for it.
    reserved_for: Option<u64>,
    /// Most sequences one key may run at once; `None` is no limit.
    max_running_per_key: Option<usize>,
    len: usize,
}

struct KeyQueue<J> {
    key: u64,
    jobs: VecDeque<J>,
}

impl<J: Waiting> FairQueue<J> {
    pub(crate) fn new(max_running_per_key: Option<usize>) -> Self {
        Self {
            keys: VecDeque::new(),
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

    /// Queues `job` behind its key's earlier ones; a key new to the queue takes the last turn.
    pub(crate) fn push(&mut self, job: J) {
        let key = job.fairness_key();
        self.len += 1;
        match self.keys.iter_mut().find(|q| q.key == key) {
            Some(q) => q.jobs.push_back(job),
            None => self.keys.push_back(KeyQueue { key, jobs: VecDeque::from([job]) }),
        }
    }

    /// The next request to start with `free` sequences free, counted as running from now on
    /// (until [`FairQueue::finished`]); `None` when none may start now.
    pub(crate) fn pop(&mut self, free: usize) -> Option<J> {
        if let Some(key) = self.reserved_for {
            match self.keys.iter().position(|q| q.key == key) {
                Some(i) if self.keys[i].jobs[0].sequences() > free => return None,
                Some(i) => {
                    self.reserved_for = None;
                    return Some(self.take(i));
                }
                // Its requests were cancelled.
                None => self.reserved_for = None,
            }
        }
        for _ in 0..self.keys.len() {
            let q = &self.keys[0];
            let need = q.jobs[0].sequences();
            if !self.may_start(q.key, need) {
                self.keys.rotate_left(1);
                continue;
            }
            if need > free {
                self.reserved_for = Some(q.key);
                return None;
            }
            return Some(self.take(0));
        }
        None
    }

    /// A request of `key` started by [`FairQueue::pop`] gave back its `sequences`.
    pub(crate) fn finished(&mut self, key: u64, sequences: usize) {
        if let Some(n) = self.running.get_mut(&key) {
            *n = n.saturating_sub(sequences);
            if *n == 0 {
                self.running.remove(&key);
            }
        }
    }

    /// Takes every waiting request for which `gone` holds (their clients went away).
    pub(crate) fn remove_where(&mut self, mut gone: impl FnMut(&J) -> bool) -> Vec<J> {
        let mut removed = Vec::new();
        for q in &mut self.keys {
            let (out, kept): (Vec<J>, Vec<J>) = std::mem::take(&mut q.jobs).into_iter().partition(&mut gone);
            q.jobs = kept.into();
            removed.extend(out);
        }
        self.keys.retain(|q| !q.jobs.is_empty());
        self.len -= removed.len();
        removed
    }

    /// Every waiting request, in turn order.
    pub(crate) fn drain(&mut self) -> Vec<J> {
        self.len = 0;
        self.reserved_for = None;
        std::mem::take(&mut self.keys).into_iter().flat_map(|q| q.jobs).collect()
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

    /// Starts the first request of the `i`th key; the key's turn is over.
    fn take(&mut self, i: usize) -> J {
        let mut q = self.keys.remove(i).expect("a queued key");
        let job = q.jobs.pop_front().expect("keys in the line have requests");
        self.len -= 1;
        *self.running.entry(q.key).or_default() += job.sequences();
        if !q.jobs.is_empty() {
            self.keys.push_back(q);
        }
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (key, sequences, label)
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Job(u64, usize, u32);

    impl Waiting for Job {
        fn fairness_key(&self) -> u64 {
            self.0
        }
        fn sequences(&self) -> usize {
            self.1
        }
    }

    /// Labels of the requests started while `free` sequences are free (none finishing).
    fn start_all(q: &mut FairQueue<Job>, mut free: usize) -> Vec<u32> {
        let mut started = Vec::new();
        while let Some(job) = q.pop(free) {
            free -= job.1;
            started.push(job.2);
        }
        started
    }

    #[test]
    fn a_key_with_one_request_waits_behind_at_most_one_of_a_flooding_key() {
        let mut q = FairQueue::new(None);
        for i in 0..40 {
            q.push(Job(1, 1, i));
        }
        q.push(Job(2, 1, 100));
        assert_eq!(q.len(), 41);
        // One sequence at a time: A's first request, then B's, then A's backlog.
        let mut order = Vec::new();
        while let Some(job) = q.pop(1) {
            q.finished(job.0, job.1);
            order.push(job.2);
        }
        assert_eq!(&order[..3], &[0, 100, 1]);
        assert_eq!(order.len(), 41);
        assert!(q.is_empty());
    }

    #[test]
    fn keys_take_turns_one_request_each() {
        let mut q = FairQueue::new(None);
        for (key, label) in [(1, 10), (1, 11), (1, 12), (2, 20), (3, 30), (3, 31)] {
            q.push(Job(key, 1, label));
        }
        assert_eq!(start_all(&mut q, 6), [10, 20, 30, 11, 31, 12]);
    }

    #[test]
    fn a_request_larger_than_the_free_sequences_holds_them_until_it_fits() {
        let mut q = FairQueue::new(None);
        q.push(Job(1, 1, 10));
        q.push(Job(2, 4, 20));
        q.push(Job(3, 1, 30));
        q.push(Job(1, 1, 11));
        // 2 free: key 1's request goes first; key 2's n=4 does not fit and reserves.
        assert_eq!(start_all(&mut q, 2), [10]);
        // Smaller requests no longer go ahead of it, whatever frees up meanwhile.
        assert_eq!(q.pop(1), None);
        assert_eq!(q.pop(3), None);
        q.finished(1, 1);
        assert_eq!(q.pop(4), Some(Job(2, 4, 20)));
        assert_eq!(start_all(&mut q, 2), [30, 11]);
    }

    #[test]
    fn a_reservation_whose_request_was_cancelled_is_lifted() {
        let mut q = FairQueue::new(None);
        q.push(Job(2, 4, 20));
        q.push(Job(3, 1, 30));
        assert_eq!(q.pop(2), None);
        let gone = q.remove_where(|j| j.0 == 2);
        assert_eq!(gone, [Job(2, 4, 20)]);
        assert_eq!(q.pop(2), Some(Job(3, 1, 30)));
        assert!(q.is_empty());
    }

    #[test]
    fn a_capped_key_runs_at_most_its_cap_and_others_fill_the_rest() {
        let mut q = FairQueue::new(Some(2));
        for i in 0..5 {
            q.push(Job(1, 1, i));
        }
        q.push(Job(2, 1, 100));
        assert_eq!(start_all(&mut q, 8), [0, 100, 1]);
        // Key 1 is at its cap: its next request waits though sequences are free.
        assert_eq!(q.pop(5), None);
        q.finished(1, 1);
        assert_eq!(start_all(&mut q, 5), [2]);
        // A request larger than the cap runs once the key runs nothing else.
        let mut q = FairQueue::new(Some(2));
        q.push(Job(1, 1, 0));
        q.push(Job(1, 3, 1));
        assert_eq!(start_all(&mut q, 4), [0]);
        q.finished(1, 1);
        assert_eq!(start_all(&mut q, 4), [1]);
    }

    #[test]
    fn draining_returns_every_request_and_forgets_the_reservation() {
        let mut q = FairQueue::new(None);
        q.push(Job(1, 3, 1));
        q.push(Job(2, 1, 2));
        assert_eq!(q.pop(1), None);
        assert_eq!(q.drain(), [Job(1, 3, 1), Job(2, 1, 2)]);
        assert!(q.is_empty());
        q.push(Job(2, 1, 3));
        assert_eq!(q.pop(1), Some(Job(2, 1, 3)));
    }
}
