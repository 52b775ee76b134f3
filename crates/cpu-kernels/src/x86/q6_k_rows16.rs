//! Q6_K weights repacked 16 rows to a register, as `q4_k_rows16` lays out Q4_K: four values of a
//! row in each 32-bit lane, their low four bits as nibbles and their top two bits in a register
//! of their own; 228 bytes a row where Q6_K has 210 (the scales are 16-bit here, and a group is
//! padded to whole cache lines). The `+ 32` of the unsigned values comes off through
//! the activations' block sums times the scales, for 16 rows at once. With the weights in L2
//! (2-core Zen 4, `q6_k_rows16_bench`) it takes 1.7 ns a block and activation row at 4 rows
//! where `gemm_q6_k` takes 4.0. The integer sums are ggml's.

use super::k_quants::BlockQ8K;
use super::q6_k::BlockQ6K;
use super::*;

/// One block of 16 weight rows, sub-block `s` being values `16s..16s + 16` (one scale): bytes
/// `4r..4r + 4` of `nibbles[s][i]` hold row `r`'s values `16s + 4i + j` (low nibbles) and
/// `16s + 8 + 4i + j` (high); byte `4r + j` of `high[s]` the top two bits of values `16s + 4q + j`
/// at bits `2q`; `scales[p]` each row's scales of sub-blocks `2p` and `2p + 1` as a pair of
/// 16-bit integers; `d` each row's f16 scale.
#[repr(C, align(64))]
pub struct Q6KRows16 {
    nibbles: [[[u8; 64]; 2]; 16],
    high: [[u8; 64]; 16],
    scales: [[i16; 32]; 8],
    d: [u16; 16],
}

/// `rows` rows of `k` Q6_K blocks (`lda` blocks apart) as `rows / 16` groups of `k` blocks,
/// group after group: what [`gemm_q6_k_rows16`] multiplies. Panics unless `rows` is a multiple of
/// 16 and `a` holds every row.
pub fn repack_q6_k_rows16(a: &[BlockQ6K], rows: usize, k: usize, lda: usize) -> Vec<Q6KRows16> {
    repacked_rows16(a, rows, k, lda, repack_q6_k_rows16_into)
}

/// [`repack_q6_k_rows16`] into `out`: as many groups of 16 rows as it holds `k` blocks of, every one
/// written. Panics unless `out` holds whole groups and `a` every row of them.
pub fn repack_q6_k_rows16_into(a: &[BlockQ6K], k: usize, lda: usize, out: &mut [std::mem::MaybeUninit<Q6KRows16>]) {
    let rows = out.len().checked_div(k).unwrap_or(0) * 16;
    assert!(
        (k == 0 || out.len().is_multiple_of(k)) && (rows == 0 || a.len() >= (rows - 1) * lda + k),
        "{rows} rows of {k} blocks, {lda} apart"
    );
    for group in 0..rows / 16 {
        for b in 0..k {
            let mut g =
                Q6KRows16 { nibbles: [[[0; 64]; 2]; 16], high: [[0; 64]; 16], scales: [[0; 32]; 8], d: [0; 16] };
            for r in 0..16 {
                let block = &a[(16 * group + r) * lda + b];
                g.d[r] = block.d;
                let values = values(block);
                for s in 0..16 {
                    g.scales[s / 2][2 * r + s % 2] = i16::from(block.scales[s]);
                    let v = &values[16 * s..16 * s + 16];
                    for j in 0..4 {
                        for i in 0..2 {
                            g.nibbles[s][i][4 * r + j] = (v[4 * i + j] & 0xf) | ((v[8 + 4 * i + j] & 0xf) << 4);
                        }
                        g.high[s][4 * r + j] =
                            (v[j] >> 4) | ((v[4 + j] >> 4) << 2) | ((v[8 + j] >> 4) << 4) | ((v[12 + j] >> 4) << 6);
                    }
                }
            }
            out[group * k + b].write(g);
        }
    }
}

