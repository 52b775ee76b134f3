//! Q4_K, Q5_K, Q6_K and IQ4_XS matrices multiplied by 1 to 512 rows of activations (a decoding
//! stream, a few, a stream's drafts, a prompt's ubatch) from copies in the 16-row layouts of
//! `gantry-cpu-kernels` (`q4_k_rows16`, `q5_k_rows16`, `q6_k_rows16`, `iq4_xs_rows16`), with
//! AVX-512, or with AVX2 (`rows16_avx2`, eight rows a register; `rows16_avxvnni` where the CPU
//! has AVX-VNNI) (`--k-quant-copies`).
//!
//! The kernels of `small_batches` unpack each weight row once for up to eight activation rows and
//! pay a block's float work for every weight row; in the 16-row layouts one `vpdpbusd` serves 16
//! weight rows and the float work is paid once for them. With the weights in L2 (2-core Zen 4) a
//! block and activation row takes 1.5 ns at four rows where `small_batches` takes 4.4; on the
//! 1.5B coder (Q4_K_M), four sampled streams ran at 1.55× the tokens per second
//! (docs/scheduling-and-speculation.md has the measurements). Prompts too: ggml's tiled kernel
//! (`tiled`) unpacks every weight tile into bytes for each product, where the copies are unpacked
//! once; on the same machine prompts of 59 to 556 tokens took 0.5–0.7 of its time. A decoding
//! stream's one row too ([`serves`] says why), so decoding reads the copies and not the GGUF's
//! bytes of these matrices. The copy is a second one in memory: 148 bytes a Q4_K block where the
//! GGUF has 144, 180 a Q5_K block where it has 176, 212 a Q6_K block where it has 210, 140 an
//! IQ4_XS block where it has 136, counted in the model's memory ([`copy_bytes`]).
//!
//! A copy is made the first time ggml multiplies its matrix here (an engine does so once
//! at start, `Engine::start`), and kept under the matrix's address. Addresses are reused once a
//! model is freed: every copy is dropped when any model is ([`forget_all`], the others' made again
//! at their next product), and a copy keeps its source's first block, compared at every product,
//! so one whose address now holds other weights is made again rather than served.
#![allow(unsafe_code, reason = "reads ggml's weight matrices through raw pointers")]

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use llama_cpp_sys_2::{
    ggml_type, GGML_TYPE_F32, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K,
};

use gantry_cpu_kernels::x86::{
    avxvnni, repack_iq4_xs_rows16_into, repack_q4_k_rows16_into, repack_q5_k_rows16_into, repack_q6_k_rows16_into, v3,
    v4, BlockIQ4XS, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, IQ4XSRows16, Q4KRows16, Q5KRows16, Q6KRows16,
};

use super::install::Level;
use super::small_batches::{share, Product};
use crate::model::gguf_header::Header;

/// Bytes of a GGUF block and of a row's block in the copy, for each type copied (144 and 148 for
/// Q4_K, 176 and 180 for Q5_K, 210 and 212 for Q6_K, 136 and 140 for IQ4_XS); `None` for types
/// that have no copies.
pub(super) fn block_bytes(ty: ggml_type) -> Option<(usize, usize)> {
    use std::mem::size_of;
    match ty {
        GGML_TYPE_Q4_K => Some((size_of::<BlockQ4K>(), size_of::<Q4KRows16>() / 16)),
        GGML_TYPE_Q5_K => Some((size_of::<BlockQ5K>(), size_of::<Q5KRows16>() / 16)),
        GGML_TYPE_Q6_K => Some((size_of::<BlockQ6K>(), size_of::<Q6KRows16>() / 16)),
        GGML_TYPE_IQ4_XS => Some((size_of::<BlockIQ4XS>(), size_of::<IQ4XSRows16>() / 16)),
        _ => None,
    }
}

/// The types copied (those [`block_bytes`] names), with their names.
pub(super) const COPIED_TYPES: [(ggml_type, &str); 4] =
    [(GGML_TYPE_Q4_K, "Q4_K"), (GGML_TYPE_Q5_K, "Q5_K"), (GGML_TYPE_Q6_K, "Q6_K"), (GGML_TYPE_IQ4_XS, "IQ4_XS")];

/// The most activation rows a product served from copies has: llama.cpp's default ubatch.
const MAX_ROWS: i64 = 512;

static SERVING: AtomicBool = AtomicBool::new(false);

/// A matrix as ggml hands it over: its address, type and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    address: usize,
    ty: std::os::raw::c_int,
    m: usize,
    k: usize,
    lda: usize,
}

enum Groups {
    Q4(Vec<Q4KRows16>),
    Q5(Vec<Q5KRows16>),
    Q6(Vec<Q6KRows16>),
    IQ4(Vec<IQ4XSRows16>),
}

