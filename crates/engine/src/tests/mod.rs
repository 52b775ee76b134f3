//! The engine's tests that run a real (tiny, random-weight) model through the scheduler; unit
//! tests of one module live in that module.

mod answer_gate;
mod cache_scope;
mod deterministic;
mod embedder;
mod endings;
pub(crate) mod engine;
mod grammar_cache;
mod isolation;
mod kv_layout;
mod kv_type;
mod raw_prompt;
mod sampling_engine;
mod sharing;
mod speculation;
mod stalls;
mod thinking;
pub(crate) mod typed_text;
mod vision;
