//! The AVX-512 level's products of many rows of activations (a prompt's ubatch): eight activation
//! columns side by side in each 512-bit register, eight values of each, and a weight block's
//! eight-value quarters broadcast to the eight.
//!
//! The weights are VNNI's unsigned side, offset as in [`super::wide`] (Q4_0 `q − 8`, Q5_0
//! `q − 16`, Q8_0 `x + 128`), and each column's `−o·Σy` starts its sums. A block against eight
//! columns is then four byte multiply-adds, and one conversion, one product of the scales and
//! one fused add cover 256 products, where four columns a register spend them on 128: fewer
//! instructions for the same sums, which is what bounds a prompt's products once the activations
//! sit in L2.
#![allow(clippy::needless_range_loop, reason = "tiles index rows and columns of fixed arrays")]

use super::v4::{f16_to_f32, values_q5};
use super::*;

/// One block of eight activation columns: quarter `i` holds values `8i..8i + 8` of column `c` in
/// its 64-bit lane `c`; each column's scale in its two 32-bit lanes, its `−o·Σy` in the first.
#[repr(C)]
struct EightColumnBlock {
    quarters: [__m512i; 4],
    scales: __m512,
    start: __m512i,
}

/// The activation columns in groups of eight ([`EightColumnBlock`]s, group after group, `k`
/// each), for weights whose values are offset by `o`; columns past the last are zeros.
struct EightColumns {
    k: usize,
    entries: Vec<EightColumnBlock>,
}

impl EightColumns {
    /// # Safety
    /// `b` holds `n` columns of `k` blocks, `ldb` blocks apart.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pack(n: usize, k: usize, b: *const BlockQ8, ldb: usize, offset: i32) -> Self {
        let groups = n.div_ceil(8);
        let mut entries = Vec::with_capacity(groups * k);
        for g in 0..groups {
            for i in 0..k {
                let mut quarters = [[0i8; 64]; 4];
                let (mut scales, mut starts) = ([0f32; 16], [0i32; 16]);
                for q in 0..8 {
                    let j = 8 * g + q;
                    if j < n {
                        let at = unsafe { b.add(j * ldb + i) };
                        let values: [i8; QK] = unsafe { read_unaligned(addr_of!((*at).qs)) };
                        for (quarter, bytes) in quarters.iter_mut().enumerate() {
                            bytes[8 * q..8 * q + 8].copy_from_slice(&values[8 * quarter..8 * quarter + 8]);
                        }
                        let d = f16_to_f32(unsafe { BlockQ8::scale_bits(at) });
                        (scales[2 * q], scales[2 * q + 1]) = (d, d);
                        starts[2 * q] = -offset * values.iter().map(|&v| i32::from(v)).sum::<i32>();
                    }
                }
                entries.push(EightColumnBlock {
                    quarters: quarters.map(|bytes| unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }),
                    scales: unsafe { _mm512_loadu_ps(scales.as_ptr()) },
                    start: unsafe { _mm512_loadu_si512(starts.as_ptr().cast()) },
                });
            }
        }
        Self { k, entries }
    }

    /// Bytes a column takes.
    fn column_bytes(&self) -> usize {
        self.k * std::mem::size_of::<EightColumnBlock>() / 8
    }
}

/// A Q4_0 block's values plus 8 in quarters, each broadcast to the eight 64-bit lanes: the low
/// nibbles of bytes 0-7 and 8-15 (values 0-15), then their high nibbles (values 16-31).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn quarters_q4_0(block: *const BlockQ4) -> [__m512i; 4] {
    let qs = unsafe { addr_of!((*block).qs).cast::<i64>() };
    let (first, second) =
        unsafe { (_mm512_set1_epi64(read_unaligned(qs)), _mm512_set1_epi64(read_unaligned(qs.add(1)))) };
    let mask = _mm512_set1_epi8(0x0f);
    [
        _mm512_and_si512(first, mask),
        _mm512_and_si512(second, mask),
        _mm512_and_si512(_mm512_srli_epi16::<4>(first), mask),
        _mm512_and_si512(_mm512_srli_epi16::<4>(second), mask),
    ]
}

/// A Q5_0 block's values plus 16, in quarters broadcast as [`quarters_q4_0`]'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn quarters_q5_0(block: *const BlockQ5) -> [__m512i; 4] {
    let mut values = [0i64; 4];
    let unsigned = _mm256_add_epi8(values_q5(block), _mm256_set1_epi8(16));
    unsafe { _mm256_storeu_si256(values.as_mut_ptr().cast(), unsigned) };
    values.map(|v| _mm512_set1_epi64(v))
}

/// A Q8_0 block's values plus 128 (the sign bit flipped), in quarters broadcast as
/// [`quarters_q4_0`]'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn quarters_q8_0(block: *const BlockQ8) -> [__m512i; 4] {
    let qs = unsafe { addr_of!((*block).qs).cast::<u64>() };
    // The sign bits flipped before the broadcast: flipped after it, as a vector `xor`, LLVM's
    // code generation for the tiles took more than 24 GB.
    let quarter = |i: usize| _mm512_set1_epi64((unsafe { read_unaligned(qs.add(i)) } ^ 0x8080_8080_8080_8080) as i64);
    [quarter(0), quarter(1), quarter(2), quarter(3)]
}

