//! Matrix products of one to a few rows of activations (1 to [`max_columns`]): a decoding
//! stream's step ([`one_row`]), decode steps of a few streams, a stream's token with its drafts,
//! prompts (with AVX-512: a whole ubatch of 512).
//!
//! ggml hands every product of two or more activation rows to llamafile's tiled kernels
//! (`llamafile_sgemm`) first. With Q8_0 weights (the default model's twin) on a 2-core Zen 5
//! those cost 33 ms for 2 rows and 49 ms for 8 where one row costs 16 ms: they stream the weights
//! without fetching ahead, so a few rows wait on memory like one does, and more. This module
//! answers those calls for Q8_0, Q5_0 and Q4_0 weights with Gantry's tile kernels (crate
//! `gantry-cpu-kernels`): a pair of weight rows at a time, fetched ahead, multiplied with up to
//! eight activation rows (four with AVX2) while it is in L1. With AVX-512, Q4_K, Q5_K, Q6_K and
//! IQ4_XS weights too: ggml asks for those with Q8_K activations, for 2 to 33 rows (its own tiled
//! kernel takes more first: `tiled` declines fewer; all four up to a ubatch where their
//! 16-row copies serve, `k_quant_copies`), and each weight row is unpacked once for up to eight
//! of them. One activation row of
//! most other quantized types runs ggml's own `vec_dot` for the type here, over contiguous shares
//! ([`ggml_one_row`]). Everything else (more rows, other types) goes on to llamafile.
//!
//! How ggml's calls get here (build.rs): where its CPU backend is linked in, the linker's
//! `--wrap=llamafile_sgemm` sends them to `__wrap_llamafile_sgemm` and names llamafile's own
//! `__real_llamafile_sgemm`; in the portable build, the binary exports a `llamafile_sgemm` that the
//! backend library loaded at run time binds its call to, and llamafile's own is looked up in that
//! library. Each of ggml's threads calls with its index and takes its share of the weight rows;
//! ggml waits for all of them after the product, as after llamafile's.
#![allow(unsafe_code, reason = "ggml calls this through its C signature with raw matrices")]

use std::ops::Range;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use llama_cpp_sys_2::{
    ggml_blck_size, ggml_type, ggml_type_size, GGML_TYPE_F32, GGML_TYPE_IQ4_XS, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
    GGML_TYPE_Q8_0, GGML_TYPE_Q8_K,
};

use gantry_cpu_kernels::x86::{
    avxvnni, v3, v4, BlockIQ4XS, BlockQ4, BlockQ4K, BlockQ5, BlockQ5K, BlockQ6K, BlockQ8, BlockQ8K,
};

use super::install::{traits_of_type, Level, VecDot};

/// The most activation rows a level multiplies here. Measured on a 2-core Zen 5 (2 threads, a
/// 264 MB Q8_0 matrix of 896- or 4,864-value rows, best of 5): the AVX-512 kernels take 6-9 ms for
/// 2 to 8 rows where llamafile's take 15-30, and 45 ms for 32 rows against 79-93; on a 35 MB
/// matrix 84 / 107 ms for 512 rows (a prompt's ubatch) against 156 / 149. The AVX2 ones take 7-23
/// ms for 2 to 8 rows and are level with llamafile's by 16-24. The AVX-512 level stops at
/// llama.cpp's default ubatch: past it nothing was measured, and each thread's repacked activation
/// rows (64 bytes a block: 5 MB at 512 rows of 4,864 values) grow further out of cache. The
/// AVX-VNNI level stops where AVX2 does: taking a prompt's rows up to 512 (Sapphire Rapids as
/// an Alder Lake, the 0.5B, whose weights are mostly Q5_0 and Q8_0) left its prompts of 71-735
/// tokens no faster (735 in 3.4 s against 3.2), llamafile's kernels using `vpdpbusd` there too.
pub(super) fn max_columns(level: Level) -> i64 {
    match level {
        Level::V4 => 512,
        Level::AvxVnni | Level::V3 => 12,
    }
}

