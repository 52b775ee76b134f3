//! Sampling: each choice's [`sampler`] for OpenAI's parameters and logprobs, the exact [`draw`]
//! from a tempered softmax, the step's first tokens sampled in parallel ([`first_tokens`]), and
//! the chains that sample on the device ([`device`]).

pub(crate) mod device;
pub(crate) mod draw;
pub(crate) mod first_tokens;
pub(crate) mod sampler;
