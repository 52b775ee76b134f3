//! Virtual KV blocks: what each sequence holds, cut into blocks of [`KV_EVENT_BLOCK_TOKENS`]
//! tokens, announced as events for a prefix-aware router (llm-d's KV-cache indexer, fed by the
//! server's `kv_events` publisher).
//!
//! llama.cpp's cache is per sequence, not paged: a sequence holding `n` tokens counts as its
//! first `n / 64` whole blocks (a partial last block is not announced, as in vLLM). Block `i`'s
//! hash chains its parent's hash, its 64 tokens and the cache scope, so two sequences holding the
//! same prefix in one scope hold the same blocks: a block is announced stored when the first
//! sequence gains it and removed when the last one loses it (cut, overwritten, offloaded to host
//! memory, the cache cleared, the engine closing). The host cache's entries (`host_cache`) are
//! holders too, of the same blocks in [`Medium::Cpu`]. The hash is keyed per process
//! (`keyed_hash`): a router treats it as an opaque id and recomputes its own keys from the tokens.
//!
//! Events go to a bounded channel through [`KvEventSink`]: the scheduler thread never waits on
//! it; a full channel drops the event and counts it (`gantry_kv_events_dropped_total`).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::keyed_hash::keyed_hash;
use crate::request::CacheScope;

/// Tokens of one virtual block: what `gantry_kv_cache_info` reports as `block_size`.
pub const KV_EVENT_BLOCK_TOKENS: usize = 64;

/// Where blocks are held, in vLLM's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The engine's KV cache, llama.cpp's cells (on a GPU or in host memory, as built): what a
    /// request reuses at once.
    Gpu,
    /// The host cache of idle sequences (`--cache-ram`): restored into the KV cache on a match.
    Cpu,
}

/// A change to the blocks held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvBlockEvent {
    /// Blocks `hashes`, in order, whose first block follows `parent` (`None`: it starts the
    /// sequence), now held in `medium`; `tokens` are theirs, `KV_EVENT_BLOCK_TOKENS` per block.
    Stored { hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<i32>, scope: CacheScope, medium: Medium },
    /// Blocks nothing holds in `medium` any more.
    Removed { hashes: Vec<u64>, medium: Medium },
    /// Every block of the server is gone: what a publisher says as it starts, for a router that
    /// still indexes an earlier run. Engines announce each block they drop instead.
    AllCleared,
}

/// Where an engine sends its [`KvBlockEvent`]s, each with the model it serves.
#[derive(Debug, Clone)]
pub struct KvEventSink {
    tx: mpsc::Sender<(Arc<str>, KvBlockEvent)>,
    model: Arc<str>,
}

impl KvEventSink {
    pub fn new(tx: mpsc::Sender<(Arc<str>, KvBlockEvent)>, model: &str) -> Self {
        Self { tx, model: model.into() }
    }

    /// Hands `event` on without waiting: a full channel (a publisher far behind) drops it.
    fn send(&self, event: KvBlockEvent) {
        if self.tx.try_send((self.model.clone(), event)).is_err() {
            metrics::counter!("gantry_kv_events_dropped_total", "model" => self.model.to_string()).increment(1);
        }
    }
}

/// The blocks each holder (a sequence, a host cache entry) holds in one medium, and how many
/// holders hold each block.
#[derive(Debug)]
pub(crate) struct BlockTable {
    held: HashMap<u64, Vec<u64>>,
    holders: HashMap<u64, u32>,
    medium: Medium,
    sink: KvEventSink,
}

/// The hash of the block of `tokens` that follows `parent` in `scope`: never 0, which the
/// indexer reads as "no parent".
pub(crate) fn block_hash(parent: Option<u64>, tokens: &[i32], scope: CacheScope) -> u64 {
    keyed_hash((parent, tokens, scope)).max(1)
}

/// The chained hashes of the whole blocks of `tokens` in `scope`.
pub(crate) fn chain(tokens: &[i32], scope: CacheScope) -> Vec<u64> {
    let mut parent = None;
    tokens
        .chunks_exact(KV_EVENT_BLOCK_TOKENS)
        .map(|block| {
            let hash = block_hash(parent, block, scope);
            parent = Some(hash);
            hash
        })
        .collect()
}

impl BlockTable {
    pub(crate) fn new(medium: Medium, sink: KvEventSink) -> Self {
        Self { held: HashMap::new(), holders: HashMap::new(), medium, sink }
    }

    fn blocks(&mut self, holder: u64) -> &mut Vec<u64> {
        self.held.entry(holder).or_default()
    }

