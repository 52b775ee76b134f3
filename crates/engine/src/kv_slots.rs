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

pub(crate) struct KvSlots {
    tokens: Vec<Vec<i32>>,
    last_used: Vec<u64>,
    clock: u64,
    /// Without a useful prefix, take the lowest free sequence instead of the least recently
    /// used (per-sequence KV streams: see `kv_layout`).
    lowest_first: bool,
}

/// Length of the common prefix of two token lists.
pub(crate) fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl KvSlots {
    pub fn new(n_seqs: usize, lowest_first: bool) -> Self {
        Self { tokens: vec![Vec::new(); n_seqs], last_used: vec![0; n_seqs], clock: 0, lowest_first }
    }

    /// Tokens whose KV entries sequence `seq` holds, positions 0..len.
    pub fn tokens(&self, seq: i32) -> &[i32] {
        &self.tokens[seq as usize]
    }

    /// Token `token` was decoded at `pos` of `seq`.
    pub fn record(&mut self, seq: i32, pos: usize, token: i32) {
        let t = &mut self.tokens[seq as usize];
        t.truncate(pos);
        debug_assert_eq!(t.len(), pos, "positions are fed in order");
        t.push(token);
    }

    /// `seq` now holds `tokens` (restored from host memory).
    pub fn set(&mut self, seq: i32, tokens: &[i32]) {
        self.tokens[seq as usize] = tokens.to_vec();
    }

    pub fn truncate(&mut self, seq: i32, len: usize) {
        self.tokens[seq as usize].truncate(len);
    }

    /// `dst` now holds the first `len` entries of `src`.
    pub fn copy_prefix(&mut self, src: i32, dst: i32, len: usize) {
        let prefix = self.tokens[src as usize][..len].to_vec();
        self.tokens[dst as usize] = prefix;
    }

    /// Tokens held, summed over sequences.
    pub fn total_tokens(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }

    pub fn clear_all(&mut self) {
        self.tokens.iter_mut().for_each(Vec::clear);
    }

    /// Marks `seq` as just used, for least-recently-used eviction.
    pub fn touch(&mut self, seq: i32) {
        self.clock += 1;
        self.last_used[seq as usize] = self.clock;
    }

    /// Which idle sequence a prompt should take: the one already holding the longest prefix of
    /// it, else the least recently used (or the lowest, see `lowest_first`). Returns its index in
    /// `free` and the reusable length.
    pub fn pick_free(&self, free: &[i32], prompt: &[i32]) -> Option<(usize, usize)> {
        let rank = |seq: i32| if self.lowest_first { seq as u64 } else { self.last_used[seq as usize] };
        free.iter()
            .enumerate()
            .map(|(i, &seq)| (i, common_prefix(self.tokens(seq), prompt), rank(seq)))
            // Longest prefix first; among equals (e.g. none) the oldest, or the lowest.
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
            .map(|(i, len, _)| (i, len))
    }

    /// The sequence (other than `exclude`) holding the longest prefix of `prompt`.
    pub fn best_source(&self, prompt: &[i32], exclude: &[i32]) -> Option<(i32, usize)> {
        (0..self.tokens.len() as i32)
            .filter(|s| !exclude.contains(s))
            .map(|s| (s, common_prefix(self.tokens(s), prompt)))
            .filter(|&(_, len)| len > 0)
            .max_by_key(|&(_, len)| len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(slots: &mut KvSlots, seq: i32, tokens: &[i32]) {
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
        assert_eq!(s.pick_free(&[0, 1, 2], &[1, 2, 3, 4, 7]), Some((1, 4)));
        assert_eq!(s.pick_free(&[0, 2], &[1, 2, 3, 4, 7]), Some((0, 3)));
    }

    #[test]
    fn without_a_match_the_least_recently_used_slot_is_overwritten() {
        let mut s = KvSlots::new(3, false);
        s.touch(2);
        s.touch(0);
        s.touch(1);
        assert_eq!(s.pick_free(&[0, 1, 2], &[5, 6]), Some((2, 0)));
        s.touch(2);
        assert_eq!(s.pick_free(&[0, 1, 2], &[5, 6]), Some((0, 0)));
        assert_eq!(s.pick_free(&[], &[5, 6]), None);
    }

    #[test]
    fn lowest_first_takes_the_lowest_free_sequence_unless_one_holds_a_prefix() {
        let mut s = KvSlots::new(4, true);
        s.touch(1);
        s.touch(3);
        // Free in any order: without a prefix the lowest id wins, however long it sat idle.
        assert_eq!(s.pick_free(&[3, 1, 2], &[5, 6]), Some((1, 0)));
        fill(&mut s, 3, &[5, 6, 7]);
        assert_eq!(s.pick_free(&[3, 1, 2], &[5, 6]), Some((0, 2)), "a held prefix still wins");
    }

    #[test]
    fn best_source_skips_excluded_and_empty_matches() {
        let mut s = KvSlots::new(3, false);
        fill(&mut s, 0, &[1, 2, 3, 4]);
        fill(&mut s, 1, &[1, 2]);
        assert_eq!(s.best_source(&[1, 2, 3, 9], &[]), Some((0, 3)));
        assert_eq!(s.best_source(&[1, 2, 3, 9], &[0]), Some((1, 2)));
        assert_eq!(s.best_source(&[7], &[]), None);
    }

    #[test]
    fn record_truncate_and_copy_track_the_cache() {
        let mut s = KvSlots::new(2, false);
        fill(&mut s, 0, &[1, 2, 3, 4]);
        s.truncate(0, 2);
        s.record(0, 2, 8);
        assert_eq!(s.tokens(0), &[1, 2, 8]);
        s.copy_prefix(0, 1, 2);
        assert_eq!(s.tokens(1), &[1, 2]);
        s.clear_all();
        assert!(s.tokens(0).is_empty() && s.tokens(1).is_empty());
    }
}
