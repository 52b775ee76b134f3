//! Q4_K weights repacked 16 rows to a register: each 32-bit lane holds four values of its own row,
//! so one `vpdpbusd` with four activations broadcast adds four products to each of 16 rows, the
//! sub-block scales multiply 16 rows' sums at once, and a block's float work (one conversion and
//! two fused multiply-adds) is paid once for 16 rows where `k_quants` pays it for every row. With
//! the weights in L2 (2-core Zen 4, `q4_k_rows16_bench`) it takes 1.5 ns a block and activation row
//! at 4 rows where `gemm_q4_k` takes 4.4, and 2.0 at one row where it takes 8.0. Each activation
//! row's arithmetic is the same whatever the number of rows beside it. Q5_K (`q5_k_rows16`) is
//! laid out and multiplied the same way, its fifth bits beside each sub-block's nibbles.
//!
//! The layout is Gantry's own, made once from the GGUF's blocks ([`repack_q4_k_rows16`]); the
//! integer sums are ggml's, only the order of the float additions differs.

use super::k_quants::BlockQ8K;
use super::q4_k::{scale_min, BlockQ4K};
use super::*;

/// Sub-block `s` of 16 weight rows: `nibbles[i]` holds, in bytes `4r..4r + 4`, row `r`'s values
/// `32s + 4i + j` (low nibbles) and `32s + 16 + 4i + j` (high nibbles). With `FIFTH` = 8 (Q5_K),
/// bit `4r + j` of `fifth[2i]` (`fifth[2i + 1]`) is the fifth bit of the value in the low (high)
/// nibble of byte `4r + j`; Q4_K has none.
#[repr(C)]
pub(super) struct Sub<const FIFTH: usize> {
    pub(super) nibbles: [[u8; 64]; 4],
    pub(super) fifth: [u64; FIFTH],
}

/// One block of 16 weight rows: its eight sub-blocks, as the kernel reads them; `scales[s][r]` is
/// row `r`'s scale of sub-block `s`; `mins[p]` holds row `r`'s mins of sub-blocks `2p` and `2p + 1`
/// in bytes `2r` and `2r + 1`; `d` and `dmin` are each row's f16 scales. A row takes 148 bytes of
/// a Q4_K group where its block has 144 (its six-bit scales and mins are bytes here), 180 of a Q5_K
/// group where its block has 176.
#[repr(C, align(64))]
pub struct NibbleRows16<const FIFTH: usize> {
    pub(super) subs: [Sub<FIFTH>; 8],
    pub(super) scales: [[u8; 16]; 8],
    pub(super) mins: [[u8; 32]; 4],
    pub(super) d: [u16; 16],
    pub(super) dmin: [u16; 16],
}

/// 16 rows of Q4_K weights.
pub type Q4KRows16 = NibbleRows16<0>;

const _: () = assert!(std::mem::size_of::<Q4KRows16>() == 148 * 16);

impl<const FIFTH: usize> NibbleRows16<FIFTH> {
    pub(super) fn zeroed() -> Self {
        let sub = || Sub { nibbles: [[0; 64]; 4], fifth: [0; FIFTH] };
        Self {
            subs: std::array::from_fn(|_| sub()),
            scales: [[0; 16]; 8],
            mins: [[0; 32]; 4],
            d: [0; 16],
            dmin: [0; 16],
        }
    }

    /// Row `r`'s scales, mins and nibbles from a Q4_K or Q5_K block's fields: values `32s..32s + 32`
    /// are the low (even `s`) or high nibbles of bytes `32 (s / 2)..` of `qs`.
    pub(super) fn put_row(&mut self, r: usize, (d, dmin): (u16, u16), packed: &[u8; 12], qs: &[u8; 128]) {
        (self.d[r], self.dmin[r]) = (d, dmin);
        for s in 0..8 {
            (self.scales[s][r], self.mins[s / 2][2 * r + s % 2]) = scale_min(s, packed);
            let (q, shift) = (&qs[32 * (s / 2)..32 * (s / 2) + 32], 4 * (s % 2));
            for t in 0..16 {
                self.subs[s].nibbles[t / 4][4 * r + t % 4] =
                    ((q[t] >> shift) & 0xf) | (((q[16 + t] >> shift) & 0xf) << 4);
            }
        }
    }
}

/// `rows` rows of `k` Q4_K blocks (`lda` blocks apart) as `rows / 16` groups of `k` blocks,
/// group after group: what [`gemm_q4_k_rows16`] multiplies. Panics unless `rows` is a multiple of
/// 16 and `a` holds every row.
pub fn repack_q4_k_rows16(a: &[BlockQ4K], rows: usize, k: usize, lda: usize) -> Vec<Q4KRows16> {
    repacked_rows16(a, rows, k, lda, repack_q4_k_rows16_into)
}