/// The leading fields of ggml's `struct ggml_compute_params` (ggml-cpu-impl.h).
#[repr(C)]
pub(super) struct ComputeParams {
    pub(super) ith: c_int,
    pub(super) nth: c_int,
}

/// 0: llamafile's for every product; else 1 + the index in [`Level::ALL`] of the level whose
/// kernels serve.
static LEVEL: AtomicU8 = AtomicU8::new(0);
/// Calls ggml made here (counted by the first thread), for tests: the `--wrap` took.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Serves small batches with `level`'s kernels from now on. In the portable build, only where
/// the binary exports its `llamafile_sgemm` (the CPU backend's calls then bind to it) and the
/// backend's own is found (what this passes larger products on to).
pub(super) fn enable(level: Level) -> Result<(), String> {
    #[cfg(ggml_cpu_loaded)]
    {
        // SAFETY: dlsym reads the global symbol table.
        let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"llamafile_sgemm".as_ptr()) };
        if global as usize != llamafile_sgemm as *const () as usize {
            return Err("the binary does not export llamafile_sgemm (link argument missing)".into());
        }
        llamafile().ok_or("the loaded CPU backend has no llamafile_sgemm")?;
    }
    let code = Level::ALL.iter().position(|l| *l == level).map_or(0, |i| i + 1);
    LEVEL.store(u8::try_from(code).unwrap_or(0), Ordering::Relaxed);
    Ok(())
}

/// The level [`enable`] set, if any.
pub(super) fn level() -> Option<Level> {
    enabled()
}

fn enabled() -> Option<Level> {
    let code = usize::from(LEVEL.load(Ordering::Relaxed));
    code.checked_sub(1).and_then(|i| Level::ALL.get(i).copied())
}

/// Whose kernels multiply small batches of Q8_0, Q5_0 and Q4_0 weights: the level's name
/// (`gantry-avx512`, `gantry-avxvnni`, `gantry-avx2`) or `llamafile`.
pub(crate) fn kernels() -> &'static str {
    enabled().map_or("llamafile", Level::name)
}

/// How many matrix products ggml has handed to `llamafile_sgemm` since the process started.
#[cfg(test)]
pub(super) fn calls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// `llamafile_sgemm`'s signature (sgemm.h).
type Sgemm = unsafe extern "C" fn(
    *const ComputeParams,
    i64,
    i64,
    i64,
    *const c_void,
    i64,
    *const c_void,
    i64,
    *mut c_void,
    i64,
    c_int,
    c_int,
    c_int,
) -> bool;

#[cfg(ggml_cpu_static)]
extern "C" {
    /// llamafile's `llamafile_sgemm`, under the name `--wrap` gives it.
    #[link_name = "__real_llamafile_sgemm"]
    fn real_llamafile_sgemm(
        params: *const ComputeParams,
        m: i64,
        n: i64,
        k: i64,
        a: *const c_void,
        lda: i64,
        b: *const c_void,
        ldb: i64,
        c: *mut c_void,
        ldc: i64,
        a_type: c_int,
        b_type: c_int,
        c_type: c_int,
    ) -> bool;
}

/// llamafile's own `llamafile_sgemm`.
#[cfg(ggml_cpu_static)]
fn llamafile() -> Option<Sgemm> {
    Some(real_llamafile_sgemm)
}

/// llamafile's own `llamafile_sgemm`: the loaded CPU backend's (none before one is loaded).
#[cfg(ggml_cpu_loaded)]
fn llamafile() -> Option<Sgemm> {
    static REAL: std::sync::OnceLock<Option<Sgemm>> = std::sync::OnceLock::new();
    *REAL.get_or_init(|| {
        let address = crate::model::cpu_variants::symbol(c"llamafile_sgemm")?;
        // SAFETY: the library's llamafile_sgemm, which has this signature (sgemm.h).
        Some(unsafe { std::mem::transmute::<*mut c_void, Sgemm>(address.as_ptr()) })
    })
}

