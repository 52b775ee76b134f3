//! Q4_K weights (`k_quants`' AVX-512 products): the type of most weights of every Q4_K_M model,
//! the default quantization almost everywhere.

use super::k_quants::{entry_points, impl_k_quant, scaled_sums, BlockQ8K, KQuant, QK_K};
use super::*;

/// ggml's `block_q4_K`: the f16 scales of the block's sub-block scales and mins, 8 six-bit scales
/// and 8 six-bit mins packed in 12 bytes (one of each per 32 values), and 256 four-bit values.
/// Value `i` is `d · scale[i / 32] · q − dmin · min[i / 32]`; byte `l < 32` of each 32 bytes of
/// `qs` holds value `l` of its 64 in the low nibble and value `l + 32` in the high one.
#[repr(C, packed)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// One Q4_K block, unpacked: values 64·j to 64·j + 63 as bytes in `values[j]`, each 16-bit lane
/// of `scales[j]` the scale of the pair of values it multiplies, each 16-bit lane `i` of `mins`
/// the min of the activations' block sum `i` (16 values), and both f16 scales as f32.
pub(super) struct Unpacked {
    values: [__m512i; 4],
    scales: [__m512i; 4],
    mins: __m256i,
    d: f32,
    dmin: f32,
}

/// Sub-block `j`'s six-bit scale and min from a block's 12 packed bytes, as ggml's
/// `get_scale_min_k4` reads them.
pub(super) fn scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Value `i` of a block before scaling (0-15): byte `l < 32` of each 32 bytes of `qs` holds value
/// `l` of its 64 in the low nibble and `l + 32` in the high one.
#[cfg(test)]
pub(super) fn value(b: &BlockQ4K, i: usize) -> u8 {
    let (chunk, l) = (i / 64, i % 64);
    let byte = b.qs[32 * chunk + l % 32];
    if l < 32 {
        byte & 0xf
    } else {
        byte >> 4
    }
}

/// The 8 scales and 8 mins of a block, as bytes 0-7 and 8-15 (ggml's `utmp` unpacking: scales and
/// mins 0-3 are the low six bits of bytes 0-3 and 4-7; 4-7 are nibbles of bytes 8-11 with their
/// top two bits in the top bits of bytes 0-3 and 4-7).
fn scales_and_mins(packed: [u8; 12]) -> [u32; 4] {
    const SIX: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    [w0 & SIX, (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4), w1 & SIX, ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4)]
}

/// # Safety
/// `b` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn unpack(b: *const BlockQ4K) -> Unpacked {
    let values = unsafe { nibbles(addr_of!((*b).qs).cast()) };
    let (d, dmin) = unsafe { (read_unaligned(addr_of!((*b).d)), read_unaligned(addr_of!((*b).dmin))) };
    unsafe { with_scales(values, read_unaligned(addr_of!((*b).scales)), d, dmin) }
}

/// The 128 bytes of nibbles `qs` as Q4_K and Q5_K lay them out, values 64·j to 64·j + 63 in
/// `values[j]`: byte `l` of each 32 holds value `l` in its low nibble and `l + 32` in its high one.
///
/// # Safety
/// `qs` points to 128 bytes, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn nibbles(qs: *const u8) -> [__m512i; 4] {
    let low4 = _mm256_set1_epi8(0x0f);
    std::array::from_fn(|j| {
        let packed = unsafe { _mm256_loadu_si256(qs.add(32 * j).cast()) };
        let (lo, hi) = (_mm256_and_si256(packed, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low4));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    })
}

/// A block's values (64·j to 64·j + 63 in `values[j]`) with its packed scales and mins and both
/// f16 scales, as [`Unpacked`]: the part Q4_K and Q5_K share (the same scales, another fifth bit).
///
/// # Safety
/// This CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn with_scales(values: [__m512i; 4], packed: [u8; 12], d: u16, dmin: u16) -> Unpacked {
    let [s0, s1, s2, s3] = scales_and_mins(packed);
    let both = _mm256_cvtepu8_epi16(_mm_set_epi32(s3 as i32, s2 as i32, s1 as i32, s0 as i32));
    let scales = unsafe { spread_scales(_mm512_zextsi256_si512(both)) };
    // Block sum i covers values 16·i to 16·i + 15, whose min is min i / 2 (lane 8 + i / 2).
    let lanes: [i16; 16] = std::array::from_fn(|i| 8 + i as i16 / 2);
    let mins = _mm256_permutexvar_epi16(unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) }, both);
    Unpacked { values, scales, mins, d: v4::f16_to_f32(d), dmin: v4::f16_to_f32(dmin) }
}

