//! The 16-row layouts of Q4_K, Q5_K, Q6_K and IQ4_XS (`q4_k_rows16`, `q5_k_rows16`,
//! `q6_k_rows16`, `iq4_xs_rows16`) multiplied with AVX2 alone, for CPUs without AVX-512 VNNI (Zen 2 and 3, Intel's client cores):
//! the same copies, read eight rows (a 256-bit register of 32-bit lanes) at a time. AVX2 has no
//! `vpdpbusd`: `vpmaddubsw` multiplies the unsigned values by the signed activations into 16-bit
//! sums of two, and those are added up in 16 bits for as long as they cannot overflow (a
//! sub-block's 16 products of a Q4_K row, 8 of Q5_K's, 4 of Q6_K's) before one `vpmaddwd` by the
//! sub-block's scales takes them to 32 bits. The unpacking and a block's float work are paid once
//! for eight rows and up to four activation rows, where ggml's AVX2 kernels unpack Q5_K and Q6_K
//! again for every activation row and pay the float work for every weight row. IQ4_XS's signed
//! levels go in as magnitudes, their signs moved onto the activations (`vpsignb`, ggml's own
//! trick). The integer sums are ggml's, only the order of the float additions differs.

use super::iq4_xs::{LEVELS, MAGNITUDES};
use super::iq4_xs_rows16::IQ4XSRows16;
use super::k_quants::BlockQ8K;
use super::q4_k_rows16::{sub_block_sums, NibbleRows16, Sub};
use super::q6_k_rows16::{Q6KRows16, Quarter};
use super::*;

/// Each 32-bit lane's low 16 bits in both of its halves: a row's scale for both products a
/// `vpmaddwd` adds.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn in_both_halves(x: __m256i) -> __m256i {
    _mm256_blend_epi16::<0b1010_1010>(x, _mm256_slli_epi32::<16>(x))
}

/// `lo` and `hi`, the low and high nibbles of rows `8h..8h + 8` of a Q5_K register, with 16 added
/// to each byte whose fifth bit is set: byte `b`'s is bit `32h + b` of `masks[0]` (of `masks[1]`
/// for `hi`), as `q5_k_rows16` lays them out.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn add_fifth_bits(lo: __m256i, hi: __m256i, masks: &[u64], h: usize) -> (__m256i, __m256i) {
    // Both masks in each 128-bit lane (one load); byte `b` of a result takes byte `4h + b / 8` of
    // its mask, then keeps bit `b % 8` of it.
    let both = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(masks[..2].as_ptr().cast()) });
    let at = _mm256_add_epi8(
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
        _mm256_set1_epi8(4 * h as i8),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let sixteen = _mm256_set1_epi8(0x10);
    let add = |v: __m256i, at: __m256i| {
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(both, at), bit), bit);
        _mm256_add_epi8(v, _mm256_and_si256(set, sixteen))
    };
    (add(lo, at), add(hi, _mm256_add_epi8(at, _mm256_set1_epi8(8))))
}

/// Fetches `ahead_by` bytes past block `b` of group `g` (a 16-row layout `G`) into cache: sub-block
/// `s`'s share of its lines, eight shares a block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn fetch_sub_block<G>(g: *const G, b: usize, s: usize, ahead_by: usize) {
    let lines = std::mem::size_of::<G>().div_ceil(64).div_ceil(8);
    let ahead = g.wrapping_add(b).cast::<i8>().wrapping_add(ahead_by + 64 * lines * s);
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
    }
}

/// Register `i` of rows `8h..8h + 8` of a Q4_K or Q5_K sub-block, as its low and high nibbles'
/// values (the fifth bits added for Q5_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn nibble_values<const FIFTH: usize>(sub_block: &Sub<FIFTH>, i: usize, h: usize) -> (__m256i, __m256i) {
    let low4 = _mm256_set1_epi8(0x0f);
    let v = unsafe { _mm256_loadu_si256(sub_block.nibbles[i].as_ptr().add(32 * h).cast()) };
    let (lo, hi) = (_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4));
    if FIFTH > 0 {
        add_fifth_bits(lo, hi, &sub_block.fifth[2 * i..], h)
    } else {
        (lo, hi)
    }
}