impl Groups {
    fn bytes(&self) -> usize {
        match self {
            Groups::Q4(g) => std::mem::size_of_val(g.as_slice()),
            Groups::Q5(g) => std::mem::size_of_val(g.as_slice()),
            Groups::Q6(g) => std::mem::size_of_val(g.as_slice()),
            Groups::IQ4(g) => std::mem::size_of_val(g.as_slice()),
        }
    }
}

struct Copy {
    /// The source's first block, to tell its weights from others later at the same address.
    first_block: Vec<u8>,
    groups: Groups,
}

fn copies() -> &'static RwLock<HashMap<Key, Arc<Copy>>> {
    static COPIES: OnceLock<RwLock<HashMap<Key, Arc<Copy>>>> = OnceLock::new();
    COPIES.get_or_init(Default::default)
}

/// Serves Q4_K, Q5_K, Q6_K and IQ4_XS products from copies from now on (`on`), where a level of
/// Gantry's kernels serves small batches; or not.
pub(super) fn serve(on: bool) {
    SERVING.store(on, Ordering::Relaxed);
}

/// Whether products are served from copies (and engines make them at start).
pub(crate) fn serving() -> bool {
    SERVING.load(Ordering::Relaxed) && super::small_batches::level().is_some()
}

/// Drops every copy (see the module): called as a model is freed, before its memory is.
pub(crate) fn forget_all() {
    copies().write().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
}

/// Bytes the copies of `model`'s matrices take where they are served: every matrix of a type copied
/// but a token embedding that is only looked up (the output layer multiplies by it where the
/// model has no `output.weight`).
pub(crate) fn copy_bytes(model: &Path) -> u64 {
    let Some(header) = Header::open(model) else { return 0 };
    header
        .multiplied_tensors()
        .into_iter()
        .map(|id| {
            let bytes = header.tensor_span(id).1;
            block_bytes(header.tensor_type(id)).map_or(0, |(gguf, copy)| bytes / gguf as u64 * copy as u64)
        })
        .sum()
}

/// Whether a product of `m` weight rows of type `ty` by `rows` activation rows is served from
/// copies: Q4_K, Q5_K, Q6_K and IQ4_XS, whole groups of 16 rows, 1 to 512 activation rows (a
/// ubatch), while copies are served.
///
/// One row (a decoding stream's step) reads the weights once at the memory's pace, and the copies
/// stream faster there than the GGUF's rows: their groups are read in whole cache lines from huge
/// pages, in the order the kernel uses them, and 16 rows share a block's float work. One sampled
/// stream of qwen2.5-coder-1.5b Q4_K_M, 2-core Zen 4, answers alternated within one server
/// (`--speculate off`): Q4_K from its copy 36.0 ms a token against 40.1 (8 pairs), then Q6_K
/// from its copy too 36.0–36.5 against 37.1–38.4 (12 pairs).
pub(super) fn serves(ty: ggml_type, m: i64, rows: i64) -> bool {
    SERVING.load(Ordering::Relaxed)
        && block_bytes(ty).is_some()
        && (1..=MAX_ROWS).contains(&rows)
        && m > 0
        && m % 16 == 0
}

/// Computes thread `ith` of `nth`'s share of `p` from its matrix's copy (made now if there is
/// none) with `level`'s kernels; `false` where copies do not [`serves`] `p` (or its activations
/// are not Q8_K), which then goes on as before.
///
/// # Safety
/// llamafile's contract: the matrices hold what the sizes and types say; `level` was detected on
/// this CPU.
pub(super) unsafe fn multiply(level: Level, p: &Product, ith: usize, nth: usize) -> bool {
    let is = |ty: std::os::raw::c_int, of: ggml_type| ty == of as std::os::raw::c_int;
    let typed = is(p.b_type, GGML_TYPE_Q8_K) && is(p.c_type, GGML_TYPE_F32);
    let Some(ty) = ggml_type::try_from(p.a_type).ok().filter(|&ty| typed && serves(ty, p.m, p.n)) else {
        return false;
    };
    let size = |v: i64| usize::try_from(v).unwrap_or(0);
    let key = Key { address: p.a as usize, ty: p.a_type, m: size(p.m), k: size(p.k), lda: size(p.lda) };
    // SAFETY: the caller's.
    let Some(copy) = (unsafe { copy_of(key, ty) }) else { return false };
    let groups: Range<usize> = share(key.m / 16, ith, nth);
    let (n, ldb, ldc) = (size(p.n), size(p.ldb), size(p.ldc));
    let (b, c) = (p.b.cast::<BlockQ8K>(), p.c.cast::<f32>());
    let k = key.k;
    // SAFETY: the copy holds the matrix's groups; the rest is the caller's.
    unsafe {
        match (&copy.groups, level) {
            (Groups::Q4(g), Level::V4) => v4::gemm_q4_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q5(g), Level::V4) => v4::gemm_q5_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q6(g), Level::V4) => v4::gemm_q6_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::IQ4(g), Level::V4) => v4::gemm_iq4_xs_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q4(g), Level::V3) => v3::gemm_q4_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q5(g), Level::V3) => v3::gemm_q5_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q6(g), Level::V3) => v3::gemm_q6_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::IQ4(g), Level::V3) => v3::gemm_iq4_xs_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q4(g), Level::AvxVnni) => avxvnni::gemm_q4_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q5(g), Level::AvxVnni) => avxvnni::gemm_q5_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::Q6(g), Level::AvxVnni) => avxvnni::gemm_q6_k_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
            (Groups::IQ4(g), Level::AvxVnni) => avxvnni::gemm_iq4_xs_rows16(groups, n, k, g.as_ptr(), b, ldb, c, ldc),
        }
    }
    true
}