/// The weight rows thread `ith` of `nth` computes: an equal share, in pairs, so that every
/// thread's tiles are whole pairs but the last.
pub(super) fn share(m: usize, ith: usize, nth: usize) -> Range<usize> {
    let chunk = m.div_ceil(nth.max(1)).next_multiple_of(2);
    let start = (ith * chunk).min(m);
    start..(start + chunk).min(m)
}

/// One `llamafile_sgemm` call's matrices: `C = Aᵀ·B` for `m` weight rows `A` (`lda` blocks
/// apart), `n` activation rows `B` (`ldb` apart), `k` blocks long, into `C` (`ldc` floats a
/// column), with their ggml types.
#[derive(Debug, Clone, Copy)]
pub(super) struct Product {
    pub(super) m: i64,
    pub(super) n: i64,
    pub(super) k: i64,
    pub(super) a: *const c_void,
    pub(super) lda: i64,
    pub(super) b: *const c_void,
    pub(super) ldb: i64,
    pub(super) c: *mut c_void,
    pub(super) ldc: i64,
    pub(super) a_type: c_int,
    pub(super) b_type: c_int,
    pub(super) c_type: c_int,
}

/// Computes thread `params`' share of `p` with `level`'s kernels where they serve it, else
/// passes it on to llamafile; returns whether it was computed (else ggml computes it row by row).
///
/// # Safety
/// llamafile's contract: the matrices hold what the sizes and types say, and `params` is the
/// calling thread's.
pub(super) unsafe fn multiply(level: Option<Level>, params: *const ComputeParams, p: Product) -> bool {
    let is = |ty: c_int, of: u32| ty == of as c_int;
    let size = |v: i64| usize::try_from(v).unwrap_or(0);
    // SAFETY: the caller's.
    let (ith, nth) = unsafe { ((*params).ith, (*params).nth) };
    let (ith, nth) = (size(i64::from(ith)), size(i64::from(nth)));
    // K-quants from their 16-row copies, at either level, for every row count they serve.
    if let Some(l) = level.filter(|_| is(p.b_type, GGML_TYPE_Q8_K)) {
        // SAFETY: the caller's; the level was detected on this CPU.
        if unsafe { super::k_quant_copies::multiply(l, &p, ith, nth) } {
            return true;
        }
    }
    let fits = level.is_some_and(|level| (1..=max_columns(level)).contains(&p.n)) && is(p.c_type, GGML_TYPE_F32);
    let zero_types = is(p.b_type, GGML_TYPE_Q8_0)
        && (is(p.a_type, GGML_TYPE_Q8_0) || is(p.a_type, GGML_TYPE_Q5_0) || is(p.a_type, GGML_TYPE_Q4_0));
    // K-quants only with AVX-512; ggml asks with Q8_K activations, after its own tiled kernel
    // declined (it takes eight rows and more).
    let k_quant = level.is_some_and(|l| ggml_type::try_from(p.a_type).is_ok_and(|ty| l.serves_k_quant(ty)))
        && is(p.b_type, GGML_TYPE_Q8_K);
    let ours = fits && (zero_types || k_quant);
    if !ours && p.n == 1 && level.is_some() && is(p.c_type, GGML_TYPE_F32) {
        if let Some(dot) = ggml_dot(p.a_type, p.b_type) {
            let rows = share(size(p.m), ith, nth);
            // SAFETY: the caller's; `ggml_dot` checked that `b` is of the kernel's activation type.
            unsafe { ggml_one_row(dot, rows, size(p.k), p.a, size(p.lda), p.b, p.c.cast::<f32>()) };
            return true;
        }
    }
    if !ours {
        // Without llamafile's (a portable build whose backend is not loaded), ggml multiplies
        // row by row.
        let Some(llamafile) = llamafile() else { return false };
        // SAFETY: the caller's contract is llamafile's.
        return unsafe {
            llamafile(params, p.m, p.n, p.k, p.a, p.lda, p.b, p.ldb, p.c, p.ldc, p.a_type, p.b_type, p.c_type)
        };
    }
    let rows = share(size(p.m), ith, nth);
    let (n, k, lda, ldb, ldc) = (size(p.n), size(p.k), size(p.lda), size(p.ldb), size(p.ldc));
    let (a, c) = (p.a, p.c.cast::<f32>());
    // Q8_0 activations for Q8_0, Q5_0 and Q4_0 weights, Q8_K for the K-quants (`ours` checked which).
    let (q8_0, q8_k) = (p.b.cast::<BlockQ8>(), p.b.cast::<BlockQ8K>());
    let level = level.unwrap_or(Level::V3);
    if n == 1 {
        // SAFETY: as below.
        unsafe { one_row(level, p.a_type, rows, k, a, lda, p.b, c) };
        return true;
    }
    /// The level's gemm of Q8_0 activations by weights of `$Block`.
    macro_rules! zero_type {
        ($gemm:ident, $Block:ty) => {
            match level {
                Level::V4 => v4::$gemm(rows, n, k, a.cast::<$Block>(), lda, q8_0, ldb, c, ldc),
                Level::AvxVnni => avxvnni::$gemm(rows, n, k, a.cast::<$Block>(), lda, q8_0, ldb, c, ldc),
                Level::V3 => v3::$gemm(rows, n, k, a.cast::<$Block>(), lda, q8_0, ldb, c, ldc),
            }
        };
    }
    // SAFETY: the sizes are ggml's for these matrices, and the level was detected on this CPU
    // (the K-quants only reach here with AVX-512).
    unsafe {
        match u32::try_from(p.a_type).unwrap_or(u32::MAX) {
            GGML_TYPE_Q4_K => v4::gemm_q4_k(rows, n, k, a.cast::<BlockQ4K>(), lda, q8_k, ldb, c, ldc),
            GGML_TYPE_Q5_K => v4::gemm_q5_k(rows, n, k, a.cast::<BlockQ5K>(), lda, q8_k, ldb, c, ldc),
            GGML_TYPE_Q6_K => v4::gemm_q6_k(rows, n, k, a.cast::<BlockQ6K>(), lda, q8_k, ldb, c, ldc),
            GGML_TYPE_IQ4_XS => v4::gemm_iq4_xs(rows, n, k, a.cast::<BlockIQ4XS>(), lda, q8_k, ldb, c, ldc),
            GGML_TYPE_Q8_0 => zero_type!(gemm_q8_0, BlockQ8),
            GGML_TYPE_Q4_0 => zero_type!(gemm_q4_0, BlockQ4),
            _ => zero_type!(gemm_q5_0, BlockQ5),
        }
    }
    true
}

