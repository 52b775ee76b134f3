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
mod levels;
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
pub use levels::{avxvnni, v3, v4};
pub use q4_k::BlockQ4K;
pub use q4_k_rows16::{repack_q4_k_rows16, repack_q4_k_rows16_into, NibbleRows16, Q4KRows16};
pub use q5_k::BlockQ5K;
pub use q5_k_rows16::{repack_q5_k_rows16, repack_q5_k_rows16_into, Q5KRows16};
pub use q6_k::BlockQ6K;
pub use q6_k_rows16::{repack_q6_k_rows16, repack_q6_k_rows16_into, Q6KRows16};

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
