//! Host-RAM cache of idle sequences' KV state (`--cache-ram`).
//!
//! In llama.cpp's unified KV cache (`--kv-unified`) a decoding token attends over every used cell
//! up to the highest one, other sequences' included (they are masked, not skipped), so prefixes
//! left in idle slots slow down every running stream: measured, one stream decoded 21.8 tokens/s
//! beside 16 idle slots holding ~1k-token documents, 27.8 with those in host memory. With a
//! stream per sequence an idle slot costs nothing, but emptying it keeps the running sequences on
//! the lowest slots (see `kv_layout`). So a finished sequence's KV entries are
//! copied out to host memory (`state_seq_get`, a memcpy of ~12 KB per token for the 0.5B) and its
//! cells freed; a new prompt that starts with a cached token list gets those entries copied back
//! into its sequence (`state_seq_set`) instead of recomputing them. Host memory also holds far
//! more conversations and documents than there are slots.
//!
//! Bounded by bytes; the least recently used entry goes first. An entry whose tokens start
//! another one's (the same conversation, one turn earlier) is dropped when the longer one
//! arrives: the longer one serves every prompt the shorter one would.
//!
//! Entries keep the cache scope they were computed under (`CacheScope`): a prompt is matched,
//! and an entry covered or replaced, only by entries of its own scope.
//!
//! With KV-cache events on, each entry holds its virtual blocks in the `Cpu` medium
//! (`kv::blocks`), announced as it is kept and removed as it is dropped.

use crate::kv::blocks::{BlockTable, KvEventSink, Medium};
use crate::kv::slots::common_prefix;
use crate::request::CacheScope;

/// One cached token list and its KV state.
struct Entry<S> {
    /// Names the entry among the holders of virtual blocks.
    id: u64,
    scope: CacheScope,
    tokens: Vec<i32>,
    state: S,
    bytes: usize,
    last_used: u64,
}

pub(crate) struct HostCache<S> {
    entries: Vec<Entry<S>>,
    bytes: usize,
    capacity: usize,
    clock: u64,
    next_id: u64,
    blocks: Option<BlockTable>,
}

impl<S> HostCache<S> {
    /// A cache holding at most `capacity` bytes of state; 0 disables it.
    pub(crate) fn new(capacity: usize) -> Self {
        Self { entries: Vec::new(), bytes: 0, capacity, clock: 0, next_id: 0, blocks: None }
    }

    /// Announces the blocks of the entries kept and dropped to `sink`.
    pub(crate) fn with_events(self, sink: Option<KvEventSink>) -> Self {
        Self { blocks: sink.map(|sink| BlockTable::new(Medium::Cpu, sink)), ..self }
    }

    /// Drops entry `i`.
    fn drop_entry(&mut self, i: usize) {
        let entry = self.entries.swap_remove(i);
        self.bytes -= entry.bytes;
        if let Some(blocks) = &mut self.blocks {
            blocks.truncate(entry.id, 0);
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes of state held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether an entry of `scope` already starts with `tokens` (keeping them again would add
    /// nothing).
    pub(crate) fn covers(&self, scope: CacheScope, tokens: &[i32]) -> bool {
        self.entries.iter().any(|e| e.scope == scope && e.tokens.starts_with(tokens))
    }

    /// Keeps `state`, the KV entries of `tokens` (positions 0..len) computed under `scope`.
    /// Returns false when it was not kept: nothing to keep, larger than the whole cache, or
    /// already covered by an entry of the scope that starts with the same tokens.
    pub(crate) fn insert(&mut self, scope: CacheScope, tokens: Vec<i32>, state: S, bytes: usize) -> bool {
        if tokens.is_empty() || bytes > self.capacity {
            return false;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.scope == scope && e.tokens.starts_with(&tokens)) {
            e.last_used = self.clock;
            return false;
        }
        // The new entry's blocks first: those it shares with the entries it replaces change
        // holders without being announced removed and stored again.
        self.next_id += 1;
        if let Some(blocks) = &mut self.blocks {
            blocks.set(self.next_id, &tokens, scope);
        }
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].scope == scope && tokens.starts_with(&self.entries[i].tokens) {
                self.drop_entry(i);
            } else {
                i += 1;
            }
        }
        while self.bytes + bytes > self.capacity {
            let oldest = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i);
            let Some(oldest) = oldest else { break };
            self.drop_entry(oldest);
        }
        self.bytes += bytes;
        self.entries.push(Entry { id: self.next_id, scope, tokens, state, bytes, last_used: self.clock });
        true
    }