/// Fetches `ahead_by` bytes past block `b` of Q6_K group `g` into cache, sub-block `s`'s lines as
/// `q6_k_rows16`'s tile takes them: the quarter's scales with its first sub-block, three lines a
/// sub-block, the scales `d` with the last.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn fetch_q6_k_sub_block(g: *const Q6KRows16, b: usize, s: usize, ahead_by: usize) {
    let (first, lines) = match s % 4 {
        0 => (13 * (s / 4), 4),
        t => (13 * (s / 4) + 1 + 3 * t, if s == 15 { 4 } else { 3 }),
    };
    let ahead = g.wrapping_add(b).cast::<i8>().wrapping_add(ahead_by + 64 * first);
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
    }
}

/// Sub-block `t` of a Q6_K quarter, rows `8h..8h + 8`: its four registers of values (stored
/// `+ 32`), each value's four bits and two top bits put together.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q6_k_quads(quarter: &Quarter, t: usize, h: usize) -> [__m256i; 4] {
    let (low4, bits45) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    let load = |i: usize| unsafe { _mm256_loadu_si256(quarter.subs[t][i].as_ptr().add(32 * h).cast()) };
    let (v0, v1, high) = (load(0), load(1), load(2));
    [
        _mm256_or_si256(_mm256_and_si256(v0, low4), _mm256_and_si256(_mm256_slli_epi16::<4>(high), bits45)),
        _mm256_or_si256(_mm256_and_si256(v1, low4), _mm256_and_si256(_mm256_slli_epi16::<2>(high), bits45)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v0), low4), _mm256_and_si256(high, bits45)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(v1), low4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(high), bits45),
        ),
    ]
}

/// Rows `8h..8h + 8` of a Q4_K or Q5_K group (`k` blocks of `g`) times `C` activation rows: lane
/// `r` of result `c` is row `8h + r`'s product with column `c`. Half 0 fetches the group's lines
/// ahead; half 1 finds them in cache.
///
/// # Safety
/// `g`, every `y[c]` and every `sums[c]` hold `k` blocks, `h` is 0 or 1, and this CPU has AVX2,
/// FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn nibble_half<const C: usize, const FIFTH: usize>(
    k: usize,
    g: *const NibbleRows16<FIFTH>,
    h: usize,
    y: [*const BlockQ8K; C],
    sums: [*const [i32; 4]; C],
) -> [__m256; C] {
    let ahead_by = if C == 1 { ONE_ROW_AHEAD } else { PREFETCH_AHEAD };
    // Registers of nibbles whose 16-bit sums are added before they overflow: a lane's two sums of
    // 8 products of values to 15 (to 31 with the fifth bit) by activations to ±128.
    let per_scale = if FIFTH > 0 { 2 } else { 4 };
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let qs: [*const u8; C] = std::array::from_fn(|c| unsafe { addr_of!((*y[c].add(b)).qs).cast::<u8>() });
        let broadcast = |c: usize, at: usize| _mm256_set1_epi32(unsafe { read_unaligned(qs[c].add(at).cast::<i32>()) });
        let mut block = [_mm256_setzero_si256(); C];
        for s in 0..8 {
            if h == 0 {
                fetch_sub_block(g, b, s, ahead_by);
            }
            let sub_block = &w.subs[s];
            let scale = in_both_halves(_mm256_cvtepu8_epi32(unsafe {
                _mm_loadl_epi64(w.scales[s].as_ptr().add(8 * h).cast())
            }));
            let mut pairs = [_mm256_setzero_si256(); C];
            for i in 0..4 {
                let (lo, hi) = nibble_values(sub_block, i, h);
                for c in 0..C {
                    let low = _mm256_maddubs_epi16(lo, broadcast(c, 32 * s + 4 * i));
                    let high = _mm256_maddubs_epi16(hi, broadcast(c, 32 * s + 16 + 4 * i));
                    pairs[c] = _mm256_add_epi16(pairs[c], _mm256_add_epi16(low, high));
                }
                if (i + 1) % per_scale == 0 {
                    for c in 0..C {
                        block[c] = _mm256_add_epi32(block[c], _mm256_madd_epi16(pairs[c], scale));
                        pairs[c] = _mm256_setzero_si256();
                    }
                }
            }
        }
        let mut mins = [_mm256_setzero_si256(); C];
        for p in 0..4 {
            let m = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(w.mins[p].as_ptr().add(16 * h).cast()) });
            for c in 0..C {
                let sum = _mm256_set1_epi32(unsafe { (*sums[c].add(b))[p] });
                mins[c] = _mm256_add_epi32(mins[c], _mm256_madd_epi16(m, sum));
            }
        }
        let d = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.d.as_ptr().add(8 * h).cast()) });
        let dmin = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.dmin.as_ptr().add(8 * h).cast()) });
        for c in 0..C {
            let dy = _mm256_set1_ps(unsafe { (*y[c].add(b)).d });
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(block[c]), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(mins[c]), acc[c]);
        }
    }
    acc
}

