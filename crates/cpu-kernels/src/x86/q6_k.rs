//! Q6_K weights (`k_quants`' AVX-512 products): ggml's type for the output layer and half the FFN
//! down-projections of every Q4_K_M model, a third of the bytes a token of qwen2.5-coder-1.5b
//! reads. x86 has no repacked kernel for it: ggml multiplies it with each activation row
//! separately, so four decoding streams unpack every weight four times.

use super::k_quants::{entry_points, impl_k_quant, scaled_sums, BlockQ8K, KQuant, QK_K};
use super::*;

/// ggml's `block_q6_K`: the low four bits of 256 values, their high two bits, 16 signed scales
/// (one per 16 values) and the block's f16 scale. Value `i` is
/// `d · scales[i / 16] · (six bits − 32)`; which bytes hold its bits is [`unpack`]'s business.
#[repr(C, packed)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}

const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// One Q6_K block, unpacked: values 64·j to 64·j + 63 as unsigned bytes (`q + 32`) in
/// `values[j]`, each 16-bit lane of `scales[j]` the scale of the pair of values it multiplies,
/// all 16 scales as 16-bit integers in `scales16`, and the f16 scale as f32.
pub(super) struct Unpacked {
    values: [__m512i; 4],
    scales: [__m512i; 4],
    scales16: __m256i,
    d: f32,
}

/// Unpacks block `b`. In each half of 128 values, byte `l < 64` of `ql` holds value `l` in its
/// low nibble and value `l + 64` in its high one; byte `l < 32` of `qh` holds the high bits of
/// values `l`, `l + 32`, `l + 64` and `l + 96`, two bits each from the bottom.
///
/// # Safety
/// `b` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn unpack(b: *const BlockQ6K) -> Unpacked {
    let low4 = _mm512_set1_epi8(0x0f);
    let bits45 = _mm512_set1_epi8(0x30);
    // The high bits of values l (lower 256 bits) and l + 32 (upper) moved to bits 4-5; then of
    // values l + 64 and l + 96. Shifting 16-bit lanes is exact here: what crosses from the
    // neighbouring byte lands outside bits 4-5.
    let halves = |lo: i16, hi: i16| _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi));
    let (up_first, down_second) = (halves(4, 2), halves(0, 2));
    let mut values = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let (ql, qh) = unsafe {
            (
                _mm512_loadu_si512(addr_of!((*b).ql).cast::<u8>().add(64 * h).cast()),
                _mm512_broadcast_i64x4(_mm256_loadu_si256(addr_of!((*b).qh).cast::<u8>().add(32 * h).cast())),
            )
        };
        let high_first = _mm512_and_si512(_mm512_sllv_epi16(qh, up_first), bits45);
        let high_second = _mm512_and_si512(_mm512_srlv_epi16(qh, down_second), bits45);
        values[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), high_first);
        values[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4), high_second);
    }
    let scales16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(addr_of!((*b).scales).cast()) });
    let wide = _mm512_zextsi256_si512(scales16);
    // 16-bit lane L of scales[j] multiplies values 64·j + 2L and + 2L + 1: scale 4·j + L / 8.
    let spread = |j: i16| {
        let lanes: [i16; 32] = std::array::from_fn(|l| 4 * j + l as i16 / 8);
        _mm512_permutexvar_epi16(unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }, wide)
    };
    let scales = [spread(0), spread(1), spread(2), spread(3)];
    let d = v4::f16_to_f32(unsafe { read_unaligned(addr_of!((*b).d)) });
    Unpacked { values, scales, scales16, d }
}

/// `w · y` for one block as 16 int32 lanes whose sum is the block's integer dot product.
///
/// # Safety
/// `y` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn block_sums(w: &Unpacked, y: *const BlockQ8K) -> __m512i {
    let sums = unsafe { scaled_sums(&w.values, &w.scales, y) };
    // Less 32 · Σ scale · (sum of the 16 activations it scales).
    let bsums = unsafe { _mm256_loadu_si256(addr_of!((*y).bsums).cast()) };
    let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, w.scales16));
    _mm512_sub_epi32(sums, _mm512_zextsi256_si512(offset))
}

