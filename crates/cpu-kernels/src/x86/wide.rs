//! The AVX-512 level's products of 2 to 8 rows of activations (a decode step's): four activation
//! columns side by side in each 512-bit register, and a weight block broadcast to the four. More
//! rows (a prompt's) go to [`super::wide_prompt`], eight columns a register.
//!
//! VNNI's `vpdpbusd` multiplies unsigned bytes by signed ones. Here the weights are the unsigned
//! side: Q4_0's nibbles as they are (a value is `q − 8`), Q5_0's five bits (`q − 16`), Q8_0's
//! bytes with their sign bit flipped (`x + 128`). With `o` that offset, `Σ (x + o)·y = Σ x·y +
//! o·Σ y`: each activation column's `−o·Σ y` is computed once per block when the columns are
//! packed, and a product's sums start from it. A weight block's 32 values, as two halves of 16
//! broadcast to the four columns' lanes, then meet four columns with two VNNI products (each lane
//! 8 products summed), and one conversion and scaling covers 128 products.
//! The integer sums are the same as ggml's; only the order in which the scaled float sums are
//! added differs.
#![allow(clippy::needless_range_loop, reason = "tiles index rows and columns of fixed arrays")]

use super::v4::{f16_to_f32, values_q5, values_q8};
use super::wide_prompt;
use super::*;

/// One block of four activation columns: the columns' first 16 values side by side (`low`, what
/// a weight block's first half multiplies), their last 16 (`high`), each column's scale in its
/// four lanes, and each column's `−o·Σy` in the first of its four lanes, where a product's sums
/// start so that `Σ (x + o)·y` ends as `Σ x·y`.
#[repr(C)]
struct FourColumnBlock {
    low: __m512i,
    high: __m512i,
    scales: __m512,
    start: __m512i,
}

/// The activation columns in groups of four ([`FourColumnBlock`]s, group after group, `k`
/// each), for weights whose values are offset by `o`; columns past the last are zeros.
struct FourColumns {
    entries: Vec<FourColumnBlock>,
}

impl FourColumns {
    /// # Safety
    /// `b` holds `n` columns of `k` blocks, `ldb` blocks apart.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pack(n: usize, k: usize, b: *const BlockQ8, ldb: usize, offset: i32) -> Self {
        let groups = n.div_ceil(4);
        let mut entries = Vec::with_capacity(groups * k);
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        for g in 0..groups {
            for i in 0..k {
                let mut values = [_mm256_setzero_si256(); 4];
                let (mut scales, mut starts) = ([0f32; 4], [0i32; 4]);
                for q in 0..4 {
                    let j = 4 * g + q;
                    if j < n {
                        let at = unsafe { b.add(j * ldb + i) };
                        values[q] = values_q8(at);
                        scales[q] = f16_to_f32(unsafe { BlockQ8::scale_bits(at) });
                        // Σy: the bytes' sum as unsigned (`y + 128`), less 32·128.
                        let sums = _mm256_sad_epu8(_mm256_xor_si256(values[q], flip), _mm256_setzero_si256());
                        let sum = _mm256_extract_epi64::<0>(sums)
                            + _mm256_extract_epi64::<1>(sums)
                            + _mm256_extract_epi64::<2>(sums)
                            + _mm256_extract_epi64::<3>(sums)
                            - 32 * 128;
                        starts[q] = -offset * sum as i32;
                    }
                }
                let side_by_side = |half: fn(__m256i) -> __m128i| {
                    let v = _mm512_castsi128_si512(half(values[0]));
                    let v = _mm512_inserti32x4::<1>(v, half(values[1]));
                    let v = _mm512_inserti32x4::<2>(v, half(values[2]));
                    _mm512_inserti32x4::<3>(v, half(values[3]))
                };
                let [d0, d1, d2, d3] = scales;
                let [s0, s1, s2, s3] = starts;
                entries.push(FourColumnBlock {
                    low: side_by_side(|v| _mm256_castsi256_si128(v)),
                    high: side_by_side(|v| _mm256_extracti128_si256::<1>(v)),
                    scales: _mm512_set_ps(d3, d3, d3, d3, d2, d2, d2, d2, d1, d1, d1, d1, d0, d0, d0, d0),
                    start: _mm512_set_epi32(0, 0, 0, s3, 0, 0, 0, s2, 0, 0, 0, s1, 0, 0, 0, s0),
                });
            }
        }
        Self { entries }
    }
}

