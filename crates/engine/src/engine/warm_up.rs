//! What an engine does once at start, before it reports ready: one decode of a few rows, so that
//! the K-quant copies (`model::dot_kernels::k_quant_copies`) are made now rather than while the
//! first requests wait.

use std::path::Path;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

/// Rows of the warm-up decode: any count up to a ubatch makes the copies (they serve 1 to 512
/// rows); a few, so that the step itself is quick.
const ROWS: i32 = 16;

/// Decodes [`ROWS`] tokens in sequence 0, every row wanting logits (the output layer then
/// multiplies a few rows too), where `model` has matrices to copy; then empties the cache again.
/// A failed decode is logged: the copies are then made at the first product that needs them.
pub(super) fn make_k_quant_copies(ctx: &mut LlamaContext<'_>, model: &Path) {
    if crate::model::dot_kernels::k_quant_copy_bytes(model) == 0 {
        return;
    }
    let started = Instant::now();
    let mut batch = LlamaBatch::new(ROWS as usize, 1);
    for i in 0..ROWS {
        if let Err(e) = batch.add(LlamaToken(i), i, &[0], true) {
            tracing::warn!(error = %e, "no warm-up batch: K-quant copies are made at first use");
            return;
        }
    }
    let decoded = ctx.decode(&mut batch);
    ctx.clear_kv_cache();
    if let Err(e) = decoded {
        tracing::warn!(error = %e, "the warm-up decode failed: K-quant copies are made at first use");
        return;
    }
    let (bytes, matrices) = crate::model::dot_kernels::k_quant_copies_made();
    tracing::info!(
        matrices,
        mib = bytes >> 20,
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "K-quant matrices copied into the 16-row layouts"
    );
}