/// A block's 256 values as `q6_k::value` reads them one by one, unpacked in one pass.
fn values(b: &BlockQ6K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (&b.ql[64 * half..64 * half + 64], &b.qh[32 * half..32 * half + 32]);
        let out = &mut v[128 * half..128 * half + 128];
        for l in 0..32 {
            let h = qh[l];
            out[l] = (ql[l] & 0xf) | ((h & 3) << 4);
            out[l + 32] = (ql[l + 32] & 0xf) | (((h >> 2) & 3) << 4);
            out[l + 64] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
            out[l + 96] = (ql[l + 32] >> 4) | ((h >> 6) << 4);
        }
    }
    v
}

/// 16 rows (`k` blocks of `g`) times `C` activation rows: lane `r` of result `c` is row `r`'s
/// product with column `c`.
///
/// # Safety
/// `g` and every `y[c]` hold `k` blocks, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn tile<const C: usize>(k: usize, g: *const Q6KRows16, y: [*const BlockQ8K; C]) -> [__m512; C] {
    let (low4, bits45) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let yb: [*const BlockQ8K; C] = std::array::from_fn(|c| unsafe { y[c].add(b) });
        let broadcast = |c: usize, at: usize| {
            _mm512_set1_epi32(unsafe { read_unaligned(addr_of!((*yb[c]).qs).cast::<u8>().add(at).cast::<i32>()) })
        };
        let mut block = [_mm512_setzero_si512(); C];
        for s in 0..16 {
            // The block's 57 lines PREFETCH_AHEAD bytes on, four a sub-block: all at once, they
            // crowded the misses in flight (one stream of the 1.5B 37.7 → 51.3 ms a token).
            let ahead = g.wrapping_add(b).cast::<i8>().wrapping_add(PREFETCH_AHEAD + 64 * 4 * s);
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
            }
            let (v0, v1, h) = unsafe {
                (
                    _mm512_load_si512(w.nibbles[s][0].as_ptr().cast()),
                    _mm512_load_si512(w.nibbles[s][1].as_ptr().cast()),
                    _mm512_load_si512(w.high[s].as_ptr().cast()),
                )
            };
            // Quads 0-3 of the sub-block; 16-bit shifts are exact here, what crosses from the
            // next byte lands outside the bits kept.
            let quads = [
                _mm512_or_si512(_mm512_and_si512(v0, low4), _mm512_and_si512(_mm512_slli_epi16::<4>(h), bits45)),
                _mm512_or_si512(_mm512_and_si512(v1, low4), _mm512_and_si512(_mm512_slli_epi16::<2>(h), bits45)),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(v0), low4), _mm512_and_si512(h, bits45)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v1), low4),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(h), bits45),
                ),
            ];
            // Each 32-bit lane holds a row's scales of sub-blocks 2p and 2p + 1: this one's,
            // sign-extended.
            let pair = unsafe { _mm512_load_si512(w.scales[s / 2].as_ptr().cast()) };
            let scale = if s % 2 == 0 {
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair))
            } else {
                _mm512_srai_epi32::<16>(pair)
            };
            for c in 0..C {
                let mut sub = _mm512_setzero_si512();
                for (q, quad) in quads.iter().enumerate() {
                    sub = _mm512_dpbusd_epi32(sub, *quad, broadcast(c, 16 * s + 4 * q));
                }
                block[c] = _mm512_add_epi32(block[c], _mm512_mullo_epi32(sub, scale));
            }
        }
        let mut offset = [_mm512_setzero_si512(); C];
        for p in 0..8 {
            let pair = unsafe { _mm512_load_si512(w.scales[p].as_ptr().cast()) };
            for c in 0..C {
                let sums = unsafe { read_unaligned(addr_of!((*yb[c]).bsums).cast::<i16>().add(2 * p).cast::<i32>()) };
                offset[c] = _mm512_dpwssd_epi32(offset[c], pair, _mm512_set1_epi32(sums));
            }
        }
        let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.d.as_ptr().cast()) });
        for c in 0..C {
            let dy = _mm512_set1_ps(unsafe { (*yb[c]).d });
            let sums = _mm512_sub_epi32(block[c], _mm512_slli_epi32::<5>(offset[c]));
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(sums), acc[c]);
        }
    }
    acc
}

