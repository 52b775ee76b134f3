//! Q5_K weights repacked 16 rows to a register, in `q4_k_rows16`'s layout with each sub-block's
//! fifth bits beside its nibbles: a 64-bit mask a register of nibbles, whose set bits add 16 to
//! their bytes (one masked byte addition) before the same `vpdpbusd`s as Q4_K's. 180 bytes a row
//! where Q5_K has 176. The integer sums are ggml's, only the order of the float additions differs.

use super::k_quants::BlockQ8K;
use super::q4_k_rows16::{gemm_nibble_rows16, NibbleRows16};
use super::q5_k::BlockQ5K;
use super::*;

/// 16 rows of Q5_K weights.
pub type Q5KRows16 = NibbleRows16<8>;

const _: () = assert!(std::mem::size_of::<Q5KRows16>() == 180 * 16);

/// `rows` rows of `k` Q5_K blocks (`lda` blocks apart) as `rows / 16` groups of `k` blocks,
/// group after group: what [`gemm_q5_k_rows16`] multiplies. Panics unless `rows` is a multiple of
/// 16 and `a` holds every row.
pub fn repack_q5_k_rows16(a: &[BlockQ5K], rows: usize, k: usize, lda: usize) -> Vec<Q5KRows16> {
    repacked_rows16(a, rows, k, lda, repack_q5_k_rows16_into)
}

/// [`repack_q5_k_rows16`] into `out`: as many groups of 16 rows as it holds `k` blocks of, every one
/// written. Panics unless `out` holds whole groups and `a` every row of them.
pub fn repack_q5_k_rows16_into(a: &[BlockQ5K], k: usize, lda: usize, out: &mut [std::mem::MaybeUninit<Q5KRows16>]) {
    repack_each(a, k, lda, out, NibbleRows16::zeroed, |g, r, block| {
        let (qs, qh) = (block.qs, block.qh);
        g.put_row(r, (block.d, block.dmin), &block.scales, &qs);
        // Value `32s + t`'s fifth bit is bit `s` of `qh[t]`; the nibbles of register `i` hold
        // values `4i + j` (low) and `16 + 4i + j` (high) of the sub-block.
        for (s, sub) in g.subs.iter_mut().enumerate() {
            for i in 0..4 {
                for j in 0..4 {
                    let bit = |t: usize| u64::from((qh[t] >> s) & 1) << (4 * r + j);
                    sub.fifth[2 * i] |= bit(4 * i + j);
                    sub.fifth[2 * i + 1] |= bit(16 + 4 * i + j);
                }
            }
        }
    });
}

/// The product of the repacked groups `groups` of `a` (each `k` blocks, as
/// [`repack_q5_k_rows16`] lays them out) with `n` columns of Q8_K activations `b` (`ldb` blocks
/// apart): `c[j * ldc + 16g + r]` is row `r` of group `g` times column `j`, as llamafile's `sgemm`
/// lays out a product of the unpacked rows. Columns go eight at a time (`each_group!`).
///
/// # Safety
/// `a` holds every group in `groups`, `b` `n` columns of `k` blocks; `c` has room for every
/// `j * ldc + 16g + r`; and this CPU has AVX-512 BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
pub unsafe fn gemm_q5_k_rows16(
    groups: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: *const Q5KRows16,
    b: *const BlockQ8K,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    unsafe { gemm_nibble_rows16(groups, n, k, a, b, ldb, c, ldc) }
}

#[cfg(test)]
mod tests {
    use super::super::k_quants::test_data::{avx512_here, check_rows16, Rng};
    use super::super::k_quants::QK_K;
    use super::super::q4_k::scale_min;
    use super::super::q5_k::tests::{exact, random_q5, value};
    use super::*;

    /// Value `i` of row `r` as the layout holds it: nibble plus 16 where its fifth bit is set.
    fn laid_out(w: &Q5KRows16, r: usize, i: usize) -> i64 {
        let (s, t) = (i / 32, i % 32);
        let (register, j, high) = ((t % 16) / 4, t % 4, t >= 16);
        let byte = w.subs[s].nibbles[register][4 * r + j];
        let nibble = if high { byte >> 4 } else { byte & 0xf };
        let mask = w.subs[s].fifth[2 * register + usize::from(high)];
        i64::from(nibble) + if mask >> (4 * r + j) & 1 == 1 { 16 } else { 0 }
    }

    #[test]
    fn repacking_puts_every_value_where_the_layout_says() {
        let (rows, k) = (32, 3);
        let x = random_q5(&mut Rng(7), rows * k);
        let groups = repack_q5_k_rows16(&x, rows, k, k);
        for (at, w) in groups.iter().enumerate() {
            let (group, b) = (at / k, at % k);
            for r in 0..16 {
                let block = &x[(16 * group + r) * k + b];
                assert_eq!((w.d[r], w.dmin[r]), (block.d, block.dmin));
                for s in 0..8 {
                    assert_eq!((w.scales[s][r], w.mins[s / 2][2 * r + s % 2]), scale_min(s, &block.scales));
                }
                for i in 0..QK_K {
                    assert_eq!(laid_out(w, r, i), value(block, i), "group {at}, row {r}, value {i}");
                }
            }
        }
    }

    #[test]
    fn every_row_and_column_equals_the_exact_sums() {
        check_rows16(&mut Rng(0x5851_f42d_4c95_7f2d), random_q5, exact, repack_q5_k_rows16, gemm_q5_k_rows16);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // All values 31 (or 15 with every fifth bit clear), every scale and min 63, activations
        // ±128/127: the largest sums a lane meets. d = 1, dmin = 0 or 1.
        for (qh, top) in [(0xffu8, 31.0), (0, 15.0)] {
            for (y, dmin) in [(-128i8, 0u16), (127, 0), (-128, 0x3c00), (127, 0x3c00)] {
                let x: Vec<BlockQ5K> = (0..16)
                    .map(|_| BlockQ5K { d: 0x3c00, dmin, scales: [0xff; 12], qh: [qh; 32], qs: [0xff; 128] })
                    .collect();
                let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
                let repacked = repack_q5_k_rows16(&x, 16, 1, 1);
                let mut c = [0f32; 16];
                unsafe { gemm_q5_k_rows16(0..1, 1, 1, repacked.as_ptr(), &yb, 1, c.as_mut_ptr(), 16) };
                let min = if dmin == 0 { 0.0 } else { 63.0 };
                let want = 256.0 * (63.0 * top - min) * f64::from(y);
                assert!(c.iter().all(|&v| f64::from(v) == want), "qh {qh:#x}, y {y}, dmin {dmin:#x}: {c:?}");
            }
        }
    }
}