/// `c[i] = a_i · y` for weight rows `rows` of `a` (`lda` blocks apart, of ggml type `a_type`)
/// and one row of activations `y` (Q8_K for the K-quants, else Q8_0), `k` blocks long: a
/// decoding stream's product over the thread's contiguous share: with AVX-512 Q4_0 and Q8_0 through
/// the row kernels (the activations packed once), else one dot product per weight row.
/// ggml would hand each thread runs of 64 rows claimed in turn, which on a 2-core Zen 5 streamed
/// matrices of short rows (1,536 values, every projection but the FFN's down) at 36 GB/s where
/// one run per thread reached 53 (`gantry-cpu-kernels`' `gemv_bench`): each jump restarts the
/// prefetchers, and the kernels' own fetches 4 KiB ahead fall into the other thread's rows.
///
/// # Safety
/// The sizes are ggml's for these matrices, the type is one [`multiply`] serves, and the level's
/// features were detected on this CPU (the K-quants only with AVX-512).
#[allow(clippy::too_many_arguments, reason = "the product's matrices")]
unsafe fn one_row(
    level: Level,
    a_type: c_int,
    rows: Range<usize>,
    k: usize,
    a: *const c_void,
    lda: usize,
    y: *const c_void,
    c: *mut f32,
) {
    macro_rules! each_row {
        ($dot:path, $Block:ty, $Y:ty) => {
            for i in rows {
                // SAFETY: the caller's.
                unsafe { *c.add(i) = $dot(k, a.cast::<$Block>().add(i * lda), y.cast::<$Y>()) };
            }
        };
    }
    /// The level's dot product of Q8_0 activations with each row of `$Block` weights.
    macro_rules! zero_type {
        ($dot:ident, $Block:ty) => {
            match level {
                Level::V4 => each_row!(v4::$dot, $Block, BlockQ8),
                Level::AvxVnni => each_row!(avxvnni::$dot, $Block, BlockQ8),
                Level::V3 => each_row!(v3::$dot, $Block, BlockQ8),
            }
        };
    }
    let v4 = level == Level::V4;
    match u32::try_from(a_type).unwrap_or(u32::MAX) {
        // SAFETY: the caller's.
        GGML_TYPE_Q8_0 if v4 => unsafe { v4::gemv_q8_0(rows, k, a.cast(), lda, y.cast(), c) },
        // SAFETY: the caller's.
        GGML_TYPE_Q4_0 if v4 => unsafe { v4::gemv_q4_0(rows, k, a.cast(), lda, y.cast(), c) },
        GGML_TYPE_Q4_K => each_row!(v4::dot_q4_k, BlockQ4K, BlockQ8K),
        GGML_TYPE_Q5_K => each_row!(v4::dot_q5_k, BlockQ5K, BlockQ8K),
        GGML_TYPE_Q6_K => each_row!(v4::dot_q6_k, BlockQ6K, BlockQ8K),
        GGML_TYPE_IQ4_XS => each_row!(v4::dot_iq4_xs, BlockIQ4XS, BlockQ8K),
        GGML_TYPE_Q8_0 => zero_type!(dot_q8_0, BlockQ8),
        GGML_TYPE_Q4_0 => zero_type!(dot_q4_0, BlockQ4),
        _ => zero_type!(dot_q5_0, BlockQ5),
    }
}

