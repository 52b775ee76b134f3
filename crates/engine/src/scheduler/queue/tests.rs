//! The fair queue's turns, caps and reservations, and weighted shares over simulated steps.

use std::collections::HashMap;

use super::*;

/// (key, sequences, label)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Job(u64, usize, u32);

impl Waiting for Job {
    fn owner(&self) -> Owner {
        Owner::key(self.0)
    }
    fn sequences(&self) -> usize {
        self.1
    }
    fn tier(&self) -> ServiceTier {
        ServiceTier::Default
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
        q.finished(Owner::key(job.0), ServiceTier::Default, job.1);
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
    q.finished(Owner::key(1), ServiceTier::Default, 1);
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
    q.finished(Owner::key(1), ServiceTier::Default, 1);
    assert_eq!(start_all(&mut q, 5), [2]);
    // A request larger than the cap runs once the key runs nothing else.
    let mut q = FairQueue::new(Some(2));
    q.push(Job(1, 1, 0));
    q.push(Job(1, 3, 1));
    assert_eq!(start_all(&mut q, 4), [0]);
    q.finished(Owner::key(1), ServiceTier::Default, 1);
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

/// A request of `owner` that runs `steps` steps, computing one row each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Work {
    owner: Owner,
    steps: u32,
}

impl Waiting for Work {
    fn owner(&self) -> Owner {
        self.owner
    }
    fn sequences(&self) -> usize {
        1
    }
    fn tier(&self) -> ServiceTier {
        ServiceTier::Default
    }
}

fn owner(tenant: u64, tenant_weight: u32, key: u64, key_weight: u32) -> Owner {
    Owner { key, key_weight, tenant, tenant_weight }
}

/// A server of `slots` sequences, run as the scheduler runs the queue.
struct Sim {
    q: FairQueue<Work>,
    slots: usize,
    running: Vec<Work>,
}

impl Sim {
    fn new(slots: usize) -> Self {
        Self { q: FairQueue::new(None), slots, running: Vec::new() }
    }

