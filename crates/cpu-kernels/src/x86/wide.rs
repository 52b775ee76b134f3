//! The AVX-512 level's products of several rows of activations (eight at a time): two blocks in
//! each 512-bit register, and no sign tricks per product.
//!
//! VNNI's `vpdpbusd` multiplies unsigned bytes by signed ones. The one-row kernels make both
//! sides fit by moving `x`'s signs onto `y` (two instructions a product). Here the activations
//! are repacked once per call as `y + 128` (unsigned), and `Σ (y + 128)·x = Σ y·x + 128·Σ x`: the
//! `128·Σ x` of a weight block is computed once for all columns and subtracted by starting the
//! accumulation from its negation. A product of two blocks is then four instructions (multiply-add
//! of the bytes, conversion, the two scales' product, the fused add), each over two blocks.
//! The integer sums are the same as ggml's; only the order in which the scaled float sums are
//! added differs.
#![allow(clippy::needless_range_loop, reason = "tiles index rows and columns of fixed arrays")]

use super::v4::{f16_to_f32, values_q5, values_q8};
use super::*;

/// The activation columns, repacked: per column, its blocks in pairs as 64 unsigned bytes
/// (`y + 128`, which is `y ^ 0x80`), and per pair 16 scales (8 lanes for each block). A last
/// odd block is paired with zeros.
struct Columns {
    pairs: usize,
    values: Vec<__m512i>,
    scales: Vec<__m512>,
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn two(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn two_scales(lo: f32, hi: f32) -> __m512 {
    let lo = _mm512_castps256_ps512(_mm256_set1_ps(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_set1_ps(hi))))
}

impl Columns {
    /// # Safety
    /// `b` holds `n` columns of `k` blocks, `ldb` blocks apart.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pack(n: usize, k: usize, b: *const BlockQ8, ldb: usize) -> Self {
        let pairs = k.div_ceil(2);
        let mut values = Vec::with_capacity(n * pairs);
        let mut scales = Vec::with_capacity(n * pairs);
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        for j in 0..n {
            let column = unsafe { b.add(j * ldb) };
            for p in 0..pairs {
                let block = |i: usize| {
                    if i < k {
                        let at = unsafe { column.add(i) };
                        (_mm256_xor_si256(values_q8(at), flip), f16_to_f32(unsafe { BlockQ8::scale_bits(at) }))
                    } else {
                        (flip, 0.0)
                    }
                };
                let ((lo, dlo), (hi, dhi)) = (block(2 * p), block(2 * p + 1));
                values.push(two(lo, hi));
                scales.push(two_scales(dlo, dhi));
            }
        }
        Self { pairs, values, scales }
    }
}

macro_rules! wide {
    ($tile:ident, $gemm:ident, $Block:ty, $values:ident) => {
        /// Rows `x` times `C` packed columns from column `first`: `out[r][c]`. Fetches each
        /// row `ahead` bytes on.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn $tile<const R: usize, const C: usize>(
            k: usize,
            x: [*const $Block; R],
            columns: &Columns,
            first: usize,
            ahead: usize,
        ) -> [[f32; C]; R] {
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            let high = _mm512_set1_epi8(0x80u8 as i8);
            for p in 0..columns.pairs {
                let b = 2 * p;
                if p % 2 == 0 {
                    fetch_ahead(x, b, ahead);
                }
                let mut xv = [_mm512_setzero_si512(); R];
                let mut start = [_mm512_setzero_si512(); R];
                let mut dx = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    let lo = unsafe { x[r].add(b) };
                    let d_lo = f16_to_f32(unsafe { <$Block as Block>::scale_bits(lo) });
                    let (hi, d_hi) = if b + 1 < k {
                        let hi = unsafe { x[r].add(b + 1) };
                        ($values(hi), f16_to_f32(unsafe { <$Block as Block>::scale_bits(hi) }))
                    } else {
                        (_mm256_setzero_si256(), 0.0)
                    };
                    xv[r] = two($values(lo), hi);
                    // −128·Σx per group of four bytes.
                    start[r] = _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), high, xv[r]),
                    );
                    dx[r] = two_scales(d_lo, d_hi);
                }
                for c in 0..C {
                    let at = (first + c) * columns.pairs + p;
                    let (yv, dy) = unsafe { (*columns.values.get_unchecked(at), *columns.scales.get_unchecked(at)) };
                    for r in 0..R {
                        let sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start[r], yv, xv[r]));
                        acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dx[r], dy), sums, acc[r][c]);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
                }
            }
            out
        }

        /// The product of weight rows `rows` of `a` (`lda` blocks apart) with `n` columns of
        /// Q8_0 activations `b` (`ldb` apart), `k` blocks long: `c[j * ldc + i] = a_i · b_j`, as
        /// llamafile's `sgemm` lays it out. Rows go in pairs, columns in eights, a row pair's
        /// groups one after another while its weights are in L1. Every column is repacked first
        /// (`n · k · 64` bytes), so `n` is meant to be small.
        ///
        /// # Safety
        /// `a` holds every row in `rows`, `b` `n` columns, each `k` blocks long; `c` has room for
        /// every `j * ldc + i`; and this CPU has AVX-512 BW/VL and VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn $gemm(
            rows: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const $Block,
            lda: usize,
            b: *const BlockQ8,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            let columns = unsafe { Columns::pack(n, k, b, ldb) };
            let ahead = prefetch_distance(2 * lda * std::mem::size_of::<$Block>());
            macro_rules! run {
                ($R:literal, $C:literal, $i:expr, $j:expr) => {{
                    let (i, j) = ($i, $j);
                    unsafe { $tile::<$R, $C>(k, std::array::from_fn(|r| a.add((i + r) * lda)), &columns, j, ahead) }
                }};
            }
            each_tile!(rows, n, c, ldc, run, [1 2 3 4 5 6 7] 8);
        }
    };
}

wide!(tile_q8_0, gemm_q8_0, BlockQ8, values_q8);
wide!(tile_q5_0, gemm_q5_0, BlockQ5, values_q5);