/// The eight sub-block scales in 16-bit lanes 0-7 of `scales`, spread to the lanes of the pairs
/// of values they multiply: 16-bit lane L of register j multiplies values 64·j + 2L and 2L + 1,
/// of sub-block 2·j + L / 16.
///
/// # Safety
/// This CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn spread_scales(scales: __m512i) -> [__m512i; 4] {
    std::array::from_fn(|j| {
        let lanes: [i16; 32] = std::array::from_fn(|l| 2 * j as i16 + l as i16 / 16);
        _mm512_permutexvar_epi16(unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }, scales)
    })
}

/// `acc` plus `d_y · (d · Σ scale · q · y − dmin · Σ min · y)` for one block.
///
/// # Safety
/// `y` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn add_product(w: &Unpacked, y: *const BlockQ8K, acc: __m512) -> __m512 {
    let sums = unsafe { scaled_sums(&w.values, &w.scales, y) };
    let bsums = unsafe { _mm256_loadu_si256(addr_of!((*y).bsums).cast()) };
    let mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, w.mins));
    let dy = unsafe { (*y).d };
    let acc = _mm512_fmadd_ps(_mm512_set1_ps(dy * w.d), _mm512_cvtepi32_ps(sums), acc);
    _mm512_fnmadd_ps(_mm512_set1_ps(dy * w.dmin), _mm512_zextps256_ps512(mins), acc)
}

impl_k_quant!(BlockQ4K);

entry_points!(BlockQ4K, dot_q4_k, gemm_q4_k);

#[cfg(test)]
pub(super) mod tests {
    use super::super::k_quants::test_data::{avx512_here, check, exact_with_mins, Rng};
    use super::*;

    pub(crate) fn random_q4(rng: &mut Rng, k: usize) -> Vec<BlockQ4K> {
        (0..k)
            .map(|_| BlockQ4K {
                d: rng.scale(),
                dmin: rng.scale(),
                scales: std::array::from_fn(|_| rng.byte()),
                qs: std::array::from_fn(|_| rng.byte()),
            })
            .collect()
    }

    /// The exact dot product as ggml's `dequantize_row_q4_K` defines the weights, and the sum of
    /// its terms' magnitudes.
    pub(crate) fn exact(x: &[BlockQ4K], y: &[BlockQ8K]) -> (f64, f64) {
        exact_with_mins(x, y, |b| (b.d, b.dmin, b.scales), |b, i| i64::from(value(b, i)))
    }

    #[test]
    fn one_row_and_a_few_rows_equal_the_exact_sums() {
        check(&mut Rng(0x2545_f491_4f6c_dd1d), random_q4, exact, dot_q4_k, gemm_q4_k);
    }

    #[test]
    fn values_at_the_ends_of_the_ranges_are_exact() {
        if !avx512_here() {
            return;
        }
        // All values 15, every scale and min 63 (all twelve bytes 0xff), activations ±128/127:
        // the largest magnitudes the 16- and 32-bit sums meet. d = 1, dmin = 0 or 1.
        for (y, dmin) in [(-128i8, 0u16), (127, 0), (-128, 0x3c00), (127, 0x3c00)] {
            let x = BlockQ4K { d: 0x3c00, dmin, scales: [0xff; 12], qs: [0xff; 128] };
            let yb = BlockQ8K { d: 1.0, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] };
            let min = if dmin == 0 { 0.0 } else { 63.0 };
            let want = 256.0 * (63.0 * 15.0 - min) * f64::from(y);
            let got = unsafe { dot_q4_k(1, &x, &yb) };
            assert_eq!(f64::from(got), want, "y {y}, dmin {dmin:#x}");
        }
    }
}
