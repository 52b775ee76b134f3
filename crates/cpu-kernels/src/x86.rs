//! The kernels, for three x86 feature levels: `v3` (AVX2, FMA, F16C: every x86 CPU these
//! servers run on), `avxvnni` (adds AVX-VNNI's `vpdpbusd` on 256-bit registers: Intel's client
//! cores from Alder Lake on) and `v4` (adds AVX-512 BW/VL and VNNI; only it has K-quant kernels
//! for the GGUF's own blocks, `k_quants.rs`).
//! Each computes a block's 32 products as ggml's x86 kernels do (absolute values of `x` times `y`
//! with `x`'s signs, summed in int32) and scales the block's sum by the same two f16 scales; it
//! only keeps four float accumulators where ggml keeps one, so consecutive blocks do not wait on
//! each other.
#![allow(unsafe_code, reason = "SIMD intrinsics on raw ggml blocks")]
#![allow(clippy::undocumented_unsafe_blocks, reason = "every block here reads the caller's ggml rows")]

use std::arch::x86_64::*;
use std::ptr::{addr_of, read_unaligned};

/// Values per block of both types.
pub const QK: usize = 32;

/// ggml's `block_q8_0`: an f16 scale and 32 signed bytes.
#[repr(C, packed)]
pub struct BlockQ8 {
    pub d: u16,
    pub qs: [i8; QK],
}

/// ggml's `block_q5_0`: an f16 scale, the fifth bit of each of 32 values, and their low nibbles
/// (value `j` in the low nibble of byte `j`, value `j + 16` in its high nibble); a value is
/// `nibble | fifth_bit << 4`, less 16.
#[repr(C, packed)]
pub struct BlockQ5 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// ggml's `block_q4_0`: an f16 scale and the low nibbles of 32 values (value `j` in the low
/// nibble of byte `j`, value `j + 16` in its high nibble); a value is its nibble less 8.
#[repr(C, packed)]
pub struct BlockQ4 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

const _: () = assert!(
    std::mem::size_of::<BlockQ8>() == 34
        && std::mem::size_of::<BlockQ5>() == 22
        && std::mem::size_of::<BlockQ4>() == 18
);

/// The block types a weight row can hold.
pub trait Block {
    /// The block's f16 scale, as bits.
    ///
    /// # Safety
    /// `this` points to a whole block.
    unsafe fn scale_bits(this: *const Self) -> u16;
}

impl Block for BlockQ8 {
    unsafe fn scale_bits(this: *const Self) -> u16 {
        // SAFETY: the caller's.
        unsafe { read_unaligned(addr_of!((*this).d)) }
    }
}

impl Block for BlockQ5 {
    unsafe fn scale_bits(this: *const Self) -> u16 {
        // SAFETY: the caller's.
        unsafe { read_unaligned(addr_of!((*this).d)) }
    }
}

impl Block for BlockQ4 {
    unsafe fn scale_bits(this: *const Self) -> u16 {
        // SAFETY: the caller's.
        unsafe { read_unaligned(addr_of!((*this).d)) }
    }
}

/// How far ahead of the block being multiplied the weights are fetched into cache, in bytes. A
/// decode step streams every weight once, and ggml hands each thread runs of 16-64 rows of under
/// 1 KiB: the hardware prefetchers, which restart at each run and each 4 KiB page, left both
/// cores waiting on memory at under half the bandwidth a plain sequential read gets here.
/// Measured on a 2-core Zen 5, one stream's token: 16.5 ms without, 17.9 ms at 512 bytes, 15.4 at
/// 1 KiB, 14.5 at 2 KiB, 13.5-13.8 from 4 KiB to 32 KiB. Past the matrix's end it only fetches
/// (prefetches never fault).
const PREFETCH_AHEAD: usize = 4096;

/// How far ahead the 16-row layouts' weights are fetched where one activation row is multiplied
/// (a decoding stream's step), in bytes: a group's block goes by in a few nanoseconds there, and
/// 4 KiB ([`PREFETCH_AHEAD`]) is under two of them. One sampled stream of qwen2.5-coder-1.5b
/// Q4_K_M, 2-core Zen 4, answers alternated within one server: inter-token latency 36.5 ms at 4
/// KiB, 34.8 at 16 KiB (8 and 32 KiB within the noise of 16).
const ONE_ROW_AHEAD: usize = 16 << 10;