/// [`repack_q4_k_rows16`] into `out`: as many groups of 16 rows as it holds `k` blocks of, every one
/// written. Panics unless `out` holds whole groups and `a` every row of them.
pub fn repack_q4_k_rows16_into(a: &[BlockQ4K], k: usize, lda: usize, out: &mut [std::mem::MaybeUninit<Q4KRows16>]) {
    repack_each(a, k, lda, out, NibbleRows16::zeroed, |g, r, block| {
        g.put_row(r, (block.d, block.dmin), &block.scales, &block.qs);
    });
}

/// Each Q8_K block's sums of 32 activations as the 16-bit halves of four words: sub-blocks `2p`
/// and `2p + 1` in word `p`, what the mins multiply.
pub(super) fn sub_block_sums(y: &BlockQ8K) -> [i32; 4] {
    let sum = |s: usize| u32::from((y.bsums[2 * s] + y.bsums[2 * s + 1]) as u16);
    std::array::from_fn(|p| (sum(2 * p) | (sum(2 * p + 1) << 16)) as i32)
}

/// 16 rows (`k` blocks of `g`) times `C` activation rows: lane `r` of result `c` is row `r`'s
/// product with column `c`.
///
/// # Safety
/// `g`, every `y[c]` and every `sums[c]` hold `k` blocks, and this CPU has the AVX-512 level's
/// features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop, reason = "columns index fixed arrays")]
unsafe fn tile<const C: usize, const FIFTH: usize>(
    k: usize,
    g: *const NibbleRows16<FIFTH>,
    y: [*const BlockQ8K; C],
    sums: [*const [i32; 4]; C],
) -> [__m512; C] {
    // `low4` opaque: where LLVM knows the nibbles' top bits clear, it turns each masked byte
    // addition of 16 into an OR and a masked move, two operations where one does.
    let (low4, sixteen) = (std::hint::black_box(_mm512_set1_epi8(0x0f)), _mm512_set1_epi8(0x10));
    let ahead_by = if C == 1 { ONE_ROW_AHEAD } else { PREFETCH_AHEAD };
    // A block's lines a sub-block fetches ahead: 5 of Q4_K's 37, 6 of Q5_K's 45.
    let lines = std::mem::size_of::<NibbleRows16<FIFTH>>().div_ceil(64).div_ceil(8);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..k {
        let w = unsafe { &*g.add(b) };
        let qs: [*const u8; C] = std::array::from_fn(|c| unsafe { addr_of!((*y[c].add(b)).qs).cast::<u8>() });
        let broadcast = |c: usize, at: usize| _mm512_set1_epi32(unsafe { read_unaligned(qs[c].add(at).cast::<i32>()) });
        let mut block = [_mm512_setzero_si512(); C];
        for s in 0..8 {
            // The block's lines PREFETCH_AHEAD bytes on, a few a sub-block: all at once, they
            // crowded the misses in flight (one stream of the 1.5B 37.7 → 51.3 ms a token).
            let ahead = g.wrapping_add(b).cast::<i8>().wrapping_add(ahead_by + 64 * lines * s);
            for l in 0..lines {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
            }
            let sub_block = &w.subs[s];
            let mut sub = [_mm512_setzero_si512(); C];
            for i in 0..4 {
                let v = unsafe { _mm512_load_si512(sub_block.nibbles[i].as_ptr().cast()) };
                let (mut lo, mut hi) = (_mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4));
                if FIFTH > 0 {
                    lo = _mm512_mask_add_epi8(lo, sub_block.fifth[2 * i], lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, sub_block.fifth[2 * i + 1], hi, sixteen);
                }
                for c in 0..C {
                    sub[c] = _mm512_dpbusd_epi32(sub[c], lo, broadcast(c, 32 * s + 4 * i));
                    sub[c] = _mm512_dpbusd_epi32(sub[c], hi, broadcast(c, 32 * s + 16 + 4 * i));
                }
            }
            let scale = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(w.scales[s].as_ptr().cast()) });
            for c in 0..C {
                block[c] = _mm512_add_epi32(block[c], _mm512_mullo_epi32(sub[c], scale));
            }
        }
        let mut mins = [_mm512_setzero_si512(); C];
        for p in 0..4 {
            let m = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(w.mins[p].as_ptr().cast()) });
            for c in 0..C {
                mins[c] = _mm512_dpwssd_epi32(mins[c], m, _mm512_set1_epi32(unsafe { (*sums[c].add(b))[p] }));
            }
        }
        let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.d.as_ptr().cast()) });
        let dmin = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.dmin.as_ptr().cast()) });
        for c in 0..C {
            let dy = _mm512_set1_ps(unsafe { (*y[c].add(b)).d });
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(block[c]), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(mins[c]), acc[c]);
        }
    }
    acc
}

