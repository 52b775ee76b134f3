//! An embedding model's F32 matrices served as BF16, on CPUs with BF16 dot products.
//!
//! Sentence-transformers models are converted to GGUF in F32 (all-MiniLM-L6-v2 is), and an
//! embedding's cost is its matrix products over whole batches of tokens: compute, not memory.
//! With AVX512_BF16, ggml multiplies BF16 matrices by `vdpbf16ps` (llamafile's tinyBLAS), two
//! products per lane and instruction where F32 takes one, accumulating in F32. Measured on
//! all-MiniLM-L6-v2, 2-core Zen 5, 32 inputs a request: 250 → 367 inputs/s at one request, 269 →
//! 405 at sixteen; its vectors keep cosine ≥ 0.99998 with a float64 forward pass of the
//! original weights (F32: ≥ 0.999999). Half the weight bytes, too. vLLM likewise serves F32
//! checkpoints in 16-bit types by default.
//!
//! The tensors are the ones `llama-quantize` turns to BF16: every F32 tensor of two or more
//! dimensions but the position and token-type embeddings, which BERT adds to its input as
//! they are. Norms and biases stay F32. Chat models are not converted: their greedy tokens
//! would then differ from the file's.

#![allow(unsafe_code, reason = "ggml's BF16 conversion and CPU feature query are C")]

use std::path::{Path, PathBuf};

use llama_cpp_sys_2::{GGML_TYPE_BF16, GGML_TYPE_F32};

use super::{Conversion, Plan};
use crate::model::gguf_header::Header;

pub(crate) const CONVERSION: Conversion = Conversion { tag: "f32-as-bf16-v1", to: GGML_TYPE_BF16, plan, convert };

/// Kept in F32: added to the input, not multiplied (as `llama-quantize` keeps them).
const KEPT: [&str; 2] = ["position_embd.weight", "token_types.weight"];

/// What converting `model` would take; `None` when it is not a readable GGUF or holds no F32
/// matrix.
pub(crate) fn plan(model: &Path) -> Option<Plan> {
    let (header, shapes) = Header::open_with_shapes(model)?;
    let tensors: Vec<i64> = (0..header.n_tensors())
        .filter(|&id| header.tensor_type(id) == GGML_TYPE_F32)
        .filter(|&id| {
            let name = header.tensor_name(id);
            !KEPT.contains(&name.as_str()) && shapes.dims(&name) >= 2
        })
        .collect();
    let source_bytes: u64 = tensors.iter().map(|&id| header.tensor_span(id).1).sum();
    Some(Plan { tensors, source_bytes, twin_bytes: source_bytes / 2 }).filter(|p| !p.tensors.is_empty())
}

/// F32 values as BF16, rounded to nearest even, as `llama-quantize` writes them.
fn convert(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let floats: Vec<f32> =
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("chunks of four"))).collect();
    let mut out = vec![0u16; floats.len()];
    // SAFETY: `floats` holds n values and `out` room for n BF16 values (`ggml_bf16_t` is one
    // `u16`).
    unsafe {
        llama_cpp_sys_2::ggml_fp32_to_bf16_row_ref(floats.as_ptr(), out.as_mut_ptr().cast(), floats.len() as i64);
    }
    Some(out.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// Whether ggml's CPU backend here multiplies BF16 natively: the CPU has AVX512_BF16 and the
/// backend was built for it (otherwise ggml would widen each BF16 value back to F32 and lose
/// more than it gains): the one linked into this binary, or the variant the portable build
/// loaded (which the CPU's features chose).
pub(crate) fn pays_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16") && backend_has_avx512_bf16()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(not(feature = "cpu-variants"))]
fn backend_has_avx512_bf16() -> bool {
    // SAFETY: a query of ggml's compile-time features.
    unsafe { llama_cpp_sys_2::ggml_cpu_has_avx512_bf16() != 0 }
}

#[cfg(feature = "cpu-variants")]
fn backend_has_avx512_bf16() -> bool {
    let Some(address) = crate::model::cpu_variants::symbol(c"ggml_cpu_has_avx512_bf16") else { return false };
    // SAFETY: the loaded variant's `int ggml_cpu_has_avx512_bf16(void)`, with the bindings'
    // signature.
    let query = unsafe {
        std::mem::transmute::<*mut std::os::raw::c_void, unsafe extern "C" fn() -> std::os::raw::c_int>(
            address.as_ptr(),
        )
    };
    // SAFETY: as above.
    unsafe { query() != 0 }
}

/// The file to load for the embedding model `model`: its BF16 twin in `dir` where it pays (see
/// [`super::weights_to_load`]), else `model`.
pub(crate) fn weights_to_load(model: &Path, dir: &Path) -> PathBuf {
    if pays_here() {
        super::weights_to_load(model, dir, &CONVERSION)
    } else {
        model.to_path_buf()
    }
}

#[cfg(test)]
#[path = "f32_as_bf16_tests.rs"]
mod tests;