/// 16 bytes of packed nibbles as 32 bytes in value order (value `j` in byte `j`: the low nibbles
/// first, then the high ones), as Q5_0 and Q4_0 blocks hold them.
///
/// # Safety
/// `qs` points to 16 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    // SAFETY: the caller's.
    let packed = unsafe { _mm_loadu_si128(qs.cast()) };
    let low = _mm_set1_epi8(0x0f);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(packed), low), _mm_and_si128(packed, low))
}

/// A Q5_0 block's 32 low nibbles in value order, both levels' first step.
///
/// # Safety
/// `b` points to a whole block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn low_nibbles(b: *const BlockQ5) -> __m256i {
    // SAFETY: the caller's.
    unsafe { nibbles(addr_of!((*b).qs).cast()) }
}

/// A Q4_0 block's 32 values as signed bytes (-8..=7), as ggml's x86 kernels unpack them; the
/// same at both levels.
///
/// # Safety
/// `b` points to a whole block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn values_q4(b: *const BlockQ4) -> __m256i {
    // SAFETY: the caller's.
    _mm256_sub_epi8(unsafe { nibbles(addr_of!((*b).qs).cast()) }, _mm256_set1_epi8(8))
}

/// Fetches into L1 the three cache lines `ahead` bytes past block `at` of each of `rows`: as far
/// as four blocks of either type reach (4 × 34 bytes span two or three lines).
#[inline(always)]
fn fetch_ahead<B, const R: usize>(rows: [*const B; R], at: usize, ahead: usize) {
    for row in rows {
        let line = row.wrapping_add(at).cast::<i8>().wrapping_add(ahead);
        for l in 0..3 {
            // SAFETY: SSE is part of every x86-64 CPU, and a prefetch never faults, wherever it
            // points.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(64 * l)) };
        }
    }
}

/// How far ahead tiles of `tile` bytes of weight rows fetch each row: the same place in the row
/// of a tile [`PREFETCH_AHEAD`] or more bytes on. Fetching each row 4 KiB on instead would leave the
/// start of a tile's second row unfetched where rows are longer than that (4,864 values: 5 KiB):
/// products with 152-block rows then took 12 ms where 28-block rows took 7.5.
pub(crate) const fn prefetch_distance(tile: usize) -> usize {
    if tile == 0 {
        return PREFETCH_AHEAD;
    }
    tile * PREFETCH_AHEAD.div_ceil(tile)
}

/// The loops of a `gemm`: the weight rows of `$rows` in pairs (a last odd row alone), and for
/// each the `$n` columns in groups of `$max` (the last one smaller, one of `$C`); `$run!(R, C, i,
/// j)` gives the tile of rows `i..i + R` and columns `j..j + C` as `out[r][q]`, written to
/// `$c[(j + q) * $ldc + i + r]`.
macro_rules! each_tile {
    ($rows:expr, $n:expr, $c:expr, $ldc:expr, $run:ident, [$($C:literal)*] $max:literal) => {{
        let (rows, n, c, ldc): (std::ops::Range<usize>, usize, *mut f32, usize) = ($rows, $n, $c, $ldc);
        macro_rules! write {
            ($out:expr, $i:expr, $j:expr) => {
                for (r, row) in $out.iter().enumerate() {
                    for (q, v) in row.iter().enumerate() {
                        unsafe { *c.add(($j + q) * ldc + $i + r) = *v };
                    }
                }
            };
        }
        let mut i = rows.start;
        while i < rows.end {
            let pair = i + 2 <= rows.end;
            let mut j = 0;
            while j < n {
                match (pair, n - j) {
                    $((true, $C) => write!($run!(2, $C, i, j), i, j),
                    (false, $C) => write!($run!(1, $C, i, j), i, j),)*
                    (true, _) => write!($run!(2, $max, i, j), i, j),
                    (false, _) => write!($run!(1, $max, i, j), i, j),
                }
                j += $max;
            }
            i += if pair { 2 } else { 1 };
        }
    }};
}

#[macro_use]
mod rows16;

mod iq4_xs;
mod iq4_xs_rows16;
mod k_quants;
mod q4_k;
mod q4_k_rows16;
mod q5_k;
mod q5_k_rows16;
mod q6_k;
mod q6_k_rows16;
mod q8_k;
mod rows16_avx2;
#[cfg(test)]
mod rows16_avx2_tests;
mod rows16_avxvnni;
mod wide;
mod wide_prompt;
mod wide_row;

use rows16::{repack_each, repacked_rows16};