    /// `holder`, holding `tokens` in `scope`, just had the token at `tokens.len() - 1` written
    /// (after a cut to that position, if any): it may complete a block.
    pub(crate) fn recorded(&mut self, holder: u64, tokens: &[i32], scope: CacheScope) {
        let len = tokens.len();
        self.truncate(holder, len - 1);
        if len.is_multiple_of(KV_EVENT_BLOCK_TOKENS) {
            let blocks = self.blocks(holder);
            let (from, parent) = (blocks.len(), blocks.last().copied());
            let hash = block_hash(parent, &tokens[len - KV_EVENT_BLOCK_TOKENS..], scope);
            self.replace_tail(holder, from, vec![hash], tokens, scope);
        }
    }

    /// `holder` now holds only its first `len` tokens (none: it is gone).
    pub(crate) fn truncate(&mut self, holder: u64, len: usize) {
        let keep = len / KV_EVENT_BLOCK_TOKENS;
        if self.held.get(&holder).is_some_and(|blocks| blocks.len() > keep) {
            self.replace_tail(holder, keep, Vec::new(), &[], CacheScope::default());
        }
        if len == 0 {
            self.held.remove(&holder);
        }
    }

    /// `holder` now holds `tokens` in `scope`, whatever it held before (a restore, a copy).
    pub(crate) fn set(&mut self, holder: u64, tokens: &[i32], scope: CacheScope) {
        let hashes = chain(tokens, scope);
        let common = self.blocks(holder).iter().zip(&hashes).take_while(|(a, b)| a == b).count();
        self.replace_tail(holder, common, hashes[common..].to_vec(), tokens, scope);
    }

    /// Every holder is empty: each block held is announced removed (only this engine's and
    /// this medium's, where a router's "all cleared" would wipe the whole server's).
    pub(crate) fn clear_all(&mut self) {
        self.held.clear();
        let gone: Vec<u64> = self.holders.drain().map(|(hash, _)| hash).collect();
        if !gone.is_empty() {
            self.sink.send(KvBlockEvent::Removed { hashes: gone, medium: self.medium });
        }
    }

    /// Replaces the blocks of `holder` from block `from` on by `added` (blocks of `tokens` in
    /// `scope`), announcing the blocks gained, then the ones lost.
    fn replace_tail(&mut self, holder: u64, from: usize, added: Vec<u64>, tokens: &[i32], scope: CacheScope) {
        let removed = self.blocks(holder).split_off(from);
        let mut run: Option<(usize, Vec<u64>)> = None;
        for (i, &hash) in added.iter().enumerate() {
            let holders = self.holders.entry(hash).or_insert(0);
            *holders += 1;
            if *holders == 1 {
                run.get_or_insert_with(|| (from + i, Vec::new())).1.push(hash);
            } else if let Some(run) = run.take() {
                self.announce_stored(holder, run, tokens, scope);
            }
            self.blocks(holder).push(hash);
        }
        if let Some(run) = run {
            self.announce_stored(holder, run, tokens, scope);
        }
        let gone: Vec<u64> = removed.into_iter().filter(|hash| self.release(*hash)).collect();
        if !gone.is_empty() {
            self.sink.send(KvBlockEvent::Removed { hashes: gone, medium: self.medium });
        }
    }

    /// Announces blocks `first..` of `holder` (`hashes`, already in its list) as stored.
    fn announce_stored(&self, holder: u64, (first, hashes): (usize, Vec<u64>), tokens: &[i32], scope: CacheScope) {
        let parent = first.checked_sub(1).map(|i| self.held[&holder][i]);
        let span = first * KV_EVENT_BLOCK_TOKENS..(first + hashes.len()) * KV_EVENT_BLOCK_TOKENS;
        let tokens = tokens[span].to_vec();
        self.sink.send(KvBlockEvent::Stored { hashes, parent, tokens, scope, medium: self.medium });
    }

    /// One holder of `hash` fewer; whether none is left.
    fn release(&mut self, hash: u64) -> bool {
        match self.holders.get_mut(&hash) {
            Some(1) => {
                self.holders.remove(&hash);
                true
            }
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        }
    }
}

impl Drop for BlockTable {
    /// The engine is closing (unloaded, or its thread ended): its blocks go, and only its own,
    /// where another model of the same server keeps its blocks.
    fn drop(&mut self) {
        self.clear_all();
    }
}

#[cfg(test)]
#[path = "blocks_tests.rs"]
mod tests;
