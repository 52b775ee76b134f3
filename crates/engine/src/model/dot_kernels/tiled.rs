//! Which products ggml's tiled K-quant kernel takes.
//!
//! ggml's CPU backend asks its tiled kernel (`ggml_compute_forward_mul_mat_tiled`, tiled.cpp)
//! first for every product of a K-quant or IQ matrix with eight activation rows or more, before
//! `llamafile_sgemm`. It unpacks each weight tile into 8-bit codes and multiplies them with VNNI,
//! which pays over a prompt's hundreds of rows and not over a few decoding streams': on
//! qwen2.5-coder-1.5b Q4_K_M, 2-core Zen 5, 8 streams decoded 56 tok/s where 4 decoded 117, with
//! a third of the time unpacking and another third in OpenMP's barrier. Where Gantry's AVX-512
//! kernels serve the weight type (Q4_K, Q5_K, Q6_K, IQ4_XS), products of fewer than
//! [`TILED_FROM_ROWS`] rows are declined here: ggml then quantizes the activations to Q8_K and
//! calls `llamafile_sgemm`, which `small_batches` answers, as it does for 2 to 7 rows. So are
//! prompts of Q4_K, Q5_K, Q6_K and IQ4_XS matrices whose 16-row copies are served (`k_quant_copies`): the copies
//! are unpacked once, where this kernel unpacks every tile again for each product. Other types
//! keep ggml's choice.
//!
//! Where ggml's CPU backend is linked in (`ggml_cpu_static`), the linker's `--wrap` sends ggml's
//! call here; the portable build, which loads its backend at run time, keeps ggml's choice.
#![allow(unsafe_code, reason = "stands in for a ggml C function and reads its tensors")]

use std::os::raw::c_void;

use llama_cpp_sys_2::{ggml_tensor, ggml_type};

use super::install::Level;
use super::{k_quant_copies, small_batches};

/// The fewest activation rows ggml's tiled K-quant kernel multiplies weights with where
/// Gantry's AVX-512 kernels serve them. Measured on qwen2.5-coder-1.5b Q4_K_M, 2-core Zen 5, a
/// prompt of n tokens in one step (completions, best of 3, ms, Gantry's kernels / tiled): 23
/// rows 126-132 / 152, 33 rows 134-139 / 149, 34 rows 208-217 / 157, 56 rows 331-348 / 202-209,
/// 97 rows 652-675 / 344-347, 380 rows 2,508 / 998.
pub(super) const TILED_FROM_ROWS: i64 = 34;

/// Whether a product of `weights` by `rows` activation rows is left to `small_batches`, with
/// `level`'s kernels serving; `copied`: the weights' 16-row copies serve it.
pub(super) fn declined(level: Option<Level>, weights: ggml_type, rows: i64, copied: bool) -> bool {
    level.is_some_and(|l| {
        copied || l.serves_k_quant(weights) && rows < TILED_FROM_ROWS.min(small_batches::max_columns(Level::V4) + 1)
    })
}

extern "C" {
    /// ggml's `ggml_compute_forward_mul_mat_tiled`, under the name `--wrap` gives it.
    #[link_name = "__real_ggml_compute_forward_mul_mat_tiled"]
    fn real_mul_mat_tiled(params: *const c_void, dst: *mut ggml_tensor) -> bool;
}

/// What ggml's CPU backend calls in place of its tiled kernel: `false` (not computed here: ggml
/// goes on to its stock path) for a product [`declined`], else ggml's own.
///
/// # Safety
/// ggml's contract: `dst` is a matrix product whose two sources are set, `params` the calling
/// thread's.
#[export_name = "__wrap_ggml_compute_forward_mul_mat_tiled"]
unsafe extern "C" fn wrapped_mul_mat_tiled(params: *const c_void, dst: *mut ggml_tensor) -> bool {
    // SAFETY: ggml's product node, with its weights and activations as sources 0 and 1.
    let (weights, m, rows) = unsafe { ((*(*dst).src[0]).type_, (*(*dst).src[0]).ne[1], (*(*dst).src[1]).ne[1]) };
    let level = small_batches::level();
    let copied = k_quant_copies::serves(weights, m, rows);
    if declined(level, weights, rows, copied) {
        return false;
    }
    // SAFETY: the caller's, passed on.
    unsafe { real_mul_mat_tiled(params, dst) }
}

#[cfg(test)]
mod tests {
    use super::super::k_quant_copies_tests::COPIED;
    use super::*;
    use llama_cpp_sys_2::{
        GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
        GGML_TYPE_Q8_0,
    };

    #[test]
    fn only_the_k_quants_gantry_serves_with_avx512_are_declined_below_the_threshold() {
        for ty in [GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS] {
            assert!(declined(Some(Level::V4), ty, 8, false), "a few decoding streams");
            assert!(declined(Some(Level::V4), ty, 33, false));
            assert!(declined(Some(Level::V4), ty, TILED_FROM_ROWS - 1, false));
            assert!(!declined(Some(Level::V4), ty, TILED_FROM_ROWS, false), "a prompt's rows");
            assert!(!declined(Some(Level::V4), ty, 512, false));
            assert!(!declined(Some(Level::V3), ty, 8, false), "Gantry's AVX2 kernels serve no K-quant");
            assert!(!declined(Some(Level::AvxVnni), ty, 8, false), "nor its AVX-VNNI ones");
            assert!(!declined(None, ty, 8, false), "Gantry's kernels not in use");
        }
        for ty in [GGML_TYPE_Q3_K, GGML_TYPE_IQ4_NL, GGML_TYPE_Q8_0] {
            assert!(!declined(Some(Level::V4), ty, 8, false), "ggml's choice for types Gantry does not serve here");
        }
    }

    #[test]
    fn prompts_the_copies_serve_are_declined_at_every_row_count() {
        for ty in COPIED {
            for rows in [2, 33, TILED_FROM_ROWS, 97, 512] {
                assert!(declined(Some(Level::V4), ty, rows, true), "type {ty}, {rows} rows");
                assert!(declined(Some(Level::V3), ty, rows, true), "type {ty}, {rows} rows, AVX2");
                assert!(declined(Some(Level::AvxVnni), ty, rows, true), "type {ty}, {rows} rows, AVX-VNNI");
            }
            assert!(!declined(None, ty, 97, true), "Gantry's kernels not in use");
        }
    }

    #[test]
    fn the_copies_serve_their_types_in_whole_groups_from_one_row_up_to_a_ubatch() {
        k_quant_copies::serve(true);
        for ty in COPIED {
            for rows in [1, 2, 33, TILED_FROM_ROWS, 97, 512] {
                assert!(k_quant_copies::serves(ty, 1536, rows), "type {ty}, {rows} rows");
            }
            assert!(!k_quant_copies::serves(ty, 1536, 0), "no rows");
            assert!(!k_quant_copies::serves(ty, 1536, 513), "past a ubatch of 512");
            assert!(!k_quant_copies::serves(ty, 1544, 97), "not whole groups of 16 rows");
        }
        for ty in [GGML_TYPE_Q3_K, GGML_TYPE_IQ4_NL, GGML_TYPE_Q8_0] {
            assert!(!k_quant_copies::serves(ty, 1536, 97), "type {ty} has no copies");
        }
    }
}
