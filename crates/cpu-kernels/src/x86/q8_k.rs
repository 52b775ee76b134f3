//! Activations quantized to Q8_K (AVX-512, and AVX2 for CPUs without it), for every product of K-quant weights: ggml quantizes
//! each row of activations before its K-quant products, and on x86 it does so with its scalar
//! reference (`quantize_row_q8_K_ref`), which took 4% of a 4-stream decode step of
//! qwen2.5-coder-1.5b on a 2-core Zen 5 (`perf`). This computes the same bytes: the block's scale
//! from the value of largest magnitude (the first of equals), each value times `-127 / max`
//! rounded to the nearest integer (ties to even, as ggml's `nearest_int`) and capped at 127, and
//! the sums of each 16.

use super::k_quants::{BlockQ8K, QK_K};
use super::*;

/// Quantizes `k` values of `x` (a multiple of 256) into `k / 256` blocks at `y`, as ggml's
/// `quantize_row_q8_K_ref` does. A block of zeros gets scale 0, values 0 and sums 0.
///
/// # Safety
/// `x` holds `k` floats and `y` room for `k / 256` blocks, and this CPU has AVX-512 BW/VL and
/// VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn quantize_q8_k(x: *const f32, y: *mut BlockQ8K, k: usize) {
    for b in 0..k / QK_K {
        let (x, y) = unsafe { (x.add(b * QK_K), &mut *y.add(b)) };
        let values: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(x.add(16 * i)) });
        let mut largest = _mm512_setzero_ps();
        for v in values {
            largest = _mm512_max_ps(largest, _mm512_abs_ps(v));
        }
        let amax = _mm512_reduce_max_ps(largest);
        if amax == 0.0 || amax.is_nan() {
            *y = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
            continue;
        }
        // The first value of that magnitude gives the sign, as ggml's strict `>` scan keeps it.
        let amax_v = _mm512_set1_ps(amax);
        let at = values
            .iter()
            .enumerate()
            .find_map(|(i, v)| {
                let hits = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(*v), amax_v);
                (hits != 0).then(|| 16 * i + hits.trailing_zeros() as usize)
            })
            .unwrap_or(0);
        let iscale = -127.0 / unsafe { *x.add(at) };
        let scale = _mm512_set1_ps(iscale);
        let cap = _mm512_set1_epi32(127);
        for (i, v) in values.into_iter().enumerate() {
            // Rounding to nearest, ties to even: ggml's `nearest_int` for magnitudes under 2^22.
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, scale)), cap);
            unsafe { _mm_storeu_si128(y.qs.as_mut_ptr().add(16 * i).cast(), _mm512_cvtsepi32_epi8(q)) };
            y.bsums[i] = _mm512_reduce_add_epi32(q) as i16;
        }
        y.d = 1.0 / iscale;
    }
}