/// The product of the repacked groups `groups` of `a` (each `k` blocks, as
/// [`repack_q6_k_rows16`] lays them out) with `n` columns of Q8_K activations `b` (`ldb` blocks
/// apart): `c[j * ldc + 16g + r]` is row `r` of group `g` times column `j`, as llamafile's `sgemm`
/// lays out a product of the unpacked rows. Columns go four at a time.
///
/// # Safety
/// `a` holds every group in `groups`, `b` `n` columns of `k` blocks; `c` has room for every
/// `j * ldc + 16g + r`; and this CPU has AVX-512 BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
pub unsafe fn gemm_q6_k_rows16(
    groups: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: *const Q6KRows16,
    b: *const BlockQ8K,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    macro_rules! run {
        ($C:literal, $group:expr, $j:expr) => {{
            let (group, j) = ($group, $j);
            let columns = std::array::from_fn(|q| unsafe { b.add((j + q) * ldb) });
            unsafe { tile::<$C>(k, a.add(group * k), columns) }
        }};
    }
    each_group!(groups, n, c, ldc, run);
}

#[cfg(test)]
mod tests {
    use super::super::k_quants::test_data::{check_rows16, has_level, Rng};
    use super::super::k_quants::QK_K;
    use super::super::q6_k::tests::{exact, random_q6};
    use super::super::q6_k::value;
    use super::*;

    #[test]
    fn repacking_puts_every_value_where_the_layout_says() {
        let (rows, k) = (32, 3);
        let x = random_q6(&mut Rng(5), rows * k);
        let groups = repack_q6_k_rows16(&x, rows, k, k);
        for (at, w) in groups.iter().enumerate() {
            let (group, b) = (at / k, at % k);
            for r in 0..16 {
                let block = &x[(16 * group + r) * k + b];
                assert_eq!(w.d[r], { block.d });
                for s in 0..16 {
                    assert_eq!(w.scales[s / 2][2 * r + s % 2], i16::from(block.scales[s]));
                    for j in 0..4 {
                        let v = |q: usize| value(block, 16 * s + 4 * q + j);
                        for i in 0..2 {
                            assert_eq!(
                                w.nibbles[s][i][4 * r + j],
                                (v(i) & 0xf) | ((v(2 + i) & 0xf) << 4),
                                "{at} {r} {s}"
                            );
                        }
                        assert_eq!(
                            w.high[s][4 * r + j],
                            (0..4).map(|q| (v(q) >> 4) << (2 * q)).sum::<u8>(),
                            "{at} {r} {s}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_row_and_column_equals_the_exact_sums() {
        check_rows16(&mut Rng(0x9e37_79b9_7f4a_7c15), random_q6, exact, repack_q6_k_rows16, gemm_q6_k_rows16);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        assert!(has_level(), "the machines these tests run on all have AVX-512 VNNI");
        // Six bits all set (31) or all clear (-32), scales -128 and 127, activations -128 and 127:
        // the largest magnitudes the sums meet.
        for (bits, scale, y) in [(0xffu8, -128i8, -128i8), (0, -128, -128), (0xff, 127, 127), (0, 127, -128)] {
            let x: Vec<BlockQ6K> =
                (0..16).map(|_| BlockQ6K { ql: [bits; 128], qh: [bits; 64], scales: [scale; 16], d: 0x3c00 }).collect();
            let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
            let repacked = repack_q6_k_rows16(&x, 16, 1, 1);
            let mut c = [0f32; 16];
            unsafe { gemm_q6_k_rows16(0..1, 1, 1, repacked.as_ptr(), &yb, 1, c.as_mut_ptr(), 16) };
            let q = if bits == 0 { -32 } else { 31 };
            let want = 256.0 * f64::from(scale) * f64::from(q) * f64::from(y);
            assert!(c.iter().all(|&v| f64::from(v) == want), "bits {bits:#x}, scale {scale}, y {y}: {c:?}");
        }
    }
}
