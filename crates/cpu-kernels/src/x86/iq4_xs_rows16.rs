//! IQ4_XS weights repacked 16 rows to a register, in `q4_k_rows16`'s nibble layout: a register's
//! indices are looked up (`vpshufb`) in a table of the levels plus 128, unsigned bytes for the
//! same `vpdpbusd`s as Q4_K's, and the 128 comes off through the activations' block sums (each
//! sub-block's sum starts at `−128 ·` theirs, for 16 rows at once). The sub-block scales, less
//! 32, are signed bytes. 140 bytes a row where IQ4_XS has 136 (a group's block padded to whole
//! cache lines). The integer sums are the exact ones, an activation of −128 included (ggml's sign
//! trick leaves one meeting a negative level unnegated; Q8_K quantization never writes it).

use super::iq4_xs::{BlockIQ4XS, LEVELS};
use super::k_quants::BlockQ8K;
use super::q4_k_rows16::Sub;
use super::*;

/// One block of 16 weight rows: `subs[s].nibbles[i]` holds, in byte `4r + j`, the indices of row
/// `r`'s values `32s + 4i + j` (low nibble) and `32s + 16 + 4i + j` (high nibble); `scales[s][r]`
/// is row `r`'s scale of sub-block `s` less 32; `d` each row's f16 scale.
#[repr(C, align(64))]
pub struct IQ4XSRows16 {
    pub(super) subs: [Sub<0>; 8],
    pub(super) scales: [[i8; 16]; 8],
    pub(super) d: [u16; 16],
}

const _: () = assert!(std::mem::size_of::<IQ4XSRows16>() == 140 * 16);

/// The levels plus 128, the table indices are looked up in.
pub(super) const BIASED: [u8; 16] = {
    let mut out = [0; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (LEVELS[i] as i16 + 128) as u8;
        i += 1;
    }
    out
};

/// Sub-block `j`'s scale less 32: bits `4j..4j + 4` of `scales_l` below bits `2j..2j + 2` of
/// `scales_h`.
fn scale(b: &BlockIQ4XS, j: usize) -> i8 {
    let (high, low) = (b.scales_h, b.scales_l);
    let bits = ((low[j / 2] >> (4 * (j % 2))) & 0xf) | ((((high >> (2 * j)) & 3) as u8) << 4);
    bits as i8 - 32
}

/// `rows` rows of `k` IQ4_XS blocks (`lda` blocks apart) as `rows / 16` groups of `k` blocks,
/// group after group: what [`gemm_iq4_xs_rows16`] multiplies. Panics unless `rows` is a multiple
/// of 16 and `a` holds every row.
pub fn repack_iq4_xs_rows16(a: &[BlockIQ4XS], rows: usize, k: usize, lda: usize) -> Vec<IQ4XSRows16> {
    repacked_rows16(a, rows, k, lda, repack_iq4_xs_rows16_into)
}

/// [`repack_iq4_xs_rows16`] into `out`: as many groups of 16 rows as it holds `k` blocks of, every
/// one written. Panics unless `out` holds whole groups and `a` every row of them.
pub fn repack_iq4_xs_rows16_into(
    a: &[BlockIQ4XS],
    k: usize,
    lda: usize,
    out: &mut [std::mem::MaybeUninit<IQ4XSRows16>],
) {
    let sub = || Sub { nibbles: [[0; 64]; 4], fifth: [] };
    let empty = || IQ4XSRows16 { subs: std::array::from_fn(|_| sub()), scales: [[0; 16]; 8], d: [0; 16] };
    repack_each(a, k, lda, out, empty, |g, r, block| {
        let qs = block.qs;
        g.d[r] = block.d;
        for s in 0..8 {
            g.scales[s][r] = scale(block, s);
            // Byte `16s + t` of `qs` holds the indices of values `t` and `16 + t` of the
            // sub-block, the pair byte `4r + j` of register `t / 4` holds.
            for t in 0..16 {
                g.subs[s].nibbles[t / 4][4 * r + t % 4] = qs[16 * s + t];
            }
        }
    });
}