/// The weight types whose one-row products run ggml's own `vec_dot` here, over each thread's
/// contiguous share of the rows ([`ggml_one_row`]). Measured on a 2-core Zen 5 (2 threads, 256
/// MB of 8,960 rows of 1,536 values / 1,536 of 8,960, `gantry-engine`'s `vec_dot_bench`), GB/s
/// in runs of 64 rows against one share: Q4_1 23 / 37 and 27 / 29, Q5_1 28 / 40 and 34 / 36,
/// Q2_K 13 / 35 and 30 / 37, Q3_K 17 / 28 and 24 / 28, Q4_K 26 / 42 and 31 / 41, Q5_K 26 / 44
/// and 39 / 44, Q6_K 32 / 41 and 34 / 43, IQ4_XS 19 / 33 and 29 / 36. (Q4_K, Q5_K, Q6_K and
/// IQ4_XS reach here only without AVX-512, and Q4_K only where ggml did not repack it.) IQ4_NL stays with
/// llamafile, which multiplies it where ggml did not repack it.
const GGML_SHARED: [ggml_type; 8] = [
    GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_1,
    GGML_TYPE_Q2_K,
    GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K,
    GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K,
    GGML_TYPE_IQ4_XS,
];

/// ggml's own kernel for one weight type: what [`ggml_one_row`] runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct GgmlDot {
    ty: c_int,
    /// The activation type the kernel takes (ggml's `vec_dot_type`), which ggml quantized the
    /// activations to before calling.
    activations: c_int,
    /// Values and bytes a block of weights.
    values: usize,
    bytes: usize,
    vec_dot: VecDot,
}

