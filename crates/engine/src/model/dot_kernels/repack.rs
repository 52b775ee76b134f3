//! Whether ggml copies weights into its repacked layouts at load (its CPU "extra" buffer type).
//!
//! On x86 ggml repacks Q4_K (and Q4_0, IQ4_NL) weights into 8-row interleaved copies that its own
//! kernels multiply with one or four activation rows at a time. Where Gantry's K-quant kernels
//! serve (AVX-512), they take Q4_K weights as the GGUF lays them out, so no copy is made: ggml
//! then hands one activation row to the table's `vec_dot` (Gantry's), two to seven to
//! `llamafile_sgemm` (Gantry's `small_batches`), and eight or more to its tiled K-quant kernel.
//! Measured on qwen2.5-coder-1.5b Q4_K_M (2-core Xeon, AVX-512): ggml's repacked one-row kernel
//! streams the weights at about 19 GB/s where Gantry's Q6_K one reaches 33.
//!
//! ggml builds its list of extra buffer types once, from `ggml_backend_cpu_repack_buffer_type` (a
//! C++ function: its symbol is the Itanium-mangled `_Z35ggml_backend_cpu_repack_buffer_typev`);
//! where its CPU backend is linked in (`ggml_cpu_static`), the linker's `--wrap` sends that call
//! here, which answers no buffer type once [`skip`] was called. That must happen before the first
//! model is loaded (`use_cpu_kernels` runs first). The portable build, which loads its backend at
//! run time, keeps ggml's copies.
#![allow(unsafe_code, reason = "stands in for a ggml C function")]

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set once Gantry's kernels take Q4_K weights unpacked.
static SKIP: AtomicBool = AtomicBool::new(false);
/// How often ggml asked (once per process: it keeps the answer), for tests.
static ASKED: AtomicU64 = AtomicU64::new(0);

/// From now on ggml makes no repacked copies of weights.
pub(super) fn skip() {
    SKIP.store(true, Ordering::Relaxed);
}

/// Whether ggml was told to make no repacked copies.
pub(crate) fn skipped() -> bool {
    SKIP.load(Ordering::Relaxed)
}

/// How often ggml asked for its repacking buffer type since the process started.
#[cfg(test)]
pub(super) fn asked() -> u64 {
    ASKED.load(Ordering::Relaxed)
}

extern "C" {
    /// ggml's `ggml_backend_cpu_repack_buffer_type`, under the name `--wrap` gives it.
    #[link_name = "__real__Z35ggml_backend_cpu_repack_buffer_typev"]
    fn real_repack_buffer_type() -> *mut c_void;
}

/// What ggml's CPU backend calls in place of `ggml_backend_cpu_repack_buffer_type`: null (no
/// repacking) once [`skip`] was called, else ggml's own.
#[export_name = "__wrap__Z35ggml_backend_cpu_repack_buffer_typev"]
extern "C" fn wrapped_repack_buffer_type() -> *mut c_void {
    ASKED.fetch_add(1, Ordering::Relaxed);
    if skipped() {
        return std::ptr::null_mut();
    }
    // SAFETY: ggml's function takes no arguments and returns its static buffer type.
    unsafe { real_repack_buffer_type() }
}