/// Rows `8h..8h + 8` of a Q6_K group (`k` blocks of `g`) times `C` activation rows, as
/// [`nibble_half`]. The values are stored `+ 32`: `32 ·` each row's sum of its sub-block scales
/// times the activations' sub-block sums comes off a block's sum.
///
/// # Safety
/// `g` and every `y[c]` hold `k` blocks, `h` is 0 or 1, and this CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn q6_k_half<const C: usize>(k: usize, g: *const Q6KRows16, h: usize, y: [*const BlockQ8K; C]) -> [__m256; C] {
    let ahead_by = if C == 1 { ONE_ROW_AHEAD } else { PREFETCH_AHEAD };
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let yb: [*const BlockQ8K; C] = std::array::from_fn(|c| unsafe { y[c].add(b) });
        let broadcast = |c: usize, at: usize| {
            _mm256_set1_epi32(unsafe { read_unaligned(addr_of!((*yb[c]).qs).cast::<u8>().add(at).cast::<i32>()) })
        };
        let mut block = [_mm256_setzero_si256(); C];
        for s in 0..16 {
            let (quarter, t) = (&w.quarters[s / 4], s % 4);
            if h == 0 {
                fetch_q6_k_sub_block(g, b, s, ahead_by);
            }
            let quads = q6_k_quads(quarter, t, h);
            let scale = in_both_halves(_mm256_cvtepi8_epi32(unsafe {
                _mm_loadl_epi64(quarter.scales[t].as_ptr().add(8 * h).cast())
            }));
            for c in 0..C {
                // Two 16-bit sums of values to 63 by activations to ±128 stay under 2^15.
                let p = |q: usize| _mm256_maddubs_epi16(quads[q], broadcast(c, 16 * s + 4 * q));
                let first = _mm256_madd_epi16(_mm256_add_epi16(p(0), p(1)), scale);
                let second = _mm256_madd_epi16(_mm256_add_epi16(p(2), p(3)), scale);
                block[c] = _mm256_add_epi32(block[c], _mm256_add_epi32(first, second));
            }
        }
        // Each row's scales of sub-blocks 2p and 2p + 1 side by side (16 bits each), times the
        // activations' sums of those sub-blocks.
        let mut offsets = [_mm256_setzero_si256(); C];
        for p in 0..8 {
            let scales = &w.quarters[p / 2].scales;
            let (even, odd) = unsafe {
                (
                    _mm_loadl_epi64(scales[2 * (p % 2)].as_ptr().add(8 * h).cast()),
                    _mm_loadl_epi64(scales[2 * (p % 2) + 1].as_ptr().add(8 * h).cast()),
                )
            };
            let pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(even, odd));
            for c in 0..C {
                let sums = unsafe { read_unaligned(addr_of!((*yb[c]).bsums).cast::<i16>().add(2 * p).cast::<i32>()) };
                offsets[c] = _mm256_add_epi32(offsets[c], _mm256_madd_epi16(pair, _mm256_set1_epi32(sums)));
            }
        }
        let d = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.d.as_ptr().add(8 * h).cast()) });
        for c in 0..C {
            let sum = _mm256_sub_epi32(block[c], _mm256_slli_epi32::<5>(offsets[c]));
            let dy = _mm256_set1_ps(unsafe { (*yb[c]).d });
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(sum), acc[c]);
        }
    }
    acc
}