/// [`quantize_q8_k`] with AVX2 alone: the same bytes.
///
/// # Safety
/// `x` holds `k` floats and `y` room for `k / 256` blocks, and this CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_k_avx2(x: *const f32, y: *mut BlockQ8K, k: usize) {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let abs = |v: __m256| _mm256_and_ps(v, magnitude);
    for b in 0..k / QK_K {
        let (x, y) = unsafe { (x.add(b * QK_K), &mut *y.add(b)) };
        let values: [__m256; 32] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.add(8 * i)) });
        let mut largest = _mm256_setzero_ps();
        for v in values {
            largest = _mm256_max_ps(largest, abs(v));
        }
        let mut lanes = [0f32; 8];
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), largest) };
        let amax = lanes.into_iter().fold(0f32, f32::max);
        if amax == 0.0 || amax.is_nan() {
            *y = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
            continue;
        }
        // The first value of that magnitude gives the sign, as ggml's strict `>` scan keeps it.
        let amax_v = _mm256_set1_ps(amax);
        let at = values
            .iter()
            .enumerate()
            .find_map(|(i, v)| {
                let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(*v), amax_v));
                (hits != 0).then(|| 8 * i + hits.trailing_zeros() as usize)
            })
            .unwrap_or(0);
        let iscale = -127.0 / unsafe { *x.add(at) };
        let scale = _mm256_set1_ps(iscale);
        let cap = _mm256_set1_epi32(127);
        // Rounding to nearest, ties to even: ggml's `nearest_int` for magnitudes under 2^22.
        let quantized = |v: __m256| _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, scale)), cap);
        for i in 0..16 {
            let (q0, q1) = (quantized(values[2 * i]), quantized(values[2 * i + 1]));
            // Packing works within 128-bit lanes: put the 16-bit values back in order first.
            let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q0, q1));
            let bytes = _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256::<1>(words));
            unsafe { _mm_storeu_si128(y.qs.as_mut_ptr().add(16 * i).cast(), bytes) };
            let mut sums = [0i32; 8];
            unsafe { _mm256_storeu_si256(sums.as_mut_ptr().cast(), _mm256_add_epi32(q0, q1)) };
            y.bsums[i] = sums.iter().sum::<i32>() as i16;
        }
        y.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::super::k_quants::test_data::{avx512_here, bsums, Rng};
    use super::*;

    /// ggml's `quantize_row_q8_K_ref`, line for line.
    fn reference(x: &[f32]) -> Vec<BlockQ8K> {
        x.chunks(QK_K)
            .map(|x| {
                let (mut max, mut amax) = (0f32, 0f32);
                for &v in x {
                    if v.abs() > amax {
                        (amax, max) = (v.abs(), v);
                    }
                }
                if amax == 0.0 {
                    return BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
                }
                let iscale = -127.0 / max;
                let nearest = |f: f32| ((f + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000;
                let qs: [i8; QK_K] = std::array::from_fn(|j| nearest(iscale * x[j]).min(127) as i8);
                BlockQ8K { d: 1.0 / iscale, qs, bsums: bsums(&qs) }
            })
            .collect()
    }

    /// Both levels' quantizers on `x`: the AVX-512 one's blocks, after checking the AVX2 one's
    /// are the same.
    fn quantize(x: &[f32]) -> Vec<BlockQ8K> {
        let run = |quantizer: unsafe fn(*const f32, *mut BlockQ8K, usize)| {
            let mut y: Vec<BlockQ8K> =
                (0..x.len() / QK_K).map(|_| BlockQ8K { d: f32::NAN, qs: [1; QK_K], bsums: [1; 16] }).collect();
            unsafe { quantizer(x.as_ptr(), y.as_mut_ptr(), x.len()) };
            y
        };
        let (v4, v3) = (run(quantize_q8_k), run(quantize_q8_k_avx2));
        same(&v3, &v4, "AVX2 against AVX-512");
        v4
    }

    fn same(a: &[BlockQ8K], b: &[BlockQ8K], what: &str) {
        for (i, (a, b)) in a.iter().zip(b).enumerate() {
            assert_eq!(a.d.to_bits(), b.d.to_bits(), "{what}: block {i}'s scale");
            assert_eq!(a.qs, b.qs, "{what}: block {i}'s values");
            assert_eq!(a.bsums, b.bsums, "{what}: block {i}'s sums");
        }
    }

    #[test]
    fn the_bytes_are_ggmls() {
        if !avx512_here() {
            return;
        }
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for spread in [1e-3f32, 1.0, 37.0, 1e4] {
            let x: Vec<f32> =
                (0..8 * QK_K).map(|_| ((rng.next() % 20_001) as f32 - 10_000.0) / 10_000.0 * spread).collect();
            same(&quantize(&x), &reference(&x), &format!("spread {spread}"));
        }
        // Halves that round to even, a zero block, equal magnitudes of both signs (the first
        // gives the sign), and one value far above the rest.
        let mut x: Vec<f32> = (0..4 * QK_K).map(|i| (i % 255) as f32 - 127.0).collect();
        x[QK_K..2 * QK_K].fill(0.0);
        x[2 * QK_K + 5] = -300.0;
        x[2 * QK_K + 9] = 300.0;
        x[3 * QK_K + 100] = 1e6;
        same(&quantize(&x), &reference(&x), "edges");
    }
}