impl_k_quant!(BlockQ6K);

/// Value `i` of a block as an unsigned six-bit number (`q + 32`), as ggml's `dequantize_row_q6_K`
/// reads its bits: in each half of 128 values, byte `l < 32` of `ql` holds values `l` (low
/// nibble) and `l + 64` (high), byte `l + 32` values `l + 32` and `l + 96`; byte `l` of `qh` their
/// top two bits, from the bottom.
#[cfg(test)]
pub(super) fn value(b: &BlockQ6K, i: usize) -> u8 {
    let (half, l) = (i / 128, i % 128);
    let (ql, qh) = (&b.ql[64 * half..], &b.qh[32 * half..]);
    let (g, l) = (l / 32, l % 32);
    let low = match g {
        0 => ql[l] & 0xf,
        1 => ql[l + 32] & 0xf,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | (((qh[l] >> (2 * g)) & 3) << 4)
}

/// `acc` plus `d_x · d_y ·` the block's integer product.
///
/// # Safety
/// `y` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn add_product(w: &Unpacked, y: *const BlockQ8K, acc: __m512) -> __m512 {
    let sums = unsafe { block_sums(w, y) };
    let d = _mm512_set1_ps(unsafe { (*y).d } * w.d);
    _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc)
}

entry_points!(BlockQ6K, dot_q6_k, gemm_q6_k);

#[cfg(test)]
pub(super) mod tests {
    use super::super::k_quants::test_data::{avx512_here, check, f16, Rng};
    use super::*;

    /// The values of a Q6_K block, unscaled: `(scale index, q − 32)` for each of the 256.
    fn values(b: &BlockQ6K) -> [(usize, i32); QK_K] {
        std::array::from_fn(|i| (i / 16, i32::from(value(b, i)) - 32))
    }

    pub(crate) fn random_q6(rng: &mut Rng, k: usize) -> Vec<BlockQ6K> {
        (0..k)
            .map(|_| BlockQ6K {
                ql: std::array::from_fn(|_| rng.byte()),
                qh: std::array::from_fn(|_| rng.byte()),
                scales: std::array::from_fn(|_| rng.byte() as i8),
                d: rng.scale(),
            })
            .collect()
    }

    /// The exact dot product, and the sum of its terms' magnitudes (what f32 rounding is relative to).
    pub(crate) fn exact(x: &[BlockQ6K], y: &[BlockQ8K]) -> (f64, f64) {
        x.iter().zip(y).fold((0.0, 0.0), |(sum, size), (xb, yb)| {
            let (mut dot, mut magnitude) = (0i64, 0i64);
            for (i, (s, q)) in values(xb).into_iter().enumerate() {
                let term = i64::from(xb.scales[s]) * i64::from(q) * i64::from(yb.qs[i]);
                dot += term;
                magnitude += term.abs();
            }
            let d = f16(xb.d) * f64::from(yb.d);
            (sum + d * dot as f64, size + d.abs() * magnitude as f64)
        })
    }

    #[test]
    fn one_row_and_a_few_rows_equal_the_exact_sums() {
        check(&mut Rng(0x9e37_79b9_7f4a_7c15), random_q6, exact, dot_q6_k, gemm_q6_k);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // Six bits all set (31) or all clear (-32), scales -128 and 127, activations -128 and 127:
        // the largest magnitudes the 16- and 32-bit sums meet.
        for (bits, scale, y) in [(0xffu8, -128i8, -128i8), (0, -128, -128), (0xff, 127, 127), (0, 127, -128)] {
            let x = BlockQ6K { ql: [bits; 128], qh: [bits; 64], scales: [scale; 16], d: 0x3c00 };
            let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
            let q = if bits == 0 { -32 } else { 31 };
            let want = 256.0 * f64::from(scale) * f64::from(q) * f64::from(y);
            let got = unsafe { dot_q6_k(1, &x, &yb) };
            assert_eq!(f64::from(got), want, "bits {bits:#x}, scale {scale}, y {y}");
        }
    }
}