    /// The entry of `scope` sharing the longest prefix with `prompt`, if longer than `at_least`:
    /// its tokens, its state and the shared length. Marks it used.
    pub(crate) fn best(&mut self, scope: CacheScope, prompt: &[i32], at_least: usize) -> Option<(&[i32], &S, usize)> {
        let (i, len) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.scope == scope)
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .max_by_key(|&(_, len)| len)?;
        if len <= at_least {
            return None;
        }
        self.clock += 1;
        let e = &mut self.entries[i];
        e.last_used = self.clock;
        Some((&e.tokens, &e.state, len))
    }

    /// Drops the entry of `scope` holding exactly `tokens` (its state could not be restored).
    pub(crate) fn remove(&mut self, scope: CacheScope, tokens: &[i32]) {
        if let Some(i) = self.entries.iter().position(|e| e.scope == scope && e.tokens == tokens) {
            self.drop_entry(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: CacheScope = CacheScope(0);
    const B: CacheScope = CacheScope(7);

    #[test]
    fn the_longest_shared_prefix_wins_and_must_beat_what_is_already_there() {
        let mut c = HostCache::new(100);
        assert!(c.insert(A, vec![1, 2, 3], "a", 10));
        assert!(c.insert(A, vec![1, 2, 4, 5], "b", 10));
        let (tokens, state, len) = c.best(A, &[1, 2, 4, 9], 0).unwrap();
        assert_eq!((tokens, *state, len), (&[1, 2, 4, 5][..], "b", 3));
        assert!(c.best(A, &[1, 2, 4, 9], 3).is_none(), "a slot already holds 3 of them");
        assert!(c.best(A, &[7], 0).is_none());
    }

    #[test]
    fn a_longer_turn_of_the_same_conversation_replaces_the_shorter() {
        let mut c = HostCache::new(100);
        assert!(c.insert(A, vec![1, 2], "turn 1", 10));
        assert!(c.insert(A, vec![1, 2, 3, 4], "turn 2", 20));
        assert_eq!((c.len(), c.bytes()), (1, 20));
        assert!(!c.insert(A, vec![1, 2, 3], "covered", 15), "the longer entry serves it");
        assert_eq!(c.best(A, &[1, 2, 3], 0).map(|(_, s, l)| (*s, l)), Some(("turn 2", 3)));
    }

    #[test]
    fn bytes_stay_bounded_least_recently_used_first() {
        let mut c = HostCache::new(30);
        assert!(c.insert(A, vec![1], "one", 10));
        assert!(c.insert(A, vec![2], "two", 10));
        assert!(c.insert(A, vec![3], "three", 10));
        c.best(A, &[1], 0); // 1 is now the most recently used
        assert!(c.insert(A, vec![4], "four", 10));
        assert_eq!((c.len(), c.bytes()), (3, 30));
        assert!(c.best(A, &[2], 0).is_none(), "the least recently used went");
        assert!(c.best(A, &[1], 0).is_some());
        assert!(!c.insert(A, vec![5], "huge", 31), "larger than the cache");
        c.remove(A, &[1]);
        assert_eq!((c.len(), c.bytes()), (2, 20));
        assert!(!HostCache::<()>::new(0).enabled());
    }

    #[test]
    fn entries_of_another_scope_are_never_matched_covered_or_replaced() {
        let mut c = HostCache::new(100);
        assert!(c.insert(A, vec![1, 2, 3, 4], "a", 10));
        assert!(c.best(B, &[1, 2, 3, 4, 5], 0).is_none(), "B never sees A's prefix");
        assert!(!c.covers(B, &[1, 2]));
        assert!(c.insert(B, vec![1, 2], "b", 10), "not covered by A's longer entry");
        assert!(c.insert(B, vec![1, 2, 3, 4, 5], "b2", 10));
        assert_eq!(c.len(), 2, "B's longer turn replaced B's shorter one, not A's");
        assert_eq!(c.best(A, &[1, 2, 3, 4, 5], 0).map(|(_, s, l)| (*s, l)), Some(("a", 4)));
        assert_eq!(c.best(B, &[1, 2, 3, 4, 5], 0).map(|(_, s, l)| (*s, l)), Some(("b2", 5)));
        c.remove(B, &[1, 2, 3, 4]);
        assert_eq!(c.len(), 2, "A's entry is not B's to remove");
    }
}