/// The copy of `key`'s matrix, made where there is none or the one there was made from other
/// weights; `None` where `ty` has no copies.
///
/// # Safety
/// `key` describes a matrix of type `ty` that ggml holds: `m` rows of `k` blocks, `lda` apart.
unsafe fn copy_of(key: Key, ty: ggml_type) -> Option<Arc<Copy>> {
    let (bytes, _) = block_bytes(ty)?;
    // SAFETY: the caller's: the matrix starts with a whole block.
    let first = unsafe { std::slice::from_raw_parts(key.address as *const u8, bytes) };
    let current = |c: &Arc<Copy>| c.first_block == first;
    if let Some(copy) =
        copies().read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).filter(|c| current(c))
    {
        return Some(Arc::clone(copy));
    }
    let mut all = copies().write().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Another thread of the same product may have made it while this one waited.
    if let Some(copy) = all.get(&key).filter(|c| current(c)) {
        return Some(Arc::clone(copy));
    }
    let blocks = (key.m - 1) * key.lda + key.k;
    // SAFETY: the caller's: every row's blocks are there.
    let groups = unsafe {
        match ty {
            GGML_TYPE_Q4_K => {
                let a = std::slice::from_raw_parts(key.address as *const BlockQ4K, blocks);
                Groups::Q4(in_parallel(a, key, repack_q4_k_rows16_into))
            }
            GGML_TYPE_Q5_K => {
                let a = std::slice::from_raw_parts(key.address as *const BlockQ5K, blocks);
                Groups::Q5(in_parallel(a, key, repack_q5_k_rows16_into))
            }
            GGML_TYPE_Q6_K => {
                let a = std::slice::from_raw_parts(key.address as *const BlockQ6K, blocks);
                Groups::Q6(in_parallel(a, key, repack_q6_k_rows16_into))
            }
            GGML_TYPE_IQ4_XS => {
                let a = std::slice::from_raw_parts(key.address as *const BlockIQ4XS, blocks);
                Groups::IQ4(in_parallel(a, key, repack_iq4_xs_rows16_into))
            }
            _ => return None,
        }
    };
    let copy = Arc::new(Copy { first_block: first.to_vec(), groups });
    all.insert(key, Arc::clone(&copy));
    Some(copy)
}

/// `repack` over `a`'s groups of 16 rows into a buffer of their own, shared out among the CPU's
/// cores: a copy is made while ggml's other threads wait for it (at start, or after another model
/// was freed). The buffer asks for huge pages: with 4 KiB pages, faulting in a gigabyte of copies
/// took more time than repacking it (and the kernels walk the copy with fewer TLB misses).
fn in_parallel<B: Sync, G: Send>(
    a: &[B],
    key: Key,
    repack: fn(&[B], usize, usize, &mut [std::mem::MaybeUninit<G>]),
) -> Vec<G> {
    let groups = key.m / 16;
    let mut all: Vec<G> = Vec::with_capacity(groups * key.k);
    let spare = &mut all.spare_capacity_mut()[..groups * key.k];
    advise_huge_pages(spare.as_mut_ptr().cast(), std::mem::size_of_val(spare));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, groups.max(1));
    let per_thread = groups.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (i, out) in spare.chunks_mut(per_thread * key.k.max(1)).enumerate() {
            let from = &a[16 * i * per_thread * key.lda..];
            scope.spawn(move || repack(from, key.k, key.lda, out));
        }
    });
    // SAFETY: every thread wrote its chunk, and the chunks cover the groups (a panic in one
    // would have ended the scope with it).
    unsafe { all.set_len(groups * key.k) };
    all
}

/// Asks the kernel to back `len` bytes at `start` with transparent huge pages where it gives
/// them only on request (`madvise` mode); the whole 2 MiB pages inside the range.
fn advise_huge_pages(start: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let first = (start as usize).next_multiple_of(HUGE);
    let end = (start as usize + len) / HUGE * HUGE;
    if end > first {
        // SAFETY: advice on whole pages of memory this process owns; failure changes nothing.
        let _ = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

/// Bytes the copies made so far take, and how many there are.
pub(crate) fn made() -> (u64, usize) {
    let all = copies().read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let bytes = all.values().map(|c| c.groups.bytes() as u64).sum();
    (bytes, all.len())
}
