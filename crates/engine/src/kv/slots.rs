//! What each llama.cpp sequence holds in the KV cache, so prompts can reuse it.
//!
//! A finished request's sequence is not wiped: its tokens stay in the cache until the slot is
//! reused, and a new request whose prompt starts with the same tokens (system prompt, earlier
//! turns of the conversation, tools) takes over that prefix instead of recomputing it. A prefix
//! held by any other sequence, running or idle, is shared by copying its cells (between KV streams
//! a copy of the entries; in a unified KV cache only a tag with one more sequence id; nothing is
//! recomputed: see `kv_layout`).
//!
//! Memory stays bounded: each sequence holds at most `ctx_size` positions, so the cache never
//! outgrows `ctx_size * parallel` cells. When no idle slot holds a useful prefix, the least
//! recently used one is overwritten.
//!
//! Each slot remembers the cache scope (`CacheScope`) of the request that filled it; only a
//! request of the same scope matches its tokens, so nothing cached for one tenant is reused, or
//! even measurable, by another.
//!
//! With KV-cache events on, every change is also told to the sequences' virtual blocks
//! (`kv::blocks`), which announce what the engine gained and lost.

use crate::kv::blocks::{BlockTable, KvEventSink, Medium};
use crate::kv::seq_id::SeqId;
use crate::request::CacheScope;

pub(crate) struct KvSlots {
    tokens: Vec<Vec<i32>>,
    /// The scope of the request whose tokens each sequence holds.
    scopes: Vec<CacheScope>,
    last_used: Vec<u64>,
    clock: u64,
    /// Without a useful prefix, take the lowest free sequence instead of the least recently
    /// used (per-sequence KV streams: see `kv_layout`).
    lowest_first: bool,
    /// The virtual blocks announced to a router, when KV-cache events are on.
    blocks: Option<BlockTable>,
}

