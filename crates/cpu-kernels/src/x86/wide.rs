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
//! added differs. Q4_0's nibbles are unsigned already, so its tile packs the activations
//! differently ([`NibbleColumns`]).
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

/// One block of four activation columns packed for Q4_0's unsigned nibbles: the columns'
/// first 16 values side by side (`low`, what a block's low nibbles multiply), their last 16
/// (`high`), each column's scale in its four lanes, and each column's `-8·Σy` in the first of its
/// four lanes, where a product's sums start so that `Σ q·y` ends as `Σ (q − 8)·y`.
#[repr(C)]
struct NibbleBlock {
    low: __m512i,
    high: __m512i,
    scales: __m512,
    start: __m512i,
}

/// The activation columns for Q4_0 weights, in groups of four ([`NibbleBlock`]s, group after
/// group, `k` each); columns past the last are zeros. A weight block's nibbles, 16 bytes, are
/// then multiplied by four columns at once with two VNNI products (each lane 8 products summed),
/// where [`Columns`] takes one product per column for 64 values: half the conversions and
/// scalings per product.
struct NibbleColumns {
    k: usize,
    entries: Vec<NibbleBlock>,
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

    /// Bytes a column takes.
    fn column_bytes(&self) -> usize {
        self.pairs * 128
    }
}

impl NibbleColumns {
    /// # Safety
    /// `b` holds `n` columns of `k` blocks, `ldb` blocks apart.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pack(n: usize, k: usize, b: *const BlockQ8, ldb: usize) -> Self {
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
                        starts[q] = -8 * sum as i32;
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
                entries.push(NibbleBlock {
                    low: side_by_side(|v| _mm256_castsi256_si128(v)),
                    high: side_by_side(|v| _mm256_extracti128_si256::<1>(v)),
                    scales: _mm512_set_ps(d3, d3, d3, d3, d2, d2, d2, d2, d1, d1, d1, d1, d0, d0, d0, d0),
                    start: _mm512_set_epi32(0, 0, 0, s3, 0, 0, 0, s2, 0, 0, 0, s1, 0, 0, 0, s0),
                });
            }
        }
        Self { k, entries }
    }

    /// Bytes a column takes.
    fn column_bytes(&self) -> usize {
        self.k * std::mem::size_of::<NibbleBlock>() / 4
    }
}

/// How many packed columns one group holds: about 256 KiB, a quarter of a Zen 5 or Sapphire
/// Rapids core's L2, in whole tiles of eight. Without groups every pair of weight rows swept all
/// of a prompt's columns (512 of 4,864 values: 9.7 MB) from L3: prompts of 1,531 tokens on
/// qwen2.5-coder-1.5b at Q4_0 went 118 → 145-148 tok/s with groups of 64 KiB to 512 KiB (2-core
/// Zen 5), the 0.5B's (Q5_0 and Q8_0 products) 475 → 492-533.
fn columns_in_l2(column_bytes: usize) -> usize {
    const GROUP_BYTES: usize = 256 << 10;
    (GROUP_BYTES / column_bytes.max(1)).max(8) / 8 * 8
}

/// A level-4 `gemm` over columns packed as `$Columns`, with `$tile`.
macro_rules! wide_gemm {
    ($gemm:ident, $Block:ty, $tile:ident, $Columns:ident) => {
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
            let columns = unsafe { $Columns::pack(n, k, b, ldb) };
            let ahead = prefetch_distance(2 * lda * std::mem::size_of::<$Block>());
            // The columns in groups that stay in L2 while every row of the share passes them.
            let group = columns_in_l2(columns.column_bytes()).min(n);
            let mut first = 0;
            while first < n {
                let width = group.min(n - first);
                macro_rules! run {
                    ($R:literal, $C:literal, $i:expr, $j:expr) => {{
                        let (i, j) = ($i, $j);
                        unsafe {
                            $tile::<$R, $C>(k, std::array::from_fn(|r| a.add((i + r) * lda)), &columns, first + j, ahead)
                        }
                    }};
                }
                each_tile!(rows.clone(), width, unsafe { c.add(first * ldc) }, ldc, run, [1 2 3 4 5 6 7] 8);
                first += width;
            }
        }
    };
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

        wide_gemm!($gemm, $Block, $tile, Columns);
    };
}

wide!(tile_q8_0, gemm_q8_0, BlockQ8, values_q8);
wide!(tile_q5_0, gemm_q5_0, BlockQ5, values_q5);

/// Rows `x` of Q4_0 weights times `C` columns packed for nibbles from column `first` (a multiple
/// of four): `out[r][c]`. Each weight block's 16 bytes of nibbles, broadcast to the four
/// columns' lanes, go into VNNI's product unsigned as they are: the low nibbles with the
/// columns' first 16 values, the high ones with their last 16. Fetches each row `ahead` bytes on.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_q4_0<const R: usize, const C: usize>(
    k: usize,
    x: [*const BlockQ4; R],
    columns: &NibbleColumns,
    first: usize,
    ahead: usize,
) -> [[f32; C]; R] {
    let groups = C.div_ceil(4);
    let entries = unsafe { columns.entries.as_ptr().add(first / 4 * k) };
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mask = _mm512_set1_epi8(0x0f);
    for b in 0..k {
        if b % 4 == 0 {
            fetch_ahead(x, b, ahead);
        }
        let mut low = [_mm512_setzero_si512(); R];
        let mut high = [_mm512_setzero_si512(); R];
        let mut dx = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let block = unsafe { x[r].add(b) };
            let packed = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(addr_of!((*block).qs).cast()) });
            low[r] = _mm512_and_si512(packed, mask);
            high[r] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), mask);
            dx[r] = _mm512_set1_ps(f16_to_f32(unsafe { BlockQ4::scale_bits(block) }));
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

wide_gemm!(gemm_q4_0, BlockQ4, tile_q4_0, NibbleColumns);