pub use iq4_xs::BlockIQ4XS;
pub use iq4_xs_rows16::{repack_iq4_xs_rows16, repack_iq4_xs_rows16_into, IQ4XSRows16};
pub use k_quants::{BlockQ8K, QK_K};
pub use q4_k::BlockQ4K;
pub use q4_k_rows16::{repack_q4_k_rows16, repack_q4_k_rows16_into, NibbleRows16, Q4KRows16};
pub use q5_k::BlockQ5K;
pub use q5_k_rows16::{repack_q5_k_rows16, repack_q5_k_rows16_into, Q5KRows16};
pub use q6_k::BlockQ6K;
pub use q6_k_rows16::{repack_q6_k_rows16, repack_q6_k_rows16_into, Q6KRows16};

/// `out[r][c] = Σ_b x[r]_b · y[c]_b` over `k` blocks for `R` weight rows and `C` activation
/// columns at once: each weight block is loaded (and its signs taken) once for all `C` columns,
/// each activation block once for all `R` rows, and the `R × C` sums are independent chains.
/// `dy[c]` holds column `c`'s `k` block scales as f32; each row is fetched `ahead` bytes on.
macro_rules! tile {
    ($features:literal, $name:ident, $Block:ty, $values:ident) => {
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn $name<const R: usize, const C: usize>(
            k: usize,
            x: [*const $Block; R],
            y: [*const BlockQ8; C],
            dy: [*const f32; C],
            ahead: usize,
        ) -> [[f32; C]; R] {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for b in 0..k {
                if b % 4 == 0 {
                    fetch_ahead(x, b, ahead);
                }
                let mut xv = [_mm256_setzero_si256(); R];
                let mut dx = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    let block = unsafe { x[r].add(b) };
                    xv[r] = $values(block);
                    dx[r] = _mm256_set1_ps(f16_to_f32(unsafe { <$Block as Block>::scale_bits(block) }));
                }
                for c in 0..C {
                    let yv = values_q8(unsafe { y[c].add(b) });
                    let dyc = _mm256_set1_ps(unsafe { *dy[c].add(b) });
                    for r in 0..R {
                        let p = mul_sum(xv[r], yv);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dyc), p, acc[r][c]);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = hsum(acc[r][c]);
                }
            }
            out
        }
    };
}

/// The product of weight rows `rows` of `a` (`lda` blocks apart) with `n` columns of Q8_0
/// activations `b` (`ldb` blocks apart), `k` blocks long: `c[j * ldc + i] = a_i · b_j`, as
/// llamafile's `sgemm` lays it out. Rows go in pairs, columns in fours, a row pair's columns
/// one group after another while its weights are still in L1.
macro_rules! gemm {
    ($features:literal, $name:ident, $Block:ty, $tile:ident) => {
        /// # Safety
        /// `a` holds every row in `rows`, `b` `n` columns, each `k` blocks long; `c` has room
        /// for every `j * ldc + i`; and this CPU has the level's features.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn $name(
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
            let dy: Vec<f32> =
                (0..n * k).map(|i| f16_to_f32(unsafe { BlockQ8::scale_bits(b.add((i / k) * ldb + i % k)) })).collect();
            let ahead = prefetch_distance(2 * lda * std::mem::size_of::<$Block>());
            let column = |j: usize| unsafe { b.add(j * ldb) };
            let scales = |j: usize| unsafe { dy.as_ptr().add(j * k) };
            /// One tile: rows `i..i + R`, columns `j..j + C`.
            macro_rules! run {
                ($R:literal, $C:literal, $i:expr, $j:expr) => {{
                    let (i, j) = ($i, $j);
                    unsafe {
                        $tile::<$R, $C>(
                            k,
                            std::array::from_fn(|r| a.add((i + r) * lda)),
                            std::array::from_fn(|q| column(j + q)),
                            std::array::from_fn(|q| scales(j + q)),
                            ahead,
                        )
                    }
                }};
            }
            each_tile!(rows, n, c, ldc, run, [1 2 3] 4);
        }
    };
}