/// Length of the common prefix of two token lists.
pub(crate) fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl KvSlots {
    pub(crate) fn new(n_seqs: usize, lowest_first: bool) -> Self {
        Self {
            tokens: vec![Vec::new(); n_seqs],
            scopes: vec![CacheScope::default(); n_seqs],
            last_used: vec![0; n_seqs],
            clock: 0,
            lowest_first,
            blocks: None,
        }
    }

    /// Announces the blocks the sequences gain and lose to `sink`.
    pub(crate) fn with_events(self, sink: Option<KvEventSink>) -> Self {
        Self { blocks: sink.map(|sink| BlockTable::new(Medium::Gpu, sink)), ..self }
    }

    /// Tokens whose KV entries sequence `seq` holds, positions 0..len.
    pub(crate) fn tokens(&self, seq: SeqId) -> &[i32] {
        &self.tokens[seq.index()]
    }

    /// The scope of what `seq` holds.
    pub(crate) fn scope(&self, seq: SeqId) -> CacheScope {
        self.scopes[seq.index()]
    }

    /// `seq` now belongs to a request of `scope`: what it keeps of its tokens must have been
    /// matched under that scope (or be nothing).
    pub(crate) fn claim(&mut self, seq: SeqId, scope: CacheScope) {
        debug_assert!(self.scopes[seq.index()] == scope || self.tokens[seq.index()].is_empty());
        self.scopes[seq.index()] = scope;
    }

    /// Tokens of `seq` that a request of `scope` may reuse: none across scopes.
    fn tokens_in(&self, seq: SeqId, scope: CacheScope) -> &[i32] {
        if self.scopes[seq.index()] == scope {
            &self.tokens[seq.index()]
        } else {
            &[]
        }
    }

    /// Token `token` was decoded at `pos` of `seq`.
    pub(crate) fn record(&mut self, seq: SeqId, pos: usize, token: i32) {
        let t = &mut self.tokens[seq.index()];
        t.truncate(pos);
        debug_assert_eq!(t.len(), pos, "positions are fed in order");
        t.push(token);
        if let Some(blocks) = &mut self.blocks {
            blocks.recorded(seq.index() as u64, t, self.scopes[seq.index()]);
        }
    }

    /// `seq` now holds `tokens`, cached under `scope` (restored from host memory).
    pub(crate) fn set(&mut self, seq: SeqId, scope: CacheScope, tokens: &[i32]) {
        self.tokens[seq.index()] = tokens.to_vec();
        self.scopes[seq.index()] = scope;
        if let Some(blocks) = &mut self.blocks {
            blocks.set(seq.index() as u64, tokens, scope);
        }
    }

    pub(crate) fn truncate(&mut self, seq: SeqId, len: usize) {
        self.tokens[seq.index()].truncate(len);
        if let Some(blocks) = &mut self.blocks {
            blocks.truncate(seq.index() as u64, len);
        }
    }

    /// `dst` now holds the first `len` entries of `src`.
    pub(crate) fn copy_prefix(&mut self, src: SeqId, dst: SeqId, len: usize) {
        let prefix = self.tokens[src.index()][..len].to_vec();
        self.tokens[dst.index()] = prefix;
        self.scopes[dst.index()] = self.scopes[src.index()];
        if let Some(blocks) = &mut self.blocks {
            blocks.set(dst.index() as u64, &self.tokens[dst.index()], self.scopes[dst.index()]);
        }
    }

    /// Tokens held, summed over sequences.
    pub(crate) fn total_tokens(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }

    pub(crate) fn clear_all(&mut self) {
        self.tokens.iter_mut().for_each(Vec::clear);
        if let Some(blocks) = &mut self.blocks {
            blocks.clear_all();
        }
    }

    /// Marks `seq` as just used, for least-recently-used eviction.
    pub(crate) fn touch(&mut self, seq: SeqId) {
        self.clock += 1;
        self.last_used[seq.index()] = self.clock;
    }

    /// Which idle sequence a prompt of `scope` should take: the one already holding the longest
    /// prefix of it under that scope, else the least recently used (or the lowest, see
    /// `lowest_first`). Returns its index in `free` and the reusable length.
    pub(crate) fn pick_free(&self, free: &[SeqId], scope: CacheScope, prompt: &[i32]) -> Option<(usize, usize)> {
        let rank = |seq: SeqId| if self.lowest_first { seq.index() as u64 } else { self.last_used[seq.index()] };
        free.iter()
            .enumerate()
            .map(|(i, &seq)| (i, common_prefix(self.tokens_in(seq, scope), prompt), rank(seq)))
            // Longest prefix first; among equals (e.g. none) the oldest, or the lowest.
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
            .map(|(i, len, _)| (i, len))
    }

    /// The sequence (other than `exclude`) holding the longest prefix of `prompt` under `scope`.
    pub(crate) fn best_source(&self, scope: CacheScope, prompt: &[i32], exclude: &[SeqId]) -> Option<(SeqId, usize)> {
        (0..self.tokens.len())
            .map(SeqId::new)
            .filter(|s| !exclude.contains(s))
            .map(|s| (s, common_prefix(self.tokens_in(s, scope), prompt)))
            .filter(|&(_, len)| len > 0)
            .max_by_key(|&(_, len)| len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::seq_id::seqs;

    fn id(index: usize) -> SeqId {
        SeqId::new(index)
    }

    const A: CacheScope = CacheScope(0);
    const B: CacheScope = CacheScope(2);

    fn fill(slots: &mut KvSlots, seq: usize, tokens: &[i32]) {
        let seq = id(seq);
        for (pos, &t) in tokens.iter().enumerate() {
            slots.record(seq, pos, t);
        }
    }

    #[test]
    fn picks_the_slot_holding_the_longest_prefix() {
        let mut s = KvSlots::new(3, false);
        fill(&mut s, 0, &[1, 2, 3]);
        fill(&mut s, 1, &[1, 2, 3, 4, 5]);
        fill(&mut s, 2, &[9]);
        assert_eq!(s.pick_free(&seqs(&[0, 1, 2]), A, &[1, 2, 3, 4, 7]), Some((1, 4)));
        assert_eq!(s.pick_free(&seqs(&[0, 2]), A, &[1, 2, 3, 4, 7]), Some((0, 3)));
    }

    #[test]
    fn without_a_match_the_least_recently_used_slot_is_overwritten() {
        let mut s = KvSlots::new(3, false);
        s.touch(id(2));
        s.touch(id(0));
        s.touch(id(1));
        assert_eq!(s.pick_free(&seqs(&[0, 1, 2]), A, &[5, 6]), Some((2, 0)));
        s.touch(id(2));
        assert_eq!(s.pick_free(&seqs(&[0, 1, 2]), A, &[5, 6]), Some((0, 0)));
        assert_eq!(s.pick_free(&seqs(&[]), A, &[5, 6]), None);
    }

    #[test]
    fn lowest_first_takes_the_lowest_free_sequence_unless_one_holds_a_prefix() {
        let mut s = KvSlots::new(4, true);
        s.touch(id(1));
        s.touch(id(3));
        // Free in any order: without a prefix the lowest id wins, however long it sat idle.
        assert_eq!(s.pick_free(&seqs(&[3, 1, 2]), A, &[5, 6]), Some((1, 0)));
        fill(&mut s, 3, &[5, 6, 7]);
        assert_eq!(s.pick_free(&seqs(&[3, 1, 2]), A, &[5, 6]), Some((0, 2)), "a held prefix still wins");
    }

    #[test]
    fn best_source_skips_excluded_and_empty_matches() {
        let mut s = KvSlots::new(3, false);
        fill(&mut s, 0, &[1, 2, 3, 4]);
        fill(&mut s, 1, &[1, 2]);
        assert_eq!(s.best_source(A, &[1, 2, 3, 9], &[]), Some((id(0), 3)));
        assert_eq!(s.best_source(A, &[1, 2, 3, 9], &[id(0)]), Some((id(1), 2)));
        assert_eq!(s.best_source(A, &[7], &[]), None);
    }

    #[test]
    fn a_prefix_cached_under_another_scope_is_never_matched() {
        let mut s = KvSlots::new(3, false);
        s.claim(id(0), A);
        fill(&mut s, 0, &[1, 2, 3, 4]);
        s.claim(id(1), B);
        fill(&mut s, 1, &[1, 2]);
        s.touch(id(2));
        s.touch(id(1));
        s.touch(id(0));
        // B's prompt extends A's slot 0, but only its own slot 1 is a match.
        assert_eq!(s.pick_free(&seqs(&[0, 1, 2]), B, &[1, 2, 3, 4, 5]), Some((1, 2)));
        assert_eq!(s.best_source(B, &[1, 2, 3, 4, 5], &[]), Some((id(1), 2)));
        assert_eq!(s.best_source(B, &[1, 2, 3, 4, 5], &[id(1)]), None, "A's slot is not a source for B");
        // A third scope matches nothing: it takes the least recently used slot, reusing none of it.
        let c = CacheScope(3);
        assert_eq!(s.pick_free(&seqs(&[0, 1, 2]), c, &[1, 2, 3]), Some((2, 0)));
        assert_eq!(s.pick_free(&seqs(&[0, 1]), c, &[1, 2, 3]), Some((1, 0)));
        assert_eq!(s.best_source(c, &[1, 2, 3], &[]), None);
        // A copy or a restore carries its scope along.
        s.copy_prefix(id(0), id(2), 3);
        assert_eq!((s.scope(id(2)), s.best_source(A, &[1, 2, 3], &[id(0)]).map(|(seq, _)| seq)), (A, Some(id(2))));
        s.set(id(2), B, &[7, 8]);
        assert_eq!(s.best_source(A, &[7, 8], &[]), None);
        assert_eq!(s.best_source(B, &[7, 8], &[]), Some((id(2), 2)));
    }

    #[test]
    fn record_truncate_and_copy_track_the_cache() {
        let mut s = KvSlots::new(2, false);
        fill(&mut s, 0, &[1, 2, 3, 4]);
        s.truncate(id(0), 2);
        s.record(id(0), 2, 8);
        assert_eq!(s.tokens(id(0)), &[1, 2, 8]);
        s.copy_prefix(id(0), id(1), 2);
        assert_eq!(s.tokens(id(1)), &[1, 2]);
        s.clear_all();
        assert!(s.tokens(id(0)).is_empty() && s.tokens(id(1)).is_empty());
    }
}