/// IQ4_XS's levels' signs (±1), the table indices are looked up in beside their magnitudes.
const SIGNS: [i8; 16] = {
    let mut out = [0; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = LEVELS[i].signum();
        i += 1;
    }
    out
};

/// Rows `8h..8h + 8` of an IQ4_XS group (`k` blocks of `g`) times `C` activation rows, as
/// [`nibble_half`]. A 16-bit sum of two products of magnitudes to 127 by activations to ±128 has
/// no room for another: each `vpmaddubsw` goes straight to its `vpmaddwd` by the scales. An
/// activation of −128 meeting a negative level stays unnegated, as in ggml's kernels (Q8_K
/// quantization never writes −128).
///
/// # Safety
/// `g` and every `y[c]` hold `k` blocks, `h` is 0 or 1, and this CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn iq4_xs_half<const C: usize>(
    k: usize,
    g: *const IQ4XSRows16,
    h: usize,
    y: [*const BlockQ8K; C],
) -> [__m256; C] {
    let low4 = _mm256_set1_epi8(0x0f);
    let table = |t: *const u8| _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.cast()) });
    let (magnitudes, signs) = (table(MAGNITUDES.as_ptr()), table(SIGNS.as_ptr().cast()));
    let ahead_by = if C == 1 { ONE_ROW_AHEAD } else { PREFETCH_AHEAD };
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let yb: [*const BlockQ8K; C] = std::array::from_fn(|c| unsafe { y[c].add(b) });
        let broadcast = |c: usize, at: usize| {
            _mm256_set1_epi32(unsafe { read_unaligned(addr_of!((*yb[c]).qs).cast::<u8>().add(at).cast::<i32>()) })
        };
        let mut block = [_mm256_setzero_si256(); C];
        for s in 0..8 {
            if h == 0 {
                fetch_sub_block(g, b, s, ahead_by);
            }
            let scale = in_both_halves(_mm256_cvtepi8_epi32(unsafe {
                _mm_loadl_epi64(w.scales[s].as_ptr().add(8 * h).cast())
            }));
            for i in 0..4 {
                let v = unsafe { _mm256_loadu_si256(w.subs[s].nibbles[i].as_ptr().add(32 * h).cast()) };
                let (lo, hi) = (_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4));
                let (lo_magnitude, lo_sign) = (_mm256_shuffle_epi8(magnitudes, lo), _mm256_shuffle_epi8(signs, lo));
                let (hi_magnitude, hi_sign) = (_mm256_shuffle_epi8(magnitudes, hi), _mm256_shuffle_epi8(signs, hi));
                for c in 0..C {
                    let low =
                        _mm256_maddubs_epi16(lo_magnitude, _mm256_sign_epi8(broadcast(c, 32 * s + 4 * i), lo_sign));
                    let high = _mm256_maddubs_epi16(
                        hi_magnitude,
                        _mm256_sign_epi8(broadcast(c, 32 * s + 16 + 4 * i), hi_sign),
                    );
                    let both = _mm256_add_epi32(_mm256_madd_epi16(low, scale), _mm256_madd_epi16(high, scale));
                    block[c] = _mm256_add_epi32(block[c], both);
                }
            }
        }
        let d = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(w.d.as_ptr().add(8 * h).cast()) });
        for c in 0..C {
            let dy = _mm256_set1_ps(unsafe { (*yb[c]).d });
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(block[c]), acc[c]);
        }
    }
    acc
}

half_gemms!("avx2,fma,f16c", "AVX2", nibble_half, q6_k_half, iq4_xs_half);