/// ggml's kernel for weights of `a_type` by activations of `b_type`, where it is one of
/// [`GGML_SHARED`]'s, multiplies one row at a time (`nrows`) and takes `b_type`.
pub(super) fn ggml_dot(a_type: c_int, b_type: c_int) -> Option<GgmlDot> {
    static DOTS: OnceLock<Vec<GgmlDot>> = OnceLock::new();
    let dots = DOTS.get_or_init(|| {
        GGML_SHARED
            .into_iter()
            .filter_map(|ty| {
                // SAFETY: a pointer into ggml's static table, valid for the whole process.
                let traits = unsafe { &*traits_of_type(ty).ok()? };
                // SAFETY: ggml's type sizes, defined for every type.
                let (values, bytes) = unsafe { (ggml_blck_size(ty), ggml_type_size(ty)) };
                (traits.nrows == 1).then_some(GgmlDot {
                    ty: c_int::try_from(ty).ok()?,
                    activations: c_int::try_from(traits.vec_dot_type).ok()?,
                    values: usize::try_from(values).ok()?,
                    bytes,
                    vec_dot: traits.vec_dot?,
                })
            })
            .collect()
    });
    dots.iter().find(|d| d.ty == a_type && d.activations == b_type).copied()
}

/// `c[i] = a_i · y` for weight rows `rows` of `a` (`lda` blocks apart, of `dot`'s type) and one
/// row of activations `y` of its activation type, `k` blocks long, with ggml's own kernel: the
/// same dot products ggml computes, so the same bits, over one contiguous share per thread
/// instead of runs of 64 rows claimed in turn ([`one_row`] says why that streams faster).
///
/// # Safety
/// The sizes are ggml's for these matrices, and `y` is of `dot`'s activation type.
unsafe fn ggml_one_row(
    dot: GgmlDot,
    rows: Range<usize>,
    k: usize,
    a: *const c_void,
    lda: usize,
    y: *const c_void,
    c: *mut f32,
) {
    let n = c_int::try_from(k * dot.values).unwrap_or(c_int::MAX);
    for i in rows {
        // SAFETY: the caller's; ggml's vec_dot contract with one row (`nrc` 1, strides unused).
        unsafe { (dot.vec_dot)(n, c.add(i), 0, a.cast::<u8>().add(i * lda * dot.bytes).cast(), 0, y, 0, 1) };
    }
}

/// Defines what ggml calls in place of llamafile's `llamafile_sgemm` (the same parameters):
/// [`multiply`] with the level [`enable`] set, if any.
macro_rules! entry {
    ($name:ident) => {
        /// # Safety
        /// llamafile's contract: the matrices hold what the sizes and types say, and `params` is
        /// the calling thread's.
        #[no_mangle]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's signature")]
        unsafe extern "C" fn $name(
            params: *const ComputeParams,
            m: i64,
            n: i64,
            k: i64,
            a: *const c_void,
            lda: i64,
            b: *const c_void,
            ldb: i64,
            c: *mut c_void,
            ldc: i64,
            a_type: c_int,
            b_type: c_int,
            c_type: c_int,
        ) -> bool {
            // SAFETY: ggml passes its thread's parameters.
            if unsafe { (*params).ith } == 0 {
                CALLS.fetch_add(1, Ordering::Relaxed);
            }
            let product = Product { m, n, k, a, lda, b, ldb, c, ldc, a_type, b_type, c_type };
            // SAFETY: the caller's contract is multiply's.
            unsafe { multiply(enabled(), params, product) }
        }
    };
}

#[cfg(ggml_cpu_static)]
entry!(__wrap_llamafile_sgemm);
#[cfg(ggml_cpu_loaded)]
entry!(llamafile_sgemm);
