//! The one owner of the KV cache: every change to llama.cpp's cells outside a decode (clear, copy,
//! state get and set) goes through a method here, which changes the mirror of what each sequence
//! holds (`KvSlots`) in the same call. A decode (or an image's evaluation) writes cells itself;
//! the scheduler tells the mirror with [`KvCache::record`] as it plans each row.
//!
//! Invariant: for every sequence, the cells hold positions `0..len` and the mirror holds `len`
//! tokens ([`KvCache::check_mirror`] in the tests; `kv/cache_tests.rs` checks it after every
//! method on the tiny model, in both layouts).
//!
//! Thread rule: the scheduler thread, which owns the context, calls every method.

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;

use crate::kv::host_cache::HostCache;
use crate::kv::layout::KvLayout;
use crate::kv::seq_id::SeqId;
use crate::kv::slots::KvSlots;
use crate::request::CacheScope;
use crate::units::count_u32;

pub(crate) struct KvCache {
    slots: KvSlots,
    /// Idle sequences' KV entries, out of the KV cache (see `host_cache`).
    host: HostCache<SeqState>,
    layout: KvLayout,
    copies: StreamCopies,
    pending: PendingCopies,
}

/// How KV entries are copied from one stream into another (per-sequence layout): a running
/// sequence moved down into a gap (`scheduler/step/compact.rs`), a cached prefix shared with a new
/// request, a prompt spread to a request's other choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamCopies {
    /// Through host memory (`state_seq_get`, `state_seq_set`): only the cells in use travel,
    /// a small copy for a CPU's memory, where the KV cache lives.
    #[default]
    ThroughHost,
    /// llama.cpp copies the source stream's whole buffer into the destination's, on the device,
    /// at the next decode (`llama_memory_seq_cp` across streams): on a GPU tens of microseconds
    /// for tens of MB, where the trip through host memory took a synchronous transfer per layer
    /// and tensor each way, milliseconds a copy.
    OnDevice,
}

/// The sequences that copies on the device, queued since the last decode, read or fill. Until a
/// decode runs them, the state API must not read a sequence a copy is to fill (its buffer is
/// stale) nor write one a copy is to read or fill (the copy would carry or overwrite the write):
/// a save of one is skipped, a restore into one refused (the prompt is computed instead). Copies
/// between streams all go on the device then, so no host copy meets a pending one.
#[derive(Debug, Default)]
struct PendingCopies {
    sources: Vec<SeqId>,
    targets: Vec<SeqId>,
}

impl PendingCopies {
    fn readable(&self, seq: SeqId) -> bool {
        !self.targets.contains(&seq)
    }

    fn writable(&self, seq: SeqId) -> bool {
        self.readable(seq) && !self.sources.contains(&seq)
    }
}

impl KvCache {
    pub(crate) fn new(n_seqs: usize, layout: KvLayout, host_bytes: usize) -> Self {
        // Per sequence, the lowest free sequence keeps running ones in one ubatch (`layout`).
        let slots = KvSlots::new(n_seqs, layout == KvLayout::PerSequence);
        Self {
            slots,
            host: HostCache::new(host_bytes),
            layout,
            copies: StreamCopies::default(),
            pending: PendingCopies::default(),
        }
    }

    /// A decode ran to its end: llama.cpp made the copies on the device that were queued.
    pub(crate) fn decoded(&mut self) {
        self.pending = PendingCopies::default();
    }

    /// Announces the virtual blocks the sequences gain and lose to `sink` (see `kv::blocks`).
    pub(crate) fn with_events(self, sink: Option<crate::kv::blocks::KvEventSink>) -> Self {
        Self { slots: self.slots.with_events(sink.clone()), host: self.host.with_events(sink), ..self }
    }

    /// Copies between streams as `copies` says (see [`StreamCopies`]).
    pub(crate) fn with_copies(self, copies: StreamCopies) -> Self {
        Self { copies, ..self }
    }

    /// What each sequence holds, and which idle one a prompt should take.
    pub(crate) fn slots(&self) -> &KvSlots {
        &self.slots
    }

    pub(crate) fn host_enabled(&self) -> bool {
        self.host.enabled()
    }

    /// Bytes and entries held in host memory.
    pub(crate) fn host_usage(&self) -> (usize, usize) {
        (self.host.bytes(), self.host.len())
    }

