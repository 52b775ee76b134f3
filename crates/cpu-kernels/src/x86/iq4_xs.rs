//! IQ4_XS weights (`k_quants`' AVX-512 products): four bits a value looked up in a fixed table of
//! 16 non-uniform levels, with a signed six-bit scale per 32 values. x86 has neither a repacked
//! nor a few-rows kernel for it in ggml (llamafile's `sgemm` does not take it): with two to seven
//! activation rows ggml multiplies each weight row with each row separately, and from eight rows on
//! its tiled kernel unpacks every weight tile again.
//!
//! The table's levels are signed, so a block is kept as their magnitudes (the unsigned operand of
//! `vpmaddubsw`) and a mask of the negative ones, which negates the activations they meet: ggml's
//! own sign trick (`mul_add_epi8`), with the same integer sums. As in ggml, an activation of −128
//! (which Q8_K quantization never writes) meeting a negative level is not negated.

use super::k_quants::{entry_points, impl_k_quant, BlockQ8K, KQuant, QK_K};
use super::q4_k::spread_scales;
use super::*;

/// ggml's `block_iq4_xs`: the block's f16 scale, the top two bits of its 8 sub-block scales
/// (`scales_h`, bits `2j` and `2j + 1` for sub-block `j`), their low four bits (`scales_l`, a
/// nibble each, sub-block `2i` low), and 256 four-bit indices into [`LEVELS`]. Value `i` is
/// `d · (scale[i / 32] − 32) · LEVELS[index]`; bytes `16j` to `16j + 15` of `qs` hold sub-block
/// `j`'s values 0-15 in their low nibbles and 16-31 in their high ones.
#[repr(C, packed)]
pub struct BlockIQ4XS {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);

/// ggml's `kvalues_iq4nl`: the 16 levels an index stands for.
pub(super) const LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The levels' magnitudes, the table `unpack` looks indices up in; the levels of indices 0-7 are
/// the negative ones.
pub(super) const MAGNITUDES: [u8; 16] = {
    let mut out = [0; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = LEVELS[i].unsigned_abs();
        i += 1;
    }
    out
};

/// One IQ4_XS block, unpacked: the magnitudes of values 64·j to 64·j + 63 as bytes in
/// `magnitudes[j]` with their signs in `negative[j]`, each 16-bit lane of `scales[j]` the signed
/// scale of the pair of values it multiplies, and the f16 scale as f32.
pub(super) struct Unpacked {
    magnitudes: [__m512i; 4],
    negative: [__mmask64; 4],
    scales: [__m512i; 4],
    d: f32,
}

/// # Safety
/// `b` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn unpack(b: *const BlockIQ4XS) -> Unpacked {
    let qs = unsafe { addr_of!((*b).qs).cast::<u8>() };
    let low4 = _mm256_set1_epi8(0x0f);
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(MAGNITUDES.as_ptr().cast()) });
    let below_zero = _mm512_set1_epi8(8); // the levels of indices 0-7 are negative
    let mut magnitudes = [_mm512_setzero_si512(); 4];
    let mut negative = [0; 4];
    for j in 0..4 {
        // Sub-blocks 2j and 2j + 1 (16 bytes each): low nibbles then high, for each, in order.
        let packed = unsafe { _mm256_loadu_si256(qs.add(32 * j).cast()) };
        let (lo, hi) = (_mm256_and_si256(packed, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low4));
        let halves = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        let indices = _mm512_shuffle_i64x2::<0b11_01_10_00>(halves, halves);
        magnitudes[j] = _mm512_shuffle_epi8(table, indices);
        negative[j] = _mm512_cmplt_epu8_mask(indices, below_zero);
    }
    let (d, high, low) = unsafe {
        (
            read_unaligned(addr_of!((*b).d)),
            u32::from(read_unaligned(addr_of!((*b).scales_h))),
            u32::from_le_bytes(read_unaligned(addr_of!((*b).scales_l))),
        )
    };
    // Sub-block j's scale: bits 4j-4j+3 of `low`, bits 2j-2j+1 of `high` above them, less 32.
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let low_bits = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(low as i32), _mm256_slli_epi32::<2>(lanes)),
        _mm256_set1_epi32(0xf),
    );
    let high_bits = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(high as i32), _mm256_slli_epi32::<1>(lanes)),
        _mm256_set1_epi32(3),
    );
    let each = _mm256_sub_epi32(_mm256_or_si256(low_bits, _mm256_slli_epi32::<4>(high_bits)), _mm256_set1_epi32(32));
    let scales = unsafe { spread_scales(_mm512_zextsi128_si512(_mm256_cvtepi32_epi16(each))) };
    Unpacked { magnitudes, negative, scales, d: v4::f16_to_f32(d) }
}