/// Stamps out one feature level: `$values_q5` unpacks a Q5_0 block into 32 signed bytes,
/// `$mul_sum` turns 32 signed byte pairs into 8 float lanes of their int32 pair sums, and
/// `$tail` is the level's `gemm_q8_0`, `gemm_q5_0` and `gemm_q4_0` for a few rows of activations.
macro_rules! level {
    ($level:ident, $features:literal, $values_q5:item, $mul_sum:item, $($tail:item)*) => {
        pub mod $level {
            use super::*;

            #[target_feature(enable = $features)]
            #[inline]
            $values_q5

            #[target_feature(enable = $features)]
            #[inline]
            $mul_sum

            #[target_feature(enable = $features)]
            #[inline]
            pub(crate) fn values_q8(b: *const BlockQ8) -> __m256i {
                unsafe { _mm256_loadu_si256(addr_of!((*b).qs).cast()) }
            }

            /// The four blocks' combined scales, `x.d * y.d` as ggml computes them (f32 products
            /// of the f16 values).
            #[target_feature(enable = $features)]
            #[inline]
            fn scales<B: Block>(x: *const B, y: *const BlockQ8) -> [f32; 4] {
                let (mut xs, mut ys) = (0i64, 0i64);
                for k in 0..4 {
                    unsafe {
                        xs |= i64::from(B::scale_bits(x.add(k))) << (16 * k);
                        ys |= i64::from(BlockQ8::scale_bits(y.add(k))) << (16 * k);
                    }
                }
                let mut out = [0f32; 4];
                let product = _mm_mul_ps(_mm_cvtph_ps(_mm_set_epi64x(0, xs)), _mm_cvtph_ps(_mm_set_epi64x(0, ys)));
                unsafe { _mm_storeu_ps(out.as_mut_ptr(), product) };
                out
            }

            #[target_feature(enable = $features)]
            #[inline]
            pub(crate) fn f16_to_f32(bits: u16) -> f32 {
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn hsum(v: __m256) -> f32 {
                let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
                _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
            }

            /// Σ over `nb` blocks of `x · y`: blocks of four, one accumulator each, then the rest.
            macro_rules! dot_body {
                ($nb:expr, $x:expr, $y:expr, $values:ident) => {{
                    let (nb, x, y) = ($nb, $x, $y);
                    let mut acc = [_mm256_setzero_ps(); 4];
                    let mut i = 0;
                    while i + 4 <= nb {
                        fetch_ahead([x], i, PREFETCH_AHEAD);
                        let s = unsafe { scales(x.add(i), y.add(i)) };
                        for (k, acc) in acc.iter_mut().enumerate() {
                            let p = unsafe { mul_sum($values(x.add(i + k)), values_q8(y.add(i + k))) };
                            *acc = _mm256_fmadd_ps(_mm256_set1_ps(s[k]), p, *acc);
                        }
                        i += 4;
                    }
                    while i < nb {
                        let (xb, yb) = unsafe { (x.add(i), y.add(i)) };
                        let (sx, sy) = unsafe { (Block::scale_bits(xb), BlockQ8::scale_bits(yb)) };
                        let s = f16_to_f32(sx) * f16_to_f32(sy);
                        let p = mul_sum($values(xb), values_q8(yb));
                        acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(s), p, acc[0]);
                        i += 1;
                    }
                    hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
                }};
            }

            /// Σ over `nb` blocks of `x · y`.
            ///
            /// # Safety
            /// `x` and `y` point to `nb` blocks each, and this CPU has the level's features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q8_0(nb: usize, x: *const BlockQ8, y: *const BlockQ8) -> f32 {
                dot_body!(nb, x, y, values_q8)
            }

            /// Σ over `nb` blocks of `x · y`.
            ///
            /// # Safety
            /// `x` and `y` point to `nb` blocks each, and this CPU has the level's features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q5_0(nb: usize, x: *const BlockQ5, y: *const BlockQ8) -> f32 {
                dot_body!(nb, x, y, values_q5)
            }

            /// Σ over `nb` blocks of `x · y`.
            ///
            /// # Safety
            /// `x` and `y` point to `nb` blocks each, and this CPU has the level's features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q4_0(nb: usize, x: *const BlockQ4, y: *const BlockQ8) -> f32 {
                dot_body!(nb, x, y, values_q4)
            }

            $($tail)*
        }
    };
}

