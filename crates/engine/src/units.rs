//! llama.cpp's C integer types for what the engine counts in `usize`. A context window is far
//! below `i32::MAX` cells and a vocabulary below `i32::MAX` tokens (both are C `int`s in
//! llama.cpp), so these conversions cannot fail for a loaded model; they check anyway, and a
//! failure is a bug that panics the one request it happens in.

/// A position, or a length counted in positions, within one context window (`llama_pos`).
pub(crate) fn llama_pos(n: usize) -> i32 {
    i32::try_from(n).expect("a position within a context window fits llama_pos")
}

/// A count of cells or tokens as llama.cpp's and the usage record's `u32`.
pub(crate) fn count_u32(n: usize) -> u32 {
    u32::try_from(n).expect("a count within a context window fits u32")
}

/// The id of the token at `index` in the vocabulary (`llama_token`).
pub(crate) fn token_id(index: usize) -> i32 {
    i32::try_from(index).expect("a vocabulary index fits llama_token")
}
