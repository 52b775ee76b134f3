//! How often llama.cpp reused the previous step's compute graph instead of building a new one
//! (`gantry_decode_graphs_reused_total`). llama.cpp reuses it only when a ubatch has the
//! previous one's shape: the same rows, sequences (the very same ids, for the per-sequence KV
//! layout), outputs and device samplers, and a KV length in the same 256-cell band. A reused
//! graph skips building the graph and allocating it on the host, and on CUDA it replays the
//! captured CUDA graph instead of launching every kernel: at many streams on a GPU that host
//! work is most of a step (docs/benchmarks-gpu.md).
//!
//! Thread rule: read on the scheduler thread, which owns the context.
#![allow(unsafe_code, reason = "llama-cpp-2's timings do not expose llama.cpp's reuse count")]

use std::ptr::NonNull;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_sys_2 as sys;

use crate::scheduler::sample::device::raw_context;

/// Reads llama.cpp's running count of reused graphs, a step at a time.
pub(crate) struct GraphReuse {
    ctx: NonNull<sys::llama_context>,
    seen: i32,
}

impl GraphReuse {
    /// `None` when the context's handle cannot be had (see `raw_context`).
    pub(crate) fn new(ctx: &LlamaContext<'_>) -> Option<Self> {
        let ctx = raw_context(ctx)?;
        // SAFETY: the handle is the live context's own (checked by `raw_context`).
        let seen = unsafe { sys::llama_perf_context(ctx.as_ptr()) }.n_reused;
        Some(Self { ctx, seen })
    }

    /// Graphs reused since the last call: one per ubatch that found the previous graph fit.
    /// Must be called on the thread that decodes, with the context this was made from alive.
    pub(crate) fn since_last(&mut self) -> u64 {
        // SAFETY: as in `new`; the scheduler holding this is dropped before its context.
        let now = unsafe { sys::llama_perf_context(self.ctx.as_ptr()) }.n_reused;
        let reused = now.saturating_sub(self.seen);
        self.seen = now;
        u64::try_from(reused).unwrap_or(0)
    }
}