    /// Runs `steps` while every owner in `flood` (with its requests' length) keeps a request
    /// waiting: free sequences go to what the queue pops, each running request is charged its
    /// row each step and ends after its length. Returns the sequence-steps each owner ran from
    /// step `steps.start` on.
    fn run(&mut self, flood: &[(Owner, u32)], steps: std::ops::Range<usize>) -> HashMap<Owner, usize> {
        let q = &mut self.q;
        for &(owner, steps) in flood {
            if !q.standard.line.iter().flat_map(|t| &t.keys).any(|k| k.key == owner.key) {
                q.push(Work { owner, steps });
            }
        }
        let mut ran = HashMap::new();
        for step in 0..steps.end {
            while let Some(work) = q.pop(self.slots - self.running.len()) {
                self.running.push(work);
                q.push(work);
            }
            for work in &mut self.running {
                q.charge(work.owner, ServiceTier::Default, 1);
                if step >= steps.start {
                    *ran.entry(work.owner).or_default() += 1;
                }
                work.steps -= 1;
            }
            for done in self.running.extract_if(.., |w| w.steps == 0) {
                q.finished(done.owner, ServiceTier::Default, 1);
            }
        }
        ran
    }
}

fn ratio(ran: &HashMap<Owner, usize>, a: impl Fn(&Owner) -> bool, b: impl Fn(&Owner) -> bool) -> f64 {
    let sum = |f: &dyn Fn(&Owner) -> bool| ran.iter().filter(|(o, _)| f(o)).map(|(_, &n)| n).sum::<usize>() as f64;
    sum(&a) / sum(&b)
}

#[test]
fn tenants_weighing_3_to_1_run_sequences_3_to_1() {
    let (heavy, light) = (owner(1, 3, 10, 1), owner(2, 1, 20, 1));
    let ran = Sim::new(8).run(&[(heavy, 16), (light, 16)], 200..4000);
    let r = ratio(&ran, |o| o.tenant == 1, |o| o.tenant == 2);
    assert!((2.7..=3.3).contains(&r), "{r}: {ran:?}");
}

#[test]
fn a_tenants_ten_keys_together_get_its_one_weight() {
    let mut flood: Vec<(Owner, u32)> = (0..10).map(|k| (owner(1, 1, 100 + k, 1), 16)).collect();
    flood.push((owner(2, 1, 200, 1), 16));
    let ran = Sim::new(8).run(&flood, 200..4000);
    let r = ratio(&ran, |o| o.tenant == 1, |o| o.tenant == 2);
    assert!((0.9..=1.1).contains(&r), "{r}: {ran:?}");
    // And within the tenant its keys share alike.
    let least = (0..10).map(|k| ran[&owner(1, 1, 100 + k, 1)]).min().unwrap();
    let most = (0..10).map(|k| ran[&owner(1, 1, 100 + k, 1)]).max().unwrap();
    assert!(most as f64 <= least as f64 * 1.25, "{least}..{most}");
}

#[test]
fn keys_share_their_tenants_part_by_their_weights() {
    let flood = [(owner(1, 1, 10, 2), 16), (owner(1, 1, 11, 1), 16)];
    let ran = Sim::new(6).run(&flood, 200..4000);
    let r = ratio(&ran, |o| o.key == 10, |o| o.key == 11);
    assert!((1.8..=2.2).contains(&r), "{r}: {ran:?}");
}

#[test]
fn shares_are_counted_in_tokens_not_requests() {
    // Equal weights: the tenant of short requests gets as many tokens as the one of long ones,
    // by starting many more requests.
    let flood = [(owner(1, 1, 10, 1), 4), (owner(2, 1, 20, 1), 64)];
    let ran = Sim::new(8).run(&flood, 500..6000);
    let r = ratio(&ran, |o| o.tenant == 1, |o| o.tenant == 2);
    assert!((0.9..=1.1).contains(&r), "{r}: {ran:?}");
}

#[test]
fn a_tenant_that_arrives_late_gets_no_credit_for_the_time_it_was_away() {
    let (early, late) = (owner(1, 1, 10, 1), owner(2, 1, 20, 1));
    let mut sim = Sim::new(8);
    let ran = sim.run(&[(early, 16)], 0..1000);
    assert_eq!(ran[&early], 8000, "alone, it runs every sequence");
    // Its requests keep running and waiting; the newcomer starts level with it, not 8000 rows
    // behind (which would give it every sequence for the next thousand steps).
    let ran = sim.run(&[(early, 16), (late, 16)], 0..400);
    let share = ran[&late] as f64 / (ran[&late] + ran[&early]) as f64;
    assert!((0.3..=0.55).contains(&share), "{share}: {ran:?}");
}

#[test]
fn nothing_is_kept_of_owners_that_neither_wait_nor_run() {
    let mut q = FairQueue::new(None);
    for key in 0..50 {
        q.push(Work { owner: owner(key % 5, 1, key, 1), steps: 1 });
    }
    let mut started = Vec::new();
    while let Some(w) = q.pop(8) {
        started.push(w);
        if started.len() == 8 {
            break;
        }
    }
    for w in &started {
        q.charge(w.owner, ServiceTier::Default, 3);
        q.finished(w.owner, ServiceTier::Default, 1);
    }
    q.remove_where(|w| w.owner.key % 2 == 0);
    q.drain();
    assert!(q.is_empty());
    let lane = &q.standard;
    assert!(lane.tenants.is_empty() && lane.running.is_empty(), "{} tenants kept", lane.tenants.len());
    assert_eq!(lane.tenant_times.len(), 0);
}

/// (key, tier, label), one sequence each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiered(u64, ServiceTier, u32);

impl Waiting for Tiered {
    fn owner(&self) -> Owner {
        Owner::key(self.0)
    }
    fn sequences(&self) -> usize {
        1
    }
    fn tier(&self) -> ServiceTier {
        self.1
    }
}

fn labels(q: &mut FairQueue<Tiered>, free: usize) -> Vec<u32> {
    std::iter::from_fn(|| q.pop(free)).map(|j| j.2).take(free).collect()
}

#[test]
fn flex_requests_start_only_when_no_other_request_waits() {
    use ServiceTier::*;
    let mut q = FairQueue::new(None);
    q.push(Tiered(1, Flex, 10));
    q.push(Tiered(1, Flex, 11));
    q.push(Tiered(2, Default, 20));
    q.push(Tiered(3, Priority, 30));
    // Flex arrived first, and its key has nothing else: it still waits behind both.
    assert_eq!(labels(&mut q, 3), [20, 30, 10]);
    assert_eq!(q.len(), 1);
    // A default request arriving later goes ahead of the flex one still waiting.
    q.push(Tiered(4, Default, 40));
    assert_eq!(q.pop(1).map(|j| j.2), Some(40));
    assert_eq!(q.pop(1).map(|j| j.2), Some(11));
    assert!(q.is_empty());
}

#[test]
fn a_priority_request_goes_ahead_of_its_own_keys_others_not_of_other_keys() {
    use ServiceTier::*;
    let mut q = FairQueue::new(None);
    for (key, tier, label) in
        [(1, Default, 10), (1, Default, 11), (2, Default, 20), (1, Priority, 12), (1, Priority, 13)]
    {
        q.push(Tiered(key, tier, label));
    }
    // Key 1's priority requests first among its own, in their order; key 2 keeps its turn.
    assert_eq!(labels(&mut q, 5), [12, 20, 13, 10, 11]);
}

#[test]
fn a_waiting_request_that_does_not_fit_keeps_free_sequences_from_flex_and_caps_count_both_lanes() {
    use ServiceTier::*;
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Wide(u64, usize, ServiceTier);
    impl Waiting for Wide {
        fn owner(&self) -> Owner {
            Owner::key(self.0)
        }
        fn sequences(&self) -> usize {
            self.1
        }
        fn tier(&self) -> ServiceTier {
            self.2
        }
    }
    let mut q = FairQueue::new(None);
    q.push(Wide(1, 4, Default));
    q.push(Wide(2, 1, Flex));
    assert_eq!(q.pop(2), None, "the n=4 request holds the two free sequences");
    assert_eq!(q.pop(4), Some(Wide(1, 4, Default)));
    assert_eq!(q.pop(1), Some(Wide(2, 1, Flex)));
    // A key at its cap of 2 with one flex and one default running starts neither lane's next.
    let mut q = FairQueue::new(Some(2));
    for w in [Wide(1, 1, Flex), Wide(1, 1, Default), Wide(1, 1, Default), Wide(1, 1, Flex)] {
        q.push(w);
    }
    assert_eq!(q.pop(8), Some(Wide(1, 1, Default)));
    assert_eq!(q.pop(8), Some(Wide(1, 1, Default)));
    assert_eq!(q.pop(8), None, "two running: the flex ones wait though sequences are free");
    q.finished(Owner::key(1), Default, 1);
    assert_eq!(q.pop(8), Some(Wide(1, 1, Flex)));
    assert_eq!(q.pop(8), None);
    q.finished(Owner::key(1), Flex, 1);
    q.finished(Owner::key(1), Default, 1);
    assert_eq!(q.pop(8), Some(Wide(1, 1, Flex)));
}