/// How many packed columns one group holds: about 256 KiB, a quarter of a Zen 5 or Sapphire
/// Rapids core's L2, in whole tiles of sixteen. Without groups every pair of weight rows swept all
/// of a prompt's columns (512 of 4,864 values: 9.7 MB) from L3: prompts of 1,531 tokens on
/// qwen2.5-coder-1.5b at Q4_0 went 118 → 145-148 tok/s with groups of 64 KiB to 512 KiB (2-core
/// Zen 5), the 0.5B's (Q5_0 and Q8_0 products) 475 → 492-533.
fn columns_in_l2(column_bytes: usize) -> usize {
    const GROUP_BYTES: usize = 256 << 10;
    (GROUP_BYTES / column_bytes.max(1)).max(16) / 16 * 16
}

macro_rules! prompt_tile {
    ($tile:ident, $products:ident, $gemm:ident, $Block:ty, $quarters:ident, $offset:literal) => {
        /// Rows `x` times `C` (8 or 16) packed columns from column `first` (a multiple of eight):
        /// `out[r][c]`. Fetches each row `ahead` bytes on.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn $tile<const R: usize, const C: usize>(
            k: usize,
            x: [*const $Block; R],
            columns: &EightColumns,
            first: usize,
            ahead: usize,
        ) -> [[f32; C]; R] {
            let groups = C / 8;
            let entries = unsafe { columns.entries.as_ptr().add(first / 8 * k) };
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for b in 0..k {
                if b % 4 == 0 {
                    fetch_ahead(x, b, ahead);
                }
                let mut w = [[_mm512_setzero_si512(); 4]; R];
                let mut dx = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    let block = unsafe { x[r].add(b) };
                    w[r] = unsafe { $quarters(block) };
                    dx[r] = _mm512_set1_ps(f16_to_f32(unsafe { <$Block as Block>::scale_bits(block) }));
                }
                for g in 0..groups {
                    let e = unsafe { &*entries.add(g * k + b) };
                    for r in 0..R {
                        let mut sums = e.start;
                        for i in 0..4 {
                            sums = _mm512_dpbusd_epi32(sums, w[r][i], e.quarters[i]);
                        }
                        acc[r][g] =
                            _mm512_fmadd_ps(_mm512_mul_ps(dx[r], e.scales), _mm512_cvtepi32_ps(sums), acc[r][g]);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for r in 0..R {
                for g in 0..groups {
                    let mut lanes = [0f32; 16];
                    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r][g]) };
                    for q in 0..8 {
                        out[r][8 * g + q] = lanes[2 * q] + lanes[2 * q + 1];
                    }
                }
            }
            out
        }

        /// Weight rows `rows` times `width` columns of `columns` from column `first`, into `c`
        /// as llamafile's `sgemm` lays it out: rows in fours (the last in a pair and alone),
        /// columns in sixteens (the last in an eight, its padding not written).
        ///
        /// # Safety
        /// `a` holds every row in `rows`, `k` blocks each, `lda` apart; `c` has room for every
        /// `(j − first) * ldc + i`; and this CPU has AVX-512 BW/VL and VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::too_many_arguments, reason = "a gemm's own parameters")]
        unsafe fn $products(
            rows: std::ops::Range<usize>,
            columns: &EightColumns,
            first: usize,
            width: usize,
            a: *const $Block,
            lda: usize,
            c: *mut f32,
            ldc: usize,
            ahead: usize,
        ) {
            let k = columns.k;
            macro_rules! write {
                ($R:literal, $C:literal, $i:expr, $j:expr, $cols:expr) => {{
                    let (i, j) = ($i, $j);
                    let out = unsafe {
                        $tile::<$R, $C>(k, std::array::from_fn(|r| a.add((i + r) * lda)), columns, first + j, ahead)
                    };
                    for (r, row) in out.iter().enumerate() {
                        for (q, v) in row.iter().take($cols).enumerate() {
                            unsafe { *c.add((j + q) * ldc + i + r) = *v };
                        }
                    }
                }};
            }
            let mut i = rows.start;
            while i < rows.end {
                let left = rows.end - i;
                let r = if left >= 4 {
                    4
                } else if left >= 2 {
                    2
                } else {
                    1
                };
                let mut j = 0;
                while j < width {
                    let cols = (width - j).min(16);
                    match (r, cols > 8) {
                        (4, true) => write!(4, 16, i, j, cols),
                        (4, false) => write!(4, 8, i, j, cols),
                        (2, true) => write!(2, 16, i, j, cols),
                        (2, false) => write!(2, 8, i, j, cols),
                        (_, true) => write!(1, 16, i, j, cols),
                        (_, false) => write!(1, 8, i, j, cols),
                    }
                    j += 16;
                }
                i += r;
            }
        }

        /// [`super::wide`]'s product for more than 8 columns: every column packed
        /// (`n · k · 48` bytes), then the columns in groups that stay in L2 while every row of
        /// the share passes them.
        ///
        /// # Safety
        /// As [`super::wide`]'s.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub(super) unsafe fn $gemm(
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
            let columns = unsafe { EightColumns::pack(n, k, b, ldb, $offset) };
            let ahead = prefetch_distance(4 * lda * std::mem::size_of::<$Block>());
            let group = columns_in_l2(columns.column_bytes()).min(n);
            let mut first = 0;
            while first < n {
                let width = group.min(n - first);
                unsafe { $products(rows.clone(), &columns, first, width, a, lda, c.add(first * ldc), ldc, ahead) };
                first += width;
            }
        }
    };
}

prompt_tile!(tile_q4_0, products_q4_0, gemm_q4_0, BlockQ4, quarters_q4_0, 8);
prompt_tile!(tile_q5_0, products_q5_0, gemm_q5_0, BlockQ5, quarters_q5_0, 16);
prompt_tile!(tile_q8_0, products_q8_0, gemm_q8_0, BlockQ8, quarters_q8_0, 128);