/// A Q4_0 block's values plus 8, its nibbles as they are: the first 16 (low nibbles) and the last
/// 16 (high nibbles), each broadcast to the four 128-bit lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn halves_q4_0(block: *const BlockQ4) -> (__m512i, __m512i) {
    let packed = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(addr_of!((*block).qs).cast()) });
    let mask = _mm512_set1_epi8(0x0f);
    (_mm512_and_si512(packed, mask), _mm512_and_si512(_mm512_srli_epi16::<4>(packed), mask))
}

/// A Q5_0 block's values plus 16 (its nibbles with the fifth bits above them), halves
/// broadcast as [`halves_q4_0`]'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn halves_q5_0(block: *const BlockQ5) -> (__m512i, __m512i) {
    let values = _mm256_add_epi8(values_q5(block), _mm256_set1_epi8(16));
    (
        _mm512_broadcast_i32x4(_mm256_castsi256_si128(values)),
        _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(values)),
    )
}

/// A Q8_0 block's values plus 128 (the sign bit flipped), halves broadcast as
/// [`halves_q4_0`]'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn halves_q8_0(block: *const BlockQ8) -> (__m512i, __m512i) {
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let qs = unsafe { addr_of!((*block).qs).cast::<u8>() };
    let half =
        |at: usize| _mm512_xor_si512(_mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(qs.add(at).cast()) }), flip);
    (half(0), half(16))
}

macro_rules! wide {
    ($tile:ident, $gemm:ident, $Block:ty, $halves:ident, $offset:literal, $many:path) => {
        /// Rows `x` times `C` packed columns from column `first` (a multiple of four):
        /// `out[r][c]`. Fetches each row `ahead` bytes on.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn $tile<const R: usize, const C: usize>(
            k: usize,
            x: [*const $Block; R],
            columns: &FourColumns,
            first: usize,
            ahead: usize,
        ) -> [[f32; C]; R] {
            let groups = C.div_ceil(4);
            let entries = unsafe { columns.entries.as_ptr().add(first / 4 * k) };
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for b in 0..k {
                if b % 4 == 0 {
                    fetch_ahead(x, b, ahead);
                }
                let mut low = [_mm512_setzero_si512(); R];
                let mut high = [_mm512_setzero_si512(); R];
                let mut dx = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    let block = unsafe { x[r].add(b) };
                    (low[r], high[r]) = unsafe { $halves(block) };
                    dx[r] = _mm512_set1_ps(f16_to_f32(unsafe { <$Block as Block>::scale_bits(block) }));
                }
                for g in 0..groups {
                    let e = unsafe { &*entries.add(g * k + b) };
                    for r in 0..R {
                        let sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(e.start, low[r], e.low), high[r], e.high);
                        acc[r][g] = _mm512_fmadd_ps(_mm512_mul_ps(dx[r], e.scales), _mm512_cvtepi32_ps(sums), acc[r][g]);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for r in 0..R {
                for g in 0..groups {
                    let mut lanes = [0f32; 16];
                    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r][g]) };
                    for q in 0..4 {
                        if 4 * g + q < C {
                            let l = &lanes[4 * q..4 * q + 4];
                            out[r][4 * g + q] = (l[0] + l[1]) + (l[2] + l[3]);
                        }
                    }
                }
            }
            out
        }

        /// The product of weight rows `rows` of `a` (`lda` blocks apart) with `n` columns of
        /// Q8_0 activations `b` (`ldb` apart), `k` blocks long: `c[j * ldc + i] = a_i · b_j`, as
        /// llamafile's `sgemm` lays it out. Up to 8 columns: rows in pairs, each pair's weights
        /// fetched ahead and multiplied with every column while in L1; the columns are repacked
        /// first (`n · k · 64` bytes). More go to [`super::wide_prompt`].
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
            if n > 8 {
                return unsafe { $many(rows, n, k, a, lda, b, ldb, c, ldc) };
            }
            let ahead = prefetch_distance(2 * lda * std::mem::size_of::<$Block>());
            let columns = unsafe { FourColumns::pack(n, k, b, ldb, $offset) };
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

wide!(tile_q4_0, gemm_q4_0, BlockQ4, halves_q4_0, 8, wide_prompt::gemm_q4_0);
wide!(tile_q5_0, gemm_q5_0, BlockQ5, halves_q5_0, 16, wide_prompt::gemm_q5_0);
wide!(tile_q8_0, gemm_q8_0, BlockQ8, halves_q8_0, 128, wide_prompt::gemm_q8_0);
