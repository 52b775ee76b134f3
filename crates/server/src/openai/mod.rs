//! The OpenAI-compatible API (`/v1`): key authentication, chat completions (streamed or
//! collected), completions, embeddings, tool calls, images, rate-limit headers and the model
//! list.

#[cfg(test)]
mod admission_tests;
/// Bearer-key authentication, before any body is read.
pub(crate) mod auth;
/// The per-address budget of failed authentications.
pub(crate) mod auth_failures;
/// `POST /v1/chat/completions`.
pub(crate) mod chat;
/// `POST /v1/completions`: raw prompts, fill-in-the-middle, `text_completion` answers.
pub(crate) mod completions;
#[cfg(test)]
mod completions_tests;
/// The engine's usage, logprobs and finish reasons as the API's types.
pub(crate) mod convert;
/// A request's engine events as the typed deltas every dialect's stream renders.
pub(crate) mod deltas;
/// `POST /v1/embeddings`: vectors from an embedding model, metered as prompt tokens.
pub(crate) mod embeddings;
#[cfg(test)]
mod embeddings_tests;
/// Fetching and bounding `image_url` parts.
pub(crate) mod images;
/// `GET /v1/models` and `GET /v1/models/{id}`.
pub(crate) mod models;
/// Bounds how many requests are prepared at once, overall and per key.
pub mod prepare_gate;
/// OpenAI's `x-ratelimit-*` headers.
pub(crate) mod rate_limit;
/// `tools` and `tool_choice`: the grammar and the parsing of tool calls.
pub(crate) mod tool_calls;
