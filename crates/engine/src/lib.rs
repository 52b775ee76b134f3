//! Gantry's inference engine: llama.cpp through `llama-cpp-2`, a continuous-batching scheduler on
//! its own thread, chat templates, sampling and stop strings. The server talks to it through
//! [`Engine::submit`], which returns channels; dropping the event receiver cancels the request.
//!
//! The crate's map (docs/architecture.md walks one request through it):
//! - `engine`: the [`Engine`] handle, its config, and the scheduler thread's start and end;
//! - `generator`: the [`Generator`] trait, what the HTTP side sees of an engine;
//! - `request`, `prepare`, `error`: a request as the scheduler takes it, how a chat becomes
//!   one (template, tokens, grammar, limits), and how one fails;
//! - `embedder`: sentence embeddings on an embedding model's own thread (not the scheduler);
//! - `model`: loading a GGUF model and what it brings (backends, devices, chat template, vision
//!   projector, memory estimate, Q5_0 → Q8_0 twins);
//! - `scheduler`: the loop that admits, batches, decodes and samples: its waiting requests
//!   (`queue`), one running request (`request`), the step's stages (`step`), the samplers
//!   (`sample`) and the one way a request ends (`end`);
//! - `kv`: what each sequence's KV cells hold (the mirror of llama.cpp's cells), the host cache of
//!   idle sequences, and the layout of the KV streams;
//! - `speculation`: drafts without a draft model, their verification cost and shared drafts;
//! - `tools`: finding, parsing and streaming tool calls in a model's output;
//! - `constraint`: grammars (JSON schema, tool calls) compiled for a model and cached;
//! - `telemetry`, `faults`, `units`: metrics, test-build fault injection, C integer types.
// Token ids, positions and sizes cross into llama.cpp's C types here: a cast that can truncate says why.
#![cfg_attr(not(test), warn(clippy::cast_possible_truncation))]

pub mod constraint;
mod embedder;
mod engine;
mod error;
mod faults;
mod generator;
mod keyed_hash;
mod kv;
mod model;
mod prepare;
mod request;
mod scheduler;
mod speculation;
mod telemetry;
#[cfg(test)]
mod tests;
mod thinking;
pub mod tools;
mod units;

pub use constraint::{CompiledGrammar, Constraint, PreparedGrammars, GRAMMAR_CACHE_ENTRIES};
pub use embedder::{check_inputs as check_embedding_inputs, EmbedError, Embedder, EmbeddingShape, Embeddings};
pub use engine::{default_threads, Engine, EngineConfig, DEFAULT_HOST_CACHE_MIB};
pub use error::{EngineError, SubmitError};
pub use faults::{fault_injection_armed, fault_injection_compiled, FAULTS_ARMED, FAULTS_ENV};
pub use generator::{Generator, Health};
pub use kv::blocks::{KvBlockEvent, KvEventSink, Medium, KV_EVENT_BLOCK_TOKENS};
pub use kv::cache::StreamCopies;
pub use kv::kv_type::KvType;
pub use kv::layout::KvLayout;
pub use kv::quality::{measure_kv_quality, KvQuality};
pub use model::backend::{cpu_backend_features, cpu_backend_variant, load_cpu_backend};
pub use model::capabilities::{Capabilities, Pooling};
pub use model::devices::{accelerators, gpu_backend_compiled, gpu_backend_present, Accelerator, Offload};
pub use model::dot_kernels::{
    k_quant_copied_types, k_quant_copies_made, k_quant_copies_served, serve_k_quant_copies, small_batch_kernels,
    use_cpu_kernels, weights_repacked, CpuKernels,
};
pub use model::memory::{estimate_memory, MemoryEstimate};
pub use model::raw_prompt::{Fim, FimFile, PromptSource, RawPrompt, RawPromptError};
pub use model::template::TemplateError;
pub use model::vision::{Detail as ImageDetail, ImageError, ImageInput, LOW_DETAIL_SIDE};
pub use model::{cpu_variants, template, LoadError, LoadedModel, ModelInfo};
pub use prepare::{ChatInput, Limits, PrepareError};
pub use request::{
    CacheScope, Event, FinishReason, GenerateRequest, GenerationHandle, LazyTools, Outcome, Owner, Prompt,
    SamplingParams, ServiceTier, TokenLogprob, TopLogprob, Usage,
};
pub use scheduler::request::stop_strings;
pub use scheduler::sample::device::DeviceSampling;
pub use speculation::{Speculate, SpeculationConfig, SpeculationStats};
pub use thinking::{answer_room, Thinking, ThinkingPlan};