/// 16 rows (`k` blocks of `g`) times `C` activation rows: lane `r` of result `c` is row `r`'s
/// product with column `c`.
///
/// # Safety
/// `g` and every `y[c]` hold `k` blocks, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn tile<const C: usize>(k: usize, g: *const IQ4XSRows16, y: [*const BlockQ8K; C]) -> [__m512; C] {
    let low4 = _mm512_set1_epi8(0x0f);
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(BIASED.as_ptr().cast()) });
    let ahead_by = if C == 1 { ONE_ROW_AHEAD } else { PREFETCH_AHEAD };
    // A block's lines a sub-block fetches ahead: 5 of 35.
    let lines = std::mem::size_of::<IQ4XSRows16>().div_ceil(64).div_ceil(8);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let yb: [*const BlockQ8K; C] = std::array::from_fn(|c| unsafe { y[c].add(b) });
        let broadcast = |c: usize, at: usize| {
            _mm512_set1_epi32(unsafe { read_unaligned(addr_of!((*yb[c]).qs).cast::<u8>().add(at).cast::<i32>()) })
        };
        let mut block = [_mm512_setzero_si512(); C];
        for s in 0..8 {
            let ahead = g.wrapping_add(b).cast::<i8>().wrapping_add(ahead_by + 64 * lines * s);
            for l in 0..lines {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
            }
            let mut sub: [__m512i; C] = std::array::from_fn(|c| {
                let bsums = unsafe { (*yb[c]).bsums };
                _mm512_set1_epi32(-128 * (i32::from(bsums[2 * s]) + i32::from(bsums[2 * s + 1])))
            });
            for i in 0..4 {
                let v = unsafe { _mm512_load_si512(w.subs[s].nibbles[i].as_ptr().cast()) };
                let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, low4));
                let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4));
                for c in 0..C {
                    sub[c] = _mm512_dpbusd_epi32(sub[c], lo, broadcast(c, 32 * s + 4 * i));
                    sub[c] = _mm512_dpbusd_epi32(sub[c], hi, broadcast(c, 32 * s + 16 + 4 * i));
                }
            }
            let scale = _mm512_cvtepi8_epi32(unsafe { _mm_load_si128(w.scales[s].as_ptr().cast()) });
            for c in 0..C {
                block[c] = _mm512_add_epi32(block[c], _mm512_mullo_epi32(sub[c], scale));
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
/// [`repack_iq4_xs_rows16`] lays them out) with `n` columns of Q8_K activations `b` (`ldb` blocks
/// apart): `c[j * ldc + 16g + r]` is row `r` of group `g` times column `j`, as llamafile's `sgemm`
/// lays out a product of the unpacked rows. Columns go eight at a time (`each_group!`).
///
/// # Safety
/// `a` holds every group in `groups`, `b` `n` columns of `k` blocks; `c` has room for every
/// `j * ldc + 16g + r`; and this CPU has AVX-512 BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
pub unsafe fn gemm_iq4_xs_rows16(
    groups: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: *const IQ4XSRows16,
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
    use super::super::iq4_xs::tests::{exact, random_iq4, scale as ggml_scale};
    use super::super::k_quants::test_data::{avx512_here, check_rows16, Rng};
    use super::super::k_quants::QK_K;
    use super::*;

    #[test]
    fn repacking_puts_every_index_and_scale_where_the_layout_says() {
        let (rows, k) = (32, 3);
        let x = random_iq4(&mut Rng(9), rows * k);
        let groups = repack_iq4_xs_rows16(&x, rows, k, k);
        for (at, w) in groups.iter().enumerate() {
            let (group, b) = (at / k, at % k);
            for r in 0..16 {
                let block = &x[(16 * group + r) * k + b];
                assert_eq!(w.d[r], { block.d });
                for s in 0..8 {
                    assert_eq!(i64::from(w.scales[s][r]), ggml_scale(block, s), "group {at}, row {r}, sub-block {s}");
                    for t in 0..32 {
                        // ggml's reading: byte 16s + t % 16 of `qs`, low nibble for t < 16.
                        let byte = block.qs[16 * s + t % 16];
                        let want = if t < 16 { byte & 0xf } else { byte >> 4 };
                        let held = w.subs[s].nibbles[(t % 16) / 4][4 * r + t % 4];
                        let got = if t < 16 { held & 0xf } else { held >> 4 };
                        assert_eq!(got, want, "group {at}, row {r}, value {}", 32 * s + t);
                    }
                }
            }
        }
    }

    #[test]
    fn every_row_and_column_equals_the_exact_sums() {
        check_rows16(&mut Rng(0x2545_f491_4f6c_dd1d), random_iq4, exact, repack_iq4_xs_rows16, gemm_iq4_xs_rows16);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // Every index 0 (level −127) or 15 (113), every scale −32 or 31, activations −128 and 127:
        // the largest sums a lane meets. d = 1.
        for (index, level) in [(0u8, -127.0), (0xff, 113.0)] {
            for (scales_h, scales_l, s) in [(0u16, 0u8, -32.0), (0xffff, 0xff, 31.0)] {
                for y in [-128i8, 127] {
                    let x: Vec<BlockIQ4XS> = (0..16)
                        .map(|_| BlockIQ4XS { d: 0x3c00, scales_h, scales_l: [scales_l; 4], qs: [index; 128] })
                        .collect();
                    let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
                    let repacked = repack_iq4_xs_rows16(&x, 16, 1, 1);
                    let mut c = [0f32; 16];
                    unsafe { gemm_iq4_xs_rows16(0..1, 1, 1, repacked.as_ptr(), &yb, 1, c.as_mut_ptr(), 16) };
                    let want = 256.0 * s * level * f64::from(y);
                    assert!(c.iter().all(|&v| f64::from(v) == want), "index {index:#x}, scale {s}, y {y}: {c:?}");
                }
            }
        }
    }
}
