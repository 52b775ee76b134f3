//! The output of a choice that may still be a tool call, held back from the client while the
//! model decides (see `answer_gate`).

use crate::request::TokenLogprob;

/// Held output beyond this many tokens without a committed call is an answer.
pub(crate) const MOST_HELD: u32 = 64;

/// The output of a choice that may still be a call, held back.
pub(crate) struct Held {
    /// The token whose logits gave the first held token, and its position: the answer restarts
    /// by feeding it again.
    pub anchor: (i32, i32),
    pub tokens: u32,
    pub deltas: Vec<(String, Vec<TokenLogprob>)>,
}