level!(
    v3,
    "avx2,fma,f16c",
    pub(crate) fn values_q5(b: *const BlockQ5) -> __m256i {
        let nibbles = unsafe { low_nibbles(b) };
        unsafe {
            // Byte j gets bit j of the fifth bits (ggml's bytes_from_bits_32): spread the word
            // over the bytes, set every other bit, and see which bytes are all ones.
            let qh = i32::from_le_bytes(read_unaligned(addr_of!((*b).qh)));
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh),
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
            );
            let set = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                _mm256_set1_epi64x(-1),
            );
            // Without its fifth bit a value is its nibble less 16: the nibble with 0xF0 above it.
            _mm256_or_si256(nibbles, _mm256_andnot_si256(set, _mm256_set1_epi8(0xf0u8 as i8)))
        }
    },
    fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    },
    tile!("avx2,fma,f16c", tile_q8_0, BlockQ8, values_q8);
    tile!("avx2,fma,f16c", tile_q5_0, BlockQ5, values_q5);
    tile!("avx2,fma,f16c", tile_q4_0, BlockQ4, values_q4);
    gemm!("avx2,fma,f16c", gemm_q8_0, BlockQ8, tile_q8_0);
    gemm!("avx2,fma,f16c", gemm_q5_0, BlockQ5, tile_q5_0);
    gemm!("avx2,fma,f16c", gemm_q4_0, BlockQ4, tile_q4_0);
    pub use super::{
        q8_k::quantize_q8_k_avx2 as quantize_q8_k,
        rows16_avx2::{gemm_iq4_xs_rows16, gemm_q4_k_rows16, gemm_q5_k_rows16, gemm_q6_k_rows16},
    };
);

level!(
    avxvnni,
    "avx2,fma,f16c,avxvnni",
    fn values_q5(b: *const BlockQ5) -> __m256i {
        super::v3::values_q5(b)
    },
    fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
        let sums = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_cvtepi32_ps(sums)
    },
    tile!("avx2,fma,f16c,avxvnni", tile_q8_0, BlockQ8, values_q8);
    tile!("avx2,fma,f16c,avxvnni", tile_q5_0, BlockQ5, values_q5);
    tile!("avx2,fma,f16c,avxvnni", tile_q4_0, BlockQ4, values_q4);
    gemm!("avx2,fma,f16c,avxvnni", gemm_q8_0, BlockQ8, tile_q8_0);
    gemm!("avx2,fma,f16c,avxvnni", gemm_q5_0, BlockQ5, tile_q5_0);
    gemm!("avx2,fma,f16c,avxvnni", gemm_q4_0, BlockQ4, tile_q4_0);
    pub use super::{
        q8_k::quantize_q8_k_avx2 as quantize_q8_k,
        rows16_avxvnni::{gemm_iq4_xs_rows16, gemm_q4_k_rows16, gemm_q5_k_rows16, gemm_q6_k_rows16},
    };
);

level!(
    v4,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    pub(crate) fn values_q5(b: *const BlockQ5) -> __m256i {
        let nibbles = unsafe { low_nibbles(b) };
        unsafe {
            let fifth = u32::from_le_bytes(read_unaligned(addr_of!((*b).qh)));
            // Where the fifth bit is clear the value is its nibble less 16 (0xF0 above it).
            _mm256_mask_blend_epi8(fifth, _mm256_or_si256(nibbles, _mm256_set1_epi8(0xf0u8 as i8)), nibbles)
        }
    },
    fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
        let pairs = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_cvtepi32_ps(pairs)
    },
    pub use super::{
        iq4_xs::{dot_iq4_xs, gemm_iq4_xs},
        iq4_xs_rows16::gemm_iq4_xs_rows16,
        q4_k::{dot_q4_k, gemm_q4_k},
        q4_k_rows16::gemm_q4_k_rows16,
        q5_k::{dot_q5_k, gemm_q5_k},
        q5_k_rows16::gemm_q5_k_rows16,
        q6_k::{dot_q6_k, gemm_q6_k},
        q6_k_rows16::gemm_q6_k_rows16,
        q8_k::quantize_q8_k,
        wide::{gemm_q4_0, gemm_q5_0, gemm_q8_0},
        wide_row::{gemv_q4_0, gemv_q8_0},
    };
);

#[cfg(test)]
mod tests {
    #[test]
    fn tiles_fetch_the_same_place_of_a_tile_at_least_4_kib_on() {
        for tile in [1, 68, 1904, 4096, 4097, 10336, 65536] {
            let ahead = super::prefetch_distance(tile);
            assert_eq!(ahead % tile, 0, "tile {tile}: {ahead}");
            assert!(ahead >= super::PREFETCH_AHEAD && ahead < super::PREFETCH_AHEAD + tile, "tile {tile}: {ahead}");
        }
        assert_eq!(super::prefetch_distance(0), super::PREFETCH_AHEAD);
    }
}
