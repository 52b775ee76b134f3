//! Q5_K weights (`k_quants`' AVX-512 products): the type of most weights of every Q5_K_M model.
//! Its scales, mins and low four bits are laid out as Q4_K's; a fifth bit per value comes from
//! `qh`. x86 has neither a repacked nor a tiled few-rows kernel for it in ggml: with two to seven
//! activation rows ggml multiplies each weight row with each row separately.

use super::k_quants::{entry_points, impl_k_quant, BlockQ8K, KQuant, QK_K};
use super::q4_k::{add_product, nibbles, with_scales, Unpacked};
use super::*;

/// ggml's `block_q5_K`: Q4_K's fields with the fifth bits between its scales and nibbles. Value
/// `i` is `d · scale[i / 32] · (nibble + 16 · fifth bit) − dmin · min[i / 32]`; the nibbles lie
/// as Q4_K's, and bit `2c` (`2c + 1`) of byte `l` of `qh` is the fifth bit of value `64c + l`
/// (`64c + 32 + l`).
#[repr(C, packed)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// # Safety
/// `b` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn unpack(b: *const BlockQ5K) -> Unpacked {
    let fifth = _mm512_set1_epi8(0x10);
    let nibbles = unsafe { nibbles(addr_of!((*b).qs).cast()) };
    // The fifth bits in both halves; for values 64·j + (0..32) bit 2j of each byte is moved to
    // bit 4, for 64·j + 32 + (0..32) bit 2j + 1 (16-bit shifts: what crosses from the next byte
    // lands outside bit 4).
    let qh = _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(addr_of!((*b).qh).cast()) });
    let up = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(3));
    let values = std::array::from_fn(|j| {
        let bits = _mm512_srlv_epi16(qh, _mm512_set1_epi16(2 * j as i16));
        _mm512_or_si512(nibbles[j], _mm512_and_si512(_mm512_sllv_epi16(bits, up), fifth))
    });
    let (d, dmin) = unsafe { (read_unaligned(addr_of!((*b).d)), read_unaligned(addr_of!((*b).dmin))) };
    unsafe { with_scales(values, read_unaligned(addr_of!((*b).scales)), d, dmin) }
}

impl_k_quant!(BlockQ5K);

entry_points!(BlockQ5K, dot_q5_k, gemm_q5_k);

#[cfg(test)]
pub(super) mod tests {
    use super::super::k_quants::test_data::{avx512_here, check, exact_with_mins, Rng};
    use super::*;

    pub(crate) fn random_q5(rng: &mut Rng, k: usize) -> Vec<BlockQ5K> {
        (0..k)
            .map(|_| BlockQ5K {
                d: rng.scale(),
                dmin: rng.scale(),
                scales: std::array::from_fn(|_| rng.byte()),
                qh: std::array::from_fn(|_| rng.byte()),
                qs: std::array::from_fn(|_| rng.byte()),
            })
            .collect()
    }

    /// Value `i` of a block as ggml's `dequantize_row_q5_K` reads it, before scaling.
    pub(crate) fn value(b: &BlockQ5K, i: usize) -> i64 {
        let (chunk, l) = (i / 64, i % 64);
        let byte = b.qs[32 * chunk + l % 32];
        let (nibble, bit) = if l < 32 { (byte & 0xf, 2 * chunk) } else { (byte >> 4, 2 * chunk + 1) };
        i64::from(nibble) + if b.qh[l % 32] & (1 << bit) != 0 { 16 } else { 0 }
    }

    /// The exact dot product as ggml defines the weights, and the sum of its terms' magnitudes.
    pub(crate) fn exact(x: &[BlockQ5K], y: &[BlockQ8K]) -> (f64, f64) {
        exact_with_mins(x, y, |b| (b.d, b.dmin, b.scales), value)
    }

    #[test]
    fn one_row_and_a_few_rows_equal_the_exact_sums() {
        check(&mut Rng(0x5851_f42d_4c95_7f2d), random_q5, exact, dot_q5_k, gemm_q5_k);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // All values 31, every scale and min 63, activations ±128/127: the largest magnitudes the
        // 16- and 32-bit sums meet. And every fifth bit clear: values 15.
        for (qh, top) in [(0xffu8, 31.0), (0, 15.0)] {
            for (y, dmin) in [(-128i8, 0u16), (127, 0), (-128, 0x3c00), (127, 0x3c00)] {
                let x = BlockQ5K { d: 0x3c00, dmin, scales: [0xff; 12], qh: [qh; 32], qs: [0xff; 128] };
                let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
                let min = if dmin == 0 { 0.0 } else { 63.0 };
                let want = 256.0 * (63.0 * top - min) * f64::from(y);
                let got = unsafe { dot_q5_k(1, &x, &yb) };
                assert_eq!(f64::from(got), want, "qh {qh:#x}, y {y}, dmin {dmin:#x}");
            }
        }
    }

    #[test]
    fn each_fifth_bit_lands_on_its_own_value() {
        if !avx512_here() {
            return;
        }
        // One fifth bit set at a time, every nibble zero, d and every scale 1, mins 0: the
        // product with y = e_i is 16 exactly where that bit is value i's.
        let mut scales = [0u8; 12];
        scales[..4].fill(1); // scales 0-3 (low six bits of bytes 0-3)
        scales[8..].fill(1); // scales 4-7 (low nibbles of bytes 8-11); mins all 0
        for i in (0..QK_K).step_by(7) {
            let (chunk, l) = (i / 64, i % 64);
            let bit = if l < 32 { 2 * chunk } else { 2 * chunk + 1 };
            let mut qh = [0u8; 32];
            qh[l % 32] = 1 << bit;
            let x = BlockQ5K { d: 0x3c00, dmin: 0, scales, qh, qs: [0; 128] };
            let mut qs = [0i8; QK_K];
            qs[i] = 1;
            let mut bsums = [0i16; 16];
            bsums[i / 16] = 1;
            let yb = BlockQ8K { d: 1.0, qs, bsums };
            assert_eq!(unsafe { dot_q5_k(1, &x, &yb) }, 16.0, "value {i}");
            assert_eq!(value(&x, i), 16, "the test's own reading agrees");
        }
    }
}