/// The product of the repacked groups `groups` of `a` (each `k` blocks, as
/// [`repack_q4_k_rows16`] lays them out) with `n` columns of Q8_K activations `b` (`ldb` blocks
/// apart): `c[j * ldc + 16g + r]` is row `r` of group `g` times column `j`, as llamafile's `sgemm`
/// lays out a product of the unpacked rows. Columns go eight at a time (`each_group!`).
///
/// # Safety
/// `a` holds every group in `groups`, `b` `n` columns of `k` blocks; `c` has room for every
/// `j * ldc + 16g + r`; and this CPU has AVX-512 BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
pub unsafe fn gemm_q4_k_rows16(
    groups: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: *const Q4KRows16,
    b: *const BlockQ8K,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    unsafe { gemm_nibble_rows16(groups, n, k, a, b, ldb, c, ldc) }
}

/// [`gemm_q4_k_rows16`] for either layout.
///
/// # Safety
/// As [`gemm_q4_k_rows16`]'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
pub(super) unsafe fn gemm_nibble_rows16<const FIFTH: usize>(
    groups: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: *const NibbleRows16<FIFTH>,
    b: *const BlockQ8K,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    let sums: Vec<[i32; 4]> = (0..n * k).map(|i| sub_block_sums(unsafe { &*b.add((i / k) * ldb + i % k) })).collect();
    macro_rules! run {
        ($C:literal, $group:expr, $j:expr) => {{
            let (group, j) = ($group, $j);
            let columns = std::array::from_fn(|q| unsafe { b.add((j + q) * ldb) });
            let column_sums = std::array::from_fn(|q| unsafe { sums.as_ptr().add((j + q) * k) });
            unsafe { tile::<$C, FIFTH>(k, a.add(group * k), columns, column_sums) }
        }};
    }
    each_group!(groups, n, c, ldc, run);
}

#[cfg(test)]
mod tests {
    use super::super::k_quants::test_data::{avx512_here, check_rows16, Rng};
    use super::super::k_quants::QK_K;
    use super::super::q4_k::tests::{exact, random_q4};
    use super::super::q4_k::value;
    use super::*;

    #[test]
    fn repacking_puts_every_value_where_the_layout_says() {
        let (rows, k) = (32, 3);
        let x = random_q4(&mut Rng(5), rows * k);
        let groups = repack_q4_k_rows16(&x, rows, k, k);
        for (at, w) in groups.iter().enumerate() {
            let (group, b) = (at / k, at % k);
            for r in 0..16 {
                let block = &x[(16 * group + r) * k + b];
                assert_eq!((w.d[r], w.dmin[r]), (block.d, block.dmin));
                for s in 0..8 {
                    assert_eq!((w.scales[s][r], w.mins[s / 2][2 * r + s % 2]), scale_min(s, &block.scales));
                    for t in 0..16 {
                        let want = value(block, 32 * s + t) | (value(block, 32 * s + 16 + t) << 4);
                        assert_eq!(w.subs[s].nibbles[t / 4][4 * r + t % 4], want, "{at} {r} {s} {t}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_row_and_column_equals_the_exact_sums() {
        check_rows16(&mut Rng(0x2545_f491_4f6c_dd1d), random_q4, exact, repack_q4_k_rows16, gemm_q4_k_rows16);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // All values 15, every scale and min 63, activations ±128/127: the largest sums a lane
        // meets. d = 1, dmin = 0 or 1.
        for (y, dmin) in [(-128i8, 0u16), (127, 0), (-128, 0x3c00), (127, 0x3c00)] {
            let x: Vec<BlockQ4K> =
                (0..16).map(|_| BlockQ4K { d: 0x3c00, dmin, scales: [0xff; 12], qs: [0xff; 128] }).collect();
            let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
            let repacked = repack_q4_k_rows16(&x, 16, 1, 1);
            let mut c = [0f32; 16];
            unsafe { gemm_q4_k_rows16(0..1, 1, 1, repacked.as_ptr(), &yb, 1, c.as_mut_ptr(), 16) };
            let min = if dmin == 0 { 0.0 } else { 63.0 };
            let want = 256.0 * (63.0 * 15.0 - min) * f64::from(y);
            assert!(c.iter().all(|&v| f64::from(v) == want), "y {y}, dmin {dmin:#x}: {c:?}");
        }
    }
}