    /// A decode (or an image) wrote `token` at `pos` of `seq`.
    pub(crate) fn record(&mut self, seq: SeqId, pos: usize, token: i32) {
        self.slots.record(seq, pos, token);
    }

    /// Marks `seq` as just used, for least-recently-used eviction.
    pub(crate) fn touch(&mut self, seq: SeqId) {
        self.slots.touch(seq);
    }

    /// A request of `scope` takes `seq` and reuses its first `keep` entries: what it held beyond
    /// them goes to host memory first, then its cells from `keep` on are freed.
    pub(crate) fn take(&mut self, ctx: &mut LlamaContext<'_>, seq: SeqId, scope: CacheScope, keep: usize) {
        if self.slots.tokens(seq).len() > keep {
            self.save(ctx, seq);
        }
        self.cut(ctx, seq, keep);
        self.slots.claim(seq, scope);
        self.slots.touch(seq);
    }

    /// Drops the entries of `seq` from position `len` on: drafts that were not accepted, an
    /// image that failed half-way, a request that ended in a panic (`len` 0).
    pub(crate) fn cut(&mut self, ctx: &mut LlamaContext<'_>, seq: SeqId, len: usize) {
        if self.slots.tokens(seq).len() > len {
            let _ = ctx.clear_kv_cache_seq(Some(seq.as_u32()), Some(count_u32(len)), None);
            self.slots.truncate(seq, len);
        }
    }

    /// Every sequence empty (after a failed decode, whose cells llama.cpp may have left in any
    /// state).
    pub(crate) fn clear_all(&mut self, ctx: &mut LlamaContext<'_>) {
        ctx.clear_kv_cache();
        self.slots.clear_all();
    }

    /// Makes every sequence of `dsts` hold the first `len` entries of `src`, and nothing else:
    /// a shared prefix, or a prompt spread to a request's other choices. On failure (which
    /// leaves them empty) says why.
    pub(crate) fn share(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        src: SeqId,
        dsts: &[SeqId],
        len: usize,
    ) -> Result<(), String> {
        let dsts: Vec<SeqId> = dsts.iter().copied().filter(|&d| d != src).collect();
        let copied = self.copy_cells(ctx, src, &dsts, len);
        for &dst in &dsts {
            match copied {
                Ok(()) => self.slots.copy_prefix(src, dst, len),
                Err(_) => self.slots.truncate(dst, 0),
            }
        }
        copied
    }

