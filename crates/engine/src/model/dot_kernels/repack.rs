//! Whether ggml copies weights into its repacked layouts at load (its CPU "extra" buffer type).
//!
//! On x86 ggml repacks Q4_0, Q4_K, IQ4_NL and MXFP4 weights (and with AVX-512 Q2_K) into 8-row
//! interleaved copies that its own kernels multiply with one or four activation rows at a time.
//! Gantry's AVX-512 kernels take Q4_K weights as the GGUF lays them out: ggml then hands one
//! activation row to the table's `vec_dot` (Gantry's), two to 33 to `llamafile_sgemm`
//! (Gantry's `small_batches`; `tiled` declines them for ggml's tiled K-quant kernel), and more to
//! that tiled kernel (or, where the 16-row copies serve, to `small_batches` too). Measured on
//! qwen2.5-coder-1.5b Q4_K_M (2-core Xeon, AVX-512): ggml's repacked one-row kernel streams the
//! weights at about 19 GB/s where Gantry's Q6_K one reaches 33.
//!
//! But the choice is the whole process's, and a weight of a type only ggml's repacked kernels
//! serve (IQ4_NL, say) would lose them: so the copies are skipped only where every model the
//! server may load holds no such weight ([`costs_nothing`], from the models' GGUF headers).
//!
//! ggml builds its list of extra buffer types once, from `ggml_backend_cpu_repack_buffer_type` (a
//! C++ function: its symbol is the Itanium-mangled `_Z35ggml_backend_cpu_repack_buffer_typev`);
//! where its CPU backend is linked in (`ggml_cpu_static`), the linker's `--wrap` sends that call
//! here, which answers no buffer type once [`skip`] was called. That must happen before the first
//! model is loaded (`use_cpu_kernels` runs first). The portable build, which loads its backend at
//! run time, keeps ggml's copies.
#![allow(unsafe_code, reason = "stands in for a ggml C function")]

use std::os::raw::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use llama_cpp_sys_2::{ggml_type, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4, GGML_TYPE_Q2_K, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K};

/// The weight types ggml's repacking copies on x86 (`ggml_repack_get_optimal_repack_type` in
/// its repack.cpp): Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K with AVX-512. ggml copies only
/// matrices of a multiple of 8 rows; every matrix is counted here, which errs towards copying.
const REPACKED: [ggml_type; 5] = [GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4, GGML_TYPE_Q2_K];

/// Whether skipping ggml's repacked copies loses nothing: no weight of `types` is of a type
/// ggml would copy that is not also `served` by Gantry's kernels.
pub(super) fn costs_nothing(served: &[ggml_type], types: &[ggml_type]) -> bool {
    types.iter().all(|ty| !REPACKED.contains(ty) || served.contains(ty))
}

/// The tensor types of every model in `models`, from their GGUF headers; `None` where one cannot
/// be read (the load will say why).
pub(super) fn tensor_types(models: &[&Path]) -> Option<Vec<ggml_type>> {
    let mut types = Vec::new();
    for model in models {
        let header = crate::model::gguf_header::Header::open(model)?;
        for id in 0..header.n_tensors() {
            let ty = header.tensor_type(id);
            if !types.contains(&ty) {
                types.push(ty);
            }
        }
    }
    Some(types)
}

/// Set once Gantry's kernels take every repacked type of the models unpacked.
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

#[cfg(test)]
mod tests {
    use super::*;
    use llama_cpp_sys_2::{
        GGML_TYPE_F32, GGML_TYPE_IQ4_XS, GGML_TYPE_Q5_0, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0,
    };

    const V4: [ggml_type; 7] = [
        GGML_TYPE_Q8_0,
        GGML_TYPE_Q5_0,
        GGML_TYPE_Q4_0,
        GGML_TYPE_Q4_K,
        GGML_TYPE_Q5_K,
        GGML_TYPE_Q6_K,
        GGML_TYPE_IQ4_XS,
    ];
    const V3: [ggml_type; 2] = [GGML_TYPE_Q8_0, GGML_TYPE_Q5_0];

    #[test]
    fn repacking_is_skipped_only_where_gantry_serves_every_type_ggml_would_copy() {
        let q4_k_m = [GGML_TYPE_F32, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0];
        assert!(costs_nothing(&V4, &q4_k_m), "Gantry's AVX-512 kernels serve a Q4_K_M model");
        let q5_k_m = [GGML_TYPE_F32, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0];
        assert!(costs_nothing(&V3, &q5_k_m), "ggml copies no Q5_K_M weight on x86");
        let iq4_xs = [GGML_TYPE_F32, GGML_TYPE_IQ4_XS, GGML_TYPE_Q6_K];
        assert!(costs_nothing(&V3, &iq4_xs), "ggml copies no IQ4_XS weight on x86");
        assert!(costs_nothing(&V4, &[GGML_TYPE_F32, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K]), "AVX-512 serves Q4_0");
        assert!(!costs_nothing(&V3, &[GGML_TYPE_F32, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K]), "AVX2 leaves Q4_0 repacked");
        use super::super::install::Level;
        assert_eq!(Level::V4.serves_without_repacking(), V4, "the levels' own lists");
        assert_eq!(Level::V3.serves_without_repacking(), V3, "the levels' own lists");
        assert_eq!(Level::AvxVnni.serves_without_repacking(), V3, "AVX-VNNI serves what AVX2 does");
        assert!(!costs_nothing(&V3, &q4_k_m), "with AVX2 ggml's repacked Q4_K kernels serve");
        assert!(!costs_nothing(&V4, &[GGML_TYPE_Q4_0, GGML_TYPE_IQ4_NL]), "no one but ggml serves IQ4_NL");
        assert!(!costs_nothing(&V4, &[GGML_TYPE_MXFP4]));
        assert!(!costs_nothing(&V4, &[GGML_TYPE_Q2_K, GGML_TYPE_Q4_K]));
        // Types ggml never copies on x86 cost nothing either way.
        assert!(costs_nothing(&V3, &[GGML_TYPE_F32, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K]));
        assert!(costs_nothing(&[], &[]));
    }
}
