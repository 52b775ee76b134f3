//! Speculative decoding without a draft model: prompt lookup, and jump-forward under a grammar.
//!
//! Code edits, quotes and structured answers repeat long runs of tokens that are already in the
//! prompt or earlier in the output. For each decoding choice the drafter looks for the longest
//! earlier occurrence of the output's last tokens and proposes the tokens that followed it. The
//! scheduler feeds the choice's token plus the draft at consecutive positions of the same batch as
//! every other sequence, then walks them: at each position it samples with the choice's own
//! sampler and keeps the draft token only if the sampled token is the same one. Every produced
//! token is therefore sampled from exactly the distribution (and with the same single random
//! draw) that decoding one token at a time would use: the output follows the same distribution,
//! and at temperature 0 it is the same text up to floating-point rounding; only the number of
//! decode steps changes. Seeded sampling decodes one token at a time (`for_request`).
//!
//! Verifying k draft tokens is not free on a CPU (a batch of k+1 tokens costs more than one, by
//! how much depends on the CPU and the model), so drafting weighs cost against gain each step: each
//! choice estimates how likely its draft tokens are to be accepted, the scheduler measures what
//! each extra position in a step costs (`step_cost`), and a draft is fed only as far as it is
//! expected to produce more tokens per second than not drafting. Nobody drafts once enough
//! sequences are decoding that the batch is compute-bound.
//!
//! Under a grammar (a JSON schema, a tool call) the drafter first asks what the grammar forces
//! next: keys, punctuation and enum tails allow one tokenization only, so the sampler could pick
//! nothing else and those drafts are always accepted, at any load (jump-forward, verified the
//! same way, so constrained output is also unchanged).

mod acceptance;
mod chain;
mod config;
mod drafter;
pub(crate) mod json_layout;
pub(crate) mod shared_drafts;
pub(crate) mod step_cost;
#[cfg(test)]
mod tests;

pub(crate) use acceptance::{AcceptanceByKind, AcceptanceKind};
#[cfg(test)]
pub(crate) use chain::DraftSource;
pub(crate) use chain::{Chain, Lookup};
pub(crate) use config::{describe, MAX_DRAFTING_STREAMS};
pub use config::{Speculate, SpeculationConfig, SpeculationStats};
pub(crate) use drafter::Drafter;