    fn copy_cells(&mut self, ctx: &mut LlamaContext<'_>, src: SeqId, dsts: &[SeqId], len: usize) -> Result<(), String> {
        let clear = |ctx: &mut LlamaContext<'_>| {
            for &dst in dsts {
                let _ = ctx.clear_kv_cache_seq(Some(dst.as_u32()), None, None);
            }
        };
        clear(ctx);
        if len == 0 || dsts.is_empty() {
            return Ok(());
        }
        let copied = match (self.layout, self.copies) {
            (KvLayout::Unified, _) => dsts.iter().try_for_each(|&dst| {
                ctx.copy_kv_cache_seq(src.raw(), dst.raw(), Some(0), Some(count_u32(len))).map_err(|e| e.to_string())
            }),
            // llama.cpp copies between streams only whole buffers (the cells past `len` are cut
            // from the copy at once), at the next decode: see `PendingCopies`. Chained copies
            // (into a sequence, then out of it) run in the order they were asked.
            (KvLayout::PerSequence, StreamCopies::OnDevice) => {
                let copied = dsts.iter().try_for_each(|&dst| {
                    ctx.copy_kv_cache_seq(src.raw(), dst.raw(), None, None).map_err(|e| e.to_string())?;
                    let _ = ctx.clear_kv_cache_seq(Some(dst.as_u32()), Some(count_u32(len)), None);
                    Ok::<(), String>(())
                });
                self.pending.sources.push(src);
                self.pending.targets.extend_from_slice(dsts);
                copied
            }
            // A state copy is immediate and moves only the cells in use.
            (KvLayout::PerSequence, StreamCopies::ThroughHost) => {
                ctx.state_seq_get(src.raw(), LlamaStateSeqFlags::empty()).map_err(|e| e.to_string()).and_then(|state| {
                    dsts.iter().try_for_each(|&dst| {
                        ctx.state_seq_set(&state, dst.raw()).map_err(|e| e.to_string())?;
                        let _ = ctx.clear_kv_cache_seq(Some(dst.as_u32()), Some(count_u32(len)), None);
                        Ok(())
                    })
                })
            }
        };
        if copied.is_err() {
            clear(ctx);
        }
        copied
    }

    /// Moves sequence `src`'s entries into the empty sequence `dst` and leaves `src` empty, so the
    /// scheduler can close a gap in the running sequences' ids (`scheduler::step::compact`). On failure
    /// nothing moved.
    pub(crate) fn relocate(&mut self, ctx: &mut LlamaContext<'_>, src: SeqId, dst: SeqId) -> Result<(), String> {
        debug_assert!(self.slots.tokens(dst).is_empty(), "a sequence is moved into an empty one only");
        let len = self.slots.tokens(src).len();
        self.share(ctx, src, &[dst], len)?;
        self.slots.touch(dst);
        self.cut(ctx, src, 0);
        Ok(())
    }

    /// Moves idle sequence `seq`'s entries to host memory and frees its cells.
    pub(crate) fn offload(&mut self, ctx: &mut LlamaContext<'_>, seq: SeqId) {
        self.save(ctx, seq);
        self.cut(ctx, seq, 0);
    }

    /// Copies into `seq` the host entry of `scope` sharing the longest prefix with `prompt`, if
    /// that beats `at_least` tokens, cut to the shared part. Returns the positions `seq` now
    /// holds; on failure `seq` is empty and the entry dropped.
    pub(crate) fn restore(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        seq: SeqId,
        scope: CacheScope,
        prompt: &[i32],
        at_least: usize,
    ) -> Option<usize> {
        if !self.pending.writable(seq) {
            return None;
        }
        let (tokens, state, len) = self.host.best(scope, prompt, at_least)?;
        let tokens = tokens.to_vec();
        if let Err(e) = ctx.state_seq_set(state, seq.raw()) {
            // Not enough free cells, or a state this context cannot read: recompute instead.
            tracing::warn!(error = %e, seq = seq.raw(), tokens = tokens.len(), "could not restore cached KV entries");
            let _ = ctx.clear_kv_cache_seq(Some(seq.as_u32()), None, None);
            self.slots.truncate(seq, 0);
            self.host.remove(scope, &tokens);
            return None;
        }
        let _ = ctx.clear_kv_cache_seq(Some(seq.as_u32()), Some(count_u32(len)), None);
        self.slots.set(seq, scope, &tokens[..len]);
        Some(len)
    }

    /// Copies `seq`'s entries into host memory (unless an entry there holds them already).
    fn save(&mut self, ctx: &LlamaContext<'_>, seq: SeqId) {
        let (scope, tokens) = (self.slots.scope(seq), self.slots.tokens(seq));
        let unreadable = !self.pending.readable(seq);
        if !self.host.enabled() || tokens.is_empty() || unreadable || self.host.covers(scope, tokens) {
            return;
        }
        match ctx.state_seq_get(seq.raw(), LlamaStateSeqFlags::empty()) {
            Ok(state) => {
                let bytes = state.byte_len();
                self.host.insert(scope, tokens.to_vec(), state, bytes);
            }
            Err(e) => {
                tracing::warn!(error = %e, seq = seq.raw(), "could not copy a sequence's KV entries to host memory")
            }
        }
    }

    /// Whether llama.cpp's cells and the mirror agree for every sequence: the cells of a
    /// sequence holding `len` tokens span positions `0..len` (none when empty).
    #[cfg(test)]
    pub(crate) fn check_mirror(&self, ctx: &LlamaContext<'_>, n_seqs: usize) -> Result<(), String> {
        for seq in (0..n_seqs).map(SeqId::new) {
            let len = crate::units::llama_pos(self.slots.tokens(seq).len());
            let (min, max) = (ctx.kv_cache_seq_pos_min(seq.raw()), ctx.kv_cache_seq_pos_max(seq.raw()));
            let expected = if len == 0 { (-1, -1) } else { (0, len - 1) };
            if (min, max) != expected {
                return Err(format!("seq {seq}: cells span {min}..={max}, the mirror holds {len} tokens"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