/// `acc` plus `d_y · d · Σ scale · level · y` for one block.
///
/// # Safety
/// `y` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn add_product(w: &Unpacked, y: *const BlockQ8K, acc: __m512) -> __m512 {
    let qs = unsafe { addr_of!((*y).qs).cast::<u8>() };
    let mut sums = _mm512_setzero_si512();
    for j in 0..4 {
        let yv = unsafe { _mm512_loadu_si512(qs.add(64 * j).cast()) };
        let signed = _mm512_mask_sub_epi8(yv, w.negative[j], _mm512_setzero_si512(), yv);
        sums = _mm512_dpwssd_epi32(sums, _mm512_maddubs_epi16(w.magnitudes[j], signed), w.scales[j]);
    }
    let dy = unsafe { (*y).d };
    _mm512_fmadd_ps(_mm512_set1_ps(dy * w.d), _mm512_cvtepi32_ps(sums), acc)
}

impl_k_quant!(BlockIQ4XS);

entry_points!(BlockIQ4XS, dot_iq4_xs, gemm_iq4_xs);

#[cfg(test)]
pub(super) mod tests {
    use super::super::k_quants::test_data::{avx512_here, bsums, check_with, f16, random_q8, Rng};
    use super::*;

    pub(crate) fn random_iq4(rng: &mut Rng, k: usize) -> Vec<BlockIQ4XS> {
        (0..k)
            .map(|_| BlockIQ4XS {
                d: rng.scale(),
                scales_h: (rng.next() >> 16) as u16,
                scales_l: std::array::from_fn(|_| rng.byte()),
                qs: std::array::from_fn(|_| rng.byte()),
            })
            .collect()
    }

    pub(crate) fn scale(b: &BlockIQ4XS, j: usize) -> i64 {
        let low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xf;
        let high = (b.scales_h >> (2 * j)) & 3;
        (i64::from(low) | (i64::from(high) << 4)) - 32
    }

    /// The exact dot product as ggml's `dequantize_row_iq4_xs` defines the weights, and the sum of
    /// its terms' magnitudes.
    pub(crate) fn exact(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> (f64, f64) {
        x.iter().zip(y).fold((0.0, 0.0), |(sum, size), (xb, yb)| {
            let (mut scaled, mut magnitude) = (0i64, 0f64);
            let d = f16(xb.d);
            for i in 0..QK_K {
                let (j, l) = (i / 32, i % 32);
                let byte = xb.qs[16 * j + l % 16];
                let level = i64::from(LEVELS[usize::from(if l < 16 { byte & 0xf } else { byte >> 4 })]);
                let term = scale(xb, j) * level * i64::from(yb.qs[i]);
                scaled += term;
                magnitude += d * term.abs() as f64;
            }
            let dy = f64::from(yb.d);
            (sum + dy * d * scaled as f64, size + dy * magnitude)
        })
    }

    /// Q8_K rows as its quantization writes them: no −128.
    pub(crate) fn q8_rows(rng: &mut Rng, k: usize) -> Vec<BlockQ8K> {
        let mut rows = random_q8(rng, k);
        for b in &mut rows {
            b.qs.iter_mut().for_each(|q| *q = (*q).max(-127));
            b.bsums = bsums(&b.qs);
        }
        rows
    }

    #[test]
    fn one_row_and_a_few_rows_equal_the_exact_sums() {
        check_with(&mut Rng(0x9e37_79b9_7f4a_7c15), random_iq4, q8_rows, exact, dot_iq4_xs, gemm_iq4_xs);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // Every index 0 (level −127) or 15 (113), every scale −32 or 31, activations ±127: the
        // largest magnitudes the 16- and 32-bit sums meet. d = 1.
        for (index, level) in [(0u8, -127.0), (0xff, 113.0)] {
            for (scales_h, scales_l, s) in [(0u16, 0u8, -32.0), (0xffff, 0xff, 31.0)] {
                for y in [-127i8, 127] {
                    let x = BlockIQ4XS { d: 0x3c00, scales_h, scales_l: [scales_l; 4], qs: [index; 128] };
                    let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
                    let want = 256.0 * s * level * f64::from(y);
                    let got = unsafe { dot_iq4_xs(1, &x, &yb) };
                    assert_eq!(f64::from(got), want, "index {index:#x}, scale {s}, y {y}");
                }
            }
        }
    }
}
