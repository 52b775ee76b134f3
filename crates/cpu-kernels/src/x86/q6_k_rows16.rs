//! Q6_K weights repacked 16 rows to a register, as `q4_k_rows16` lays out Q4_K: four values of a
//! row in each 32-bit lane, their low four bits as nibbles and their top two bits in a register
//! of their own, each sub-block's three registers and each quarter's scales one after the other
//! as the kernel reads them; 212 bytes a row where Q6_K has 210 (a group's block is padded to
//! whole cache lines). The `+ 32` of the unsigned values comes off through the activations'
//! block sums: each sub-block's sum starts at `−32 ·` theirs, for 16 rows at once. With the weights in L2
//! (2-core Zen 4, `q6_k_rows16_bench`) it takes 1.7 ns a block and activation row at 4 rows
//! where `gemm_q6_k` takes 4.0. The integer sums are ggml's.

use super::k_quants::BlockQ8K;
use super::q6_k::BlockQ6K;
use super::*;

/// Four sub-blocks of 16 weight rows (sub-block `t` of the quarter being values `16t..16t + 16`
/// of it, one scale): `scales[t][r]` is row `r`'s scale; bytes `4r..4r + 4` of `subs[t][i]`
/// (`i` < 2) hold row `r`'s values `4i + j` (low nibbles) and `8 + 4i + j` (high) of the
/// sub-block, and byte `4r + j` of `subs[t][2]` the top two bits of its values `4q + j` at bits
/// `2q`. 13 cache lines, read in order.
#[repr(C)]
pub(super) struct Quarter {
    pub(super) scales: [[i8; 16]; 4],
    pub(super) subs: [[[u8; 64]; 3]; 4],
}

/// One block of 16 weight rows: its four quarters (values `64q..64q + 64`) and each row's f16
/// scale.
#[repr(C, align(64))]
pub struct Q6KRows16 {
    pub(super) quarters: [Quarter; 4],
    pub(super) d: [u16; 16],
}

/// Bytes a row-block of the layout takes (53 cache lines for 16 rows).
const ROW_BYTES: usize = std::mem::size_of::<Q6KRows16>() / 16;
const _: () = assert!(std::mem::size_of::<Quarter>() == 13 * 64 && ROW_BYTES == 212);

/// `rows` rows of `k` Q6_K blocks (`lda` blocks apart) as `rows / 16` groups of `k` blocks,
/// group after group: what [`gemm_q6_k_rows16`] multiplies. Panics unless `rows` is a multiple of
/// 16 and `a` holds every row.
pub fn repack_q6_k_rows16(a: &[BlockQ6K], rows: usize, k: usize, lda: usize) -> Vec<Q6KRows16> {
    repacked_rows16(a, rows, k, lda, repack_q6_k_rows16_into)
}

/// [`repack_q6_k_rows16`] into `out`: as many groups of 16 rows as it holds `k` blocks of, every one
/// written. Panics unless `out` holds whole groups and `a` every row of them.
pub fn repack_q6_k_rows16_into(a: &[BlockQ6K], k: usize, lda: usize, out: &mut [std::mem::MaybeUninit<Q6KRows16>]) {
    let quarter = || Quarter { scales: [[0; 16]; 4], subs: [[[0; 64]; 3]; 4] };
    let empty = || Q6KRows16 { quarters: [quarter(), quarter(), quarter(), quarter()], d: [0; 16] };
    repack_each(a, k, lda, out, empty, |g, r, block| {
        g.d[r] = block.d;
        let values = values(block);
        for s in 0..16 {
            let q = &mut g.quarters[s / 4];
            q.scales[s % 4][r] = block.scales[s];
            let (v, sub) = (&values[16 * s..16 * s + 16], &mut q.subs[s % 4]);
            for j in 0..4 {
                for i in 0..2 {
                    sub[i][4 * r + j] = (v[4 * i + j] & 0xf) | ((v[8 + 4 * i + j] & 0xf) << 4);
                }
                sub[2][4 * r + j] =
                    (v[j] >> 4) | ((v[4 + j] >> 4) << 2) | ((v[8 + j] >> 4) << 4) | ((v[12 + j] >> 4) << 6);
            }
        }
    });
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
    let ahead_by = if C == 1 { ONE_ROW_AHEAD } else { PREFETCH_AHEAD };
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let yb: [*const BlockQ8K; C] = std::array::from_fn(|c| unsafe { y[c].add(b) });
        let broadcast = |c: usize, at: usize| {
            _mm512_set1_epi32(unsafe { read_unaligned(addr_of!((*yb[c]).qs).cast::<u8>().add(at).cast::<i32>()) })
        };
        let mut block = [_mm512_setzero_si512(); C];
        for s in 0..16 {
            let (quarter, t) = (&w.quarters[s / 4], s % 4);
            // The lines `ahead_by` on, as this sub-block reads them: the quarter's scales with its
            // first sub-block, three lines a sub-block, the scales `d` with the last (53 a block).
            let (first, lines) = match t {
                0 => (13 * (s / 4), 4),
                _ => (13 * (s / 4) + 1 + 3 * t, if s == 15 { 4 } else { 3 }),
            };
            let ahead = g.wrapping_add(b).cast::<i8>().wrapping_add(ahead_by + 64 * first);
            for l in 0..lines {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
            }
            let (v0, v1, h) = unsafe {
                (
                    _mm512_load_si512(quarter.subs[t][0].as_ptr().cast()),
                    _mm512_load_si512(quarter.subs[t][1].as_ptr().cast()),
                    _mm512_load_si512(quarter.subs[t][2].as_ptr().cast()),
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
            let scale = _mm512_cvtepi8_epi32(unsafe { _mm_load_si128(quarter.scales[t].as_ptr().cast()) });
            for c in 0..C {
                // The values are stored `+ 32`: the sub-block's sum starts at `−32 ·` the sum of
                // its 16 activations.
                let bsum = i32::from(unsafe { (*yb[c]).bsums[s] });
                let mut sub = _mm512_set1_epi32(-32 * bsum);
                for (q, quad) in quads.iter().enumerate() {
                    sub = _mm512_dpbusd_epi32(sub, *quad, broadcast(c, 16 * s + 4 * q));
                }
                block[c] = _mm512_add_epi32(block[c], _mm512_mullo_epi32(sub, scale));
            }
        }
        let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.d.as_ptr().cast()) });
        for c in 0..C {
            let dy = _mm512_set1_ps(unsafe { (*yb[c]).d });
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(block[c]), acc[c]);
        }
    }
    acc
}

/// The product of the repacked groups `groups` of `a` (each `k` blocks, as
/// [`repack_q6_k_rows16`] lays them out) with `n` columns of Q8_K activations `b` (`ldb` blocks
/// apart): `c[j * ldc + 16g + r]` is row `r` of group `g` times column `j`, as llamafile's `sgemm`
/// lays out a product of the unpacked rows. Columns go eight at a time (`each_group!`).
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
    use super::super::k_quants::test_data::{avx512_here, check_rows16, Rng};
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
                    let (quarter, t) = (&w.quarters[s / 4], s % 4);
                    assert_eq!(quarter.scales[t][r], block.scales[s]);
                    for j in 0..4 {
                        let v = |q: usize| value(block, 16 * s + 4 * q + j);
                        for i in 0..2 {
                            assert_eq!(
                                quarter.subs[t][i][4 * r + j],
                                (v(i) & 0xf) | ((v(2 + i) & 0xf) << 4),
                                "{at} {r} {s}"
                            );
                        }
                        assert_eq!(
                            quarter.subs[t][2][4 * r + j],
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
        if !avx512_here() {
            return;
        }
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
