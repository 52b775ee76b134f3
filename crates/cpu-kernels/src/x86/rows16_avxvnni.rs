//! The 16-row layouts of Q4_K, Q5_K, Q6_K and IQ4_XS multiplied with AVX2 and AVX-VNNI: the
//! `vpdpbusd` on 256-bit registers of Intel's client cores from Alder Lake on, which have no
//! AVX-512. Eight rows a register, two halves a group, as `rows16_avx2`
//! reads the copies; but each sub-block's products go straight into 32-bit sums, as the AVX-512
//! kernels take them (`q4_k_rows16`, `q6_k_rows16`, `iq4_xs_rows16`), where AVX2 alone needs a
//! `vpmaddubsw`, its 16-bit additions and a `vpmaddwd` by the scales. The integer sums and the
//! order of the float additions are the AVX-512 kernels', so the results are theirs bit for bit;
//! IQ4_XS takes its levels plus 128 as AVX-512 does, exact for every activation.

use super::iq4_xs_rows16::{IQ4XSRows16, BIASED};
use super::k_quants::BlockQ8K;
use super::q4_k_rows16::{sub_block_sums, NibbleRows16};
use super::q6_k_rows16::Q6KRows16;
use super::rows16_avx2::{fetch_q6_k_sub_block, fetch_sub_block, nibble_values, q6_k_quads};
use super::*;

/// Rows `8h..8h + 8` of a Q4_K or Q5_K group (`k` blocks of `g`) times `C` activation rows: lane
/// `r` of result `c` is row `8h + r`'s product with column `c`. Half 0 fetches the group's lines
/// ahead; half 1 finds them in cache.
///
/// # Safety
/// `g`, every `y[c]` and every `sums[c]` hold `k` blocks, `h` is 0 or 1, and this CPU has AVX2,
/// FMA, F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
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
            let mut sub = [_mm256_setzero_si256(); C];
            for i in 0..4 {
                let (lo, hi) = nibble_values(sub_block, i, h);
                for c in 0..C {
                    sub[c] = _mm256_dpbusd_avx_epi32(sub[c], lo, broadcast(c, 32 * s + 4 * i));
                    sub[c] = _mm256_dpbusd_avx_epi32(sub[c], hi, broadcast(c, 32 * s + 16 + 4 * i));
                }
            }
            let scale = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(w.scales[s].as_ptr().add(8 * h).cast()) });
            for c in 0..C {
                block[c] = _mm256_add_epi32(block[c], _mm256_mullo_epi32(sub[c], scale));
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
/// [`nibble_half`]. The values are stored `+ 32`: each sub-block's sum starts at `−32 ·` the sum
/// of its 16 activations.
///
/// # Safety
/// `g` and every `y[c]` hold `k` blocks, `h` is 0 or 1, and this CPU has AVX2, FMA, F16C and
/// AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
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
            let scale = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(quarter.scales[t].as_ptr().add(8 * h).cast()) });
            for c in 0..C {
                let bsum = i32::from(unsafe { (*yb[c]).bsums[s] });
                let mut sub = _mm256_set1_epi32(-32 * bsum);
                for (q, quad) in quads.iter().enumerate() {
                    sub = _mm256_dpbusd_avx_epi32(sub, *quad, broadcast(c, 16 * s + 4 * q));
                }
                block[c] = _mm256_add_epi32(block[c], _mm256_mullo_epi32(sub, scale));
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

/// Rows `8h..8h + 8` of an IQ4_XS group (`k` blocks of `g`) times `C` activation rows, as
/// [`nibble_half`]: the indices looked up among the levels plus 128, each sub-block's sum
/// starting at `−128 ·` the sum of its 32 activations.
///
/// # Safety
/// `g` and every `y[c]` hold `k` blocks, `h` is 0 or 1, and this CPU has AVX2, FMA, F16C and
/// AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn iq4_xs_half<const C: usize>(
    k: usize,
    g: *const IQ4XSRows16,
    h: usize,
    y: [*const BlockQ8K; C],
) -> [__m256; C] {
    let low4 = _mm256_set1_epi8(0x0f);
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(BIASED.as_ptr().cast()) });
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
            let mut sub: [__m256i; C] = std::array::from_fn(|c| {
                let bsums = unsafe { (*yb[c]).bsums };
                _mm256_set1_epi32(-128 * (i32::from(bsums[2 * s]) + i32::from(bsums[2 * s + 1])))
            });
            for i in 0..4 {
                let v = unsafe { _mm256_loadu_si256(w.subs[s].nibbles[i].as_ptr().add(32 * h).cast()) };
                let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4));
                let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4));
                for c in 0..C {
                    sub[c] = _mm256_dpbusd_avx_epi32(sub[c], lo, broadcast(c, 32 * s + 4 * i));
                    sub[c] = _mm256_dpbusd_avx_epi32(sub[c], hi, broadcast(c, 32 * s + 16 + 4 * i));
                }
            }
            let scale = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(w.scales[s].as_ptr().add(8 * h).cast()) });
            for c in 0..C {
                block[c] = _mm256_add_epi32(block[c], _mm256_mullo_epi32(sub[c], scale));
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

half_gemms!("avx2,fma,f16c,avxvnni", "AVX-VNNI", nibble_half, q6_k_half, iq4_xs_half);
