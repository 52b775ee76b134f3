//! The virtual-block bookkeeping of `kv::blocks`, through `KvSlots` as the cache drives it.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::*;
use crate::kv::host_cache::HostCache;
use crate::kv::seq_id::SeqId;
use crate::kv::slots::KvSlots;

const B: usize = KV_EVENT_BLOCK_TOKENS;
const SHARED: CacheScope = CacheScope(0);
const TENANT: CacheScope = CacheScope(9);

fn slots(n: usize, capacity: usize) -> (KvSlots, mpsc::Receiver<(Arc<str>, KvBlockEvent)>) {
    let (tx, rx) = mpsc::channel(capacity);
    (KvSlots::new(n, false).with_events(Some(KvEventSink::new(tx, "m"))), rx)
}

fn drain(rx: &mut mpsc::Receiver<(Arc<str>, KvBlockEvent)>) -> Vec<KvBlockEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).map(|(model, e)| (assert_eq!(&*model, "m"), e).1).collect()
}

fn tokens(from: i32, n: usize) -> Vec<i32> {
    (from..).take(n).collect()
}

fn fill(s: &mut KvSlots, seq: usize, scope: CacheScope, t: &[i32]) {
    s.claim(SeqId::new(seq), scope);
    for (pos, &token) in t.iter().enumerate() {
        s.record(SeqId::new(seq), pos, token);
    }
}

#[test]
fn whole_blocks_are_stored_as_they_fill_chained_to_their_parent() {
    let (mut s, mut rx) = slots(2, 64);
    let t = tokens(1, 2 * B + 10);
    fill(&mut s, 0, SHARED, &t[..B - 1]);
    assert!(drain(&mut rx).is_empty(), "no whole block yet");
    fill(&mut s, 0, SHARED, &t);
    let hashes = chain(&t, SHARED);
    assert_eq!(hashes.len(), 2);
    assert_eq!(
        drain(&mut rx),
        [
            KvBlockEvent::Stored {
                hashes: vec![hashes[0]],
                parent: None,
                tokens: t[..B].to_vec(),
                scope: SHARED,
                medium: Medium::Gpu
            },
            KvBlockEvent::Stored {
                hashes: vec![hashes[1]],
                parent: Some(hashes[0]),
                tokens: t[B..2 * B].to_vec(),
                scope: SHARED,
                medium: Medium::Gpu
            },
        ]
    );
}

#[test]
fn a_block_is_removed_when_its_last_holder_loses_it() {
    let (mut s, mut rx) = slots(2, 64);
    let t = tokens(1, 3 * B);
    fill(&mut s, 0, SHARED, &t);
    let hashes = chain(&t, SHARED);
    drain(&mut rx);
    // Sequence 1 takes the first two blocks (a shared prefix): nothing new for the router.
    s.copy_prefix(SeqId::new(0), SeqId::new(1), 2 * B + 5);
    assert!(drain(&mut rx).is_empty());
    // Cut to 1.5 blocks: block 2 goes; block 1 stays, sequence 1 holds it.
    s.truncate(SeqId::new(0), B + B / 2);
    assert_eq!(drain(&mut rx), [KvBlockEvent::Removed { hashes: vec![hashes[2]], medium: Medium::Gpu }]);
    s.truncate(SeqId::new(1), 0);
    assert_eq!(drain(&mut rx), [KvBlockEvent::Removed { hashes: vec![hashes[1]], medium: Medium::Gpu }]);
    // Overwriting sequence 0's position 10 breaks its block 0.
    s.record(SeqId::new(0), 10, -1);
    assert_eq!(drain(&mut rx), [KvBlockEvent::Removed { hashes: vec![hashes[0]], medium: Medium::Gpu }]);
}

