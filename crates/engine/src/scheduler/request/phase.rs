//! Where a running request is, as one value: reading its prompt, waiting to copy part of it
//! from another sequence, decoding, finished. What depends on it is a `match` on [`Phase`].

use crate::kv::seq_id::SeqId;
use crate::scheduler::request::ActiveRequest;

/// Where a running request is. Its choices' own states (a token to feed, rows to sample, a finish
/// reason) live in each `Choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reading its prompt: the first `read` tokens are in its first sequence's cache.
    Prefilling { read: usize },
    /// Waiting to copy the first `len` tokens of its prompt from sequence `from`, which holds or
    /// is computing them (`copy_awaited_prefixes`); `read` of its own are in the cache meanwhile.
    AwaitingPrefix { from: SeqId, len: usize, read: usize },
    /// Its prompt is read: each choice decodes until it finishes.
    Decoding,
    /// Every choice finished: it ends at the step's end (`retire_finished`).
    Finished,
}

impl ActiveRequest {
    /// Prompt tokens in its first sequence's cache: a reused prefix, images and chunks read so
    /// far; the whole prompt once it decodes.
    pub(crate) fn read(&self) -> usize {
        match self.phase {
            Phase::Prefilling { read } | Phase::AwaitingPrefix { read, .. } => read,
            Phase::Decoding | Phase::Finished => self.prompt.len(),
        }
    }

    /// The prompt is in the cache up to `read`: it goes on reading, or decodes once all is read.
    pub(crate) fn set_read(&mut self, read: usize) {
        self.phase = if read < self.prompt.len() { Phase::Prefilling { read } } else { Phase::Decoding };
    }

    /// Waits to copy the first `len` prompt tokens from `from`, which holds or computes them.
    pub(crate) fn await_prefix(&mut self, from: SeqId, len: usize) {
        self.phase = Phase::AwaitingPrefix { from, len, read: self.read() };
    }

    /// The sequence and length of the prefix it waits to copy, if it waits for one.
    pub(crate) fn awaited_prefix(&self) -> Option<(SeqId, usize)> {
        match self.phase {
            Phase::AwaitingPrefix { from, len, .. } => Some((from, len)),
            _ => None,
        }
    }

    /// Reading its prompt, or waiting for part of it from another sequence.
    pub(crate) fn is_prefilling(&self) -> bool {
        matches!(self.phase, Phase::Prefilling { .. } | Phase::AwaitingPrefix { .. })
    }

    /// Every choice finished (`finish_choice` moves it there).
    pub(crate) fn all_finished(&self) -> bool {
        self.phase == Phase::Finished
    }
}
