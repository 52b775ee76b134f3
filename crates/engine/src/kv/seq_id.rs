//! Which llama.cpp sequence: one per parallel slot, `0..parallel`. A type of its own so that a
//! sequence is never confused with a position, a token or a batch row, all `i32` in llama.cpp.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SeqId(i32);

impl SeqId {
    /// The `index`th sequence.
    pub(crate) fn new(index: usize) -> Self {
        Self(crate::units::llama_pos(index))
    }

    /// The id llama.cpp's API takes.
    pub(crate) fn raw(self) -> i32 {
        self.0
    }

    /// The id llama-cpp-2's cache calls take.
    pub(crate) fn as_u32(self) -> u32 {
        u32::try_from(self.0).expect("sequence ids are never negative")
    }

    /// Its slot in per-sequence tables.
    pub(crate) fn index(self) -> usize {
        usize::try_from(self.0).expect("sequence ids are never negative")
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Sequences by number, for tests.
#[cfg(test)]
pub(crate) fn seqs(ids: &[i32]) -> Vec<SeqId> {
    ids.iter().map(|&i| SeqId(i)).collect()
}