#[test]
fn the_same_tokens_in_another_scope_are_other_blocks() {
    let (mut s, mut rx) = slots(2, 64);
    let t = tokens(1, B);
    fill(&mut s, 0, SHARED, &t);
    fill(&mut s, 1, TENANT, &t);
    let events = drain(&mut rx);
    let stored: Vec<(u64, CacheScope)> = events
        .iter()
        .map(|e| match e {
            KvBlockEvent::Stored { hashes, scope, .. } => (hashes[0], *scope),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(stored, [(chain(&t, SHARED)[0], SHARED), (chain(&t, TENANT)[0], TENANT)]);
    assert_ne!(stored[0].0, stored[1].0);
}

#[test]
fn a_restore_stores_only_the_blocks_the_engine_did_not_hold() {
    let (mut s, mut rx) = slots(2, 64);
    let t = tokens(1, 3 * B);
    let hashes = chain(&t, SHARED);
    fill(&mut s, 0, SHARED, &t[..B]);
    drain(&mut rx);
    s.set(SeqId::new(1), SHARED, &t);
    assert_eq!(
        drain(&mut rx),
        [KvBlockEvent::Stored {
            hashes: hashes[1..].to_vec(),
            parent: Some(hashes[0]),
            tokens: t[B..].to_vec(),
            scope: SHARED,
            medium: Medium::Gpu
        }]
    );
}

#[test]
fn clearing_the_cache_and_closing_the_engine_remove_exactly_its_blocks() {
    let (mut s, mut rx) = slots(1, 64);
    fill(&mut s, 0, SHARED, &tokens(1, B));
    drain(&mut rx);
    s.clear_all();
    let first = chain(&tokens(1, B), SHARED);
    assert_eq!(drain(&mut rx), [KvBlockEvent::Removed { hashes: first, medium: Medium::Gpu }]);
    let t = tokens(5, B);
    fill(&mut s, 0, SHARED, &t);
    drain(&mut rx);
    drop(s);
    assert_eq!(drain(&mut rx), [KvBlockEvent::Removed { hashes: chain(&t, SHARED), medium: Medium::Gpu }]);
}

#[test]
fn a_full_channel_drops_events_without_blocking() {
    let (mut s, mut rx) = slots(1, 1);
    fill(&mut s, 0, SHARED, &tokens(1, 3 * B));
    assert_eq!(drain(&mut rx).len(), 1, "one fit; the others were dropped, and the scheduler went on");
    assert_eq!(s.tokens(SeqId::new(0)).len(), 3 * B);
}

#[test]
fn without_a_sink_nothing_is_kept() {
    let mut s = KvSlots::new(1, false);
    fill(&mut s, 0, SHARED, &tokens(1, 2 * B));
    assert_eq!(s.tokens(SeqId::new(0)).len(), 2 * B);
}

#[test]
fn host_cache_entries_hold_their_blocks_in_the_cpu_medium() {
    let (tx, mut rx) = mpsc::channel(64);
    let mut host = HostCache::new(100).with_events(Some(KvEventSink::new(tx, "m")));
    let t = tokens(1, 2 * B + 3);
    let hashes = chain(&t, TENANT);
    assert!(host.insert(TENANT, t[..B + 1].to_vec(), (), 10));
    // The longer entry replaces the shorter one it starts with: block 0 changes holder only.
    assert!(host.insert(TENANT, t.clone(), (), 10));
    assert_eq!(
        drain(&mut rx),
        [
            KvBlockEvent::Stored {
                hashes: vec![hashes[0]],
                parent: None,
                tokens: t[..B].to_vec(),
                scope: TENANT,
                medium: Medium::Cpu
            },
            KvBlockEvent::Stored {
                hashes: vec![hashes[1]],
                parent: Some(hashes[0]),
                tokens: t[B..2 * B].to_vec(),
                scope: TENANT,
                medium: Medium::Cpu
            },
        ]
    );
    // Evicted for room: its blocks go.
    assert!(host.insert(SHARED, tokens(900, 3), (), 95));
    let mut removed = match drain(&mut rx).as_slice() {
        [KvBlockEvent::Removed { hashes, medium: Medium::Cpu }] => hashes.clone(),
        other => panic!("{other:?}"),
    };
    removed.sort_unstable();
    let mut expected = hashes;
    expected.sort_unstable();
    assert_eq!(removed, expected);
}
