//! Gantry's server: the `gantry` binary's HTTP API, its operator side and its command line.
//! The engine (`gantry-engine`), the accounts (`gantry-accounts`) and the API types
//! (`gantry-api`) meet here, and only here.

#[cfg(test)]
mod accept_loop_tests;
/// The operator's side: `/admin/v1` (keys, usage, models, stats) and the web console.
mod admin;
/// Anthropic's Messages API, translated onto the chat path.
mod anthropic;
/// OpenAI's Files and Batch APIs: a key's files of requests, run on idle capacity.
pub mod batches;
/// Request bodies read only after authentication, and within a deadline.
mod body_guard;
/// The `gantry` command line: flags, `gantry serve`, and the keys, usage and models commands.
pub mod cli;
/// Who a client is for the per-address limits: address groups, trusted proxies.
pub mod client_addr;
/// Wall-clock time as the API and the ledger write it.
mod clock;
#[cfg(test)]
mod connection_tests;
/// The accept loop: header read timeout, connection caps, connection age, peer addresses.
pub mod connections;
/// Cross-origin access to the API for browser clients.
mod cors;
/// Which status and OpenAI error every failure gets, in one place.
mod errors;
/// Liveness and readiness probes.
pub mod health;
/// llama.cpp's `/infill`: a fill-in-the-middle request answered in llama-server's shape.
mod infill;
/// KV-cache events for a prefix-aware router (`--kv-events-endpoint`).
pub mod kv_events;
/// The model catalogue and its downloader (`gantry models pull`).
pub mod models;
/// The OpenAI-compatible API (`/v1`): authentication, chat, tool calls, images, the model list.
pub mod openai;
/// One request's path, whatever its dialect: admission, engine, settlement.
mod pipeline;
/// The models served, loaded on demand within a memory budget.
pub mod pool;
/// Prices per model and service tier (`--price`).
pub mod prices;
/// `POST /v1/chat/completions/render`, `/v1/completions/render`: a request's token ids, unrun.
mod render;
/// The server's id for every request, and the client's `x-request-id`.
mod request_id;
/// `POST /v1/rerank`, `/rerank`: a cross-encoder's scores for (query, document) pairs.
mod rerank;
/// What stored responses may take of the disk: per response, per key, and the free space floor.
pub mod response_storage;
/// OpenAI's Responses API, translated onto the chat path.
mod responses;
/// The router: which routes each listener serves, behind the layers they share.
pub mod router;
#[cfg(test)]
mod router_tests;
/// Several prompts of one request: their engine jobs joined into one answer and one settlement.
mod several_prompts;
/// The state every handler shares ([`state::AppState`]).
pub mod state;
/// `/metrics` (Prometheus) and the per-route request counters.
mod telemetry;
/// `/tokenize` and `/detokenize`, in llama-server's and vLLM's shapes.
mod tokenize;
/// A connection's writes that make no progress end it (`--write-timeout`).
mod write_deadline;
