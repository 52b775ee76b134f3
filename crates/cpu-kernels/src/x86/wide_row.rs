//! The AVX-512 level's products of one row of activations (a decoding stream's): every weight row
//! times the same `y`, so `y` is packed once per product and each row's blocks go two to a
//! 512-bit register.
//!
//! The weights are VNNI's unsigned side, offset as in [`super::wide`] (Q4_0 `q − 8`, Q8_0
//! `x + 128`), and each `y` block's `−o·Σy` starts its sums. A pair of blocks is then one byte
//! multiply-add, one conversion, the scales' product and one fused add, where the dot product of
//! [`super::v4`] spends a sign trick and a 256-bit multiply-add on each block: one stream's decode
//! of qwen2.5-coder-1.5b at Q4_0 spent 75% of its time in that dot product, which (counting its
//! instructions) issued about four vector instructions a cycle and read 37 GB/s where 2 threads
//! can read 45 or more.
#![allow(clippy::needless_range_loop, reason = "rows index fixed arrays")]

use super::v4::{f16_to_f32, values_q8};
use super::*;

/// `y` packed: per pair of blocks, their 64 values, each block's scale in its 8 lanes, and each
/// block's `−o·Σy` in its first lane. A last odd block is paired with zeros.
struct PackedRow {
    values: Vec<__m512i>,
    scales: Vec<__m512>,
    starts: Vec<__m512i>,
}

impl PackedRow {
    /// # Safety
    /// `y` points to `k` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pack(k: usize, y: *const BlockQ8, offset: i32) -> Self {
        let pairs = k.div_ceil(2);
        let (mut values, mut scales, mut starts) =
            (Vec::with_capacity(pairs), Vec::with_capacity(pairs), Vec::with_capacity(pairs));
        for p in 0..pairs {
            let mut d = [0f32; 2];
            let mut start = [0i32; 16];
            let mut halves = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                let b = 2 * p + h;
                if b < k {
                    let at = unsafe { y.add(b) };
                    halves[h] = values_q8(at);
                    d[h] = f16_to_f32(unsafe { BlockQ8::scale_bits(at) });
                    let sum: i32 = unsafe { read_unaligned(addr_of!((*at).qs)) }.iter().map(|&v| i32::from(v)).sum();
                    start[8 * h] = -offset * sum;
                }
            }
            values.push(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(halves[0]), halves[1]));
            scales.push(pair_of(d[0], d[1]));
            starts.push(unsafe { _mm512_loadu_si512(start.as_ptr().cast()) });
        }
        Self { values, scales, starts }
    }
}

/// `lo` in the first 8 lanes, `hi` in the last 8.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn pair_of(lo: f32, hi: f32) -> __m512 {
    let lo = _mm512_castps256_ps512(_mm256_set1_ps(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_set1_ps(hi))))
}

/// Blocks `b` and `b + 1` of a Q4_0 row plus 8 (their nibbles as they are, in value order), and
/// their scales in 8 lanes each; a block past `k` is zeros.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn pair_q4_0(x: *const BlockQ4, b: usize, k: usize) -> (__m512i, __m512) {
    let nibbles = |i: usize| {
        if i < k {
            (
                _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(addr_of!((*x.add(i)).qs).cast()) }),
                f16_to_f32(unsafe { BlockQ4::scale_bits(x.add(i)) }),
            )
        } else {
            (_mm256_setzero_si256(), 0.0)
        }
    };
    let ((lo, d_lo), (hi, d_hi)) = (nibbles(b), nibbles(b + 1));
    // Each block's 16 bytes twice: as they are in its first 128 bits, 4 bits down in its second.
    let shifts = _mm512_set_epi64(
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
    );
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    (_mm512_and_si512(_mm512_srlv_epi16(both, shifts), _mm512_set1_epi8(0x0f)), pair_of(d_lo, d_hi))
}

/// Blocks `b` and `b + 1` of a Q8_0 row plus 128 (the sign bit flipped), and their scales in 8
/// lanes each; a block past `k` is zeros.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn pair_q8_0(x: *const BlockQ8, b: usize, k: usize) -> (__m512i, __m512) {
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let block = |i: usize| {
        if i < k {
            let at = unsafe { x.add(i) };
            (_mm256_xor_si256(values_q8(at), flip), f16_to_f32(unsafe { BlockQ8::scale_bits(at) }))
        } else {
            // Zero values plus 128: their products with the zero `y` past `k` are zeros.
            (flip, 0.0)
        }
    };
    let ((lo, d_lo), (hi, d_hi)) = (block(b), block(b + 1));
    (_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi), pair_of(d_lo, d_hi))
}

macro_rules! gemv {
    ($gemv:ident, $Block:ty, $pair:ident, $offset:literal) => {
        /// `c[i] = a_i · y` for weight rows `rows` of `a` (`lda` blocks apart) and one row of
        /// Q8_0 activations `y`, `k` blocks long. Each row is fetched 4 KiB ahead.
        ///
        /// # Safety
        /// `a` holds every row in `rows`, `y` `k` blocks; `c` has room for every `i` in `rows`;
        /// and this CPU has AVX-512 BW/VL and VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub unsafe fn $gemv(
            rows: std::ops::Range<usize>,
            k: usize,
            a: *const $Block,
            lda: usize,
            y: *const BlockQ8,
            c: *mut f32,
        ) {
            let packed = unsafe { PackedRow::pack(k, y, $offset) };
            for i in rows {
                let x = unsafe { a.add(i * lda) };
                let mut acc = [_mm512_setzero_ps(); 2];
                for p in 0..k.div_ceil(2) {
                    if p % 2 == 0 {
                        fetch_ahead([x], 2 * p, PREFETCH_AHEAD);
                    }
                    let (w, dx) = unsafe { $pair(x, 2 * p, k) };
                    let (yv, dy, start) = unsafe {
                        (
                            *packed.values.get_unchecked(p),
                            *packed.scales.get_unchecked(p),
                            *packed.starts.get_unchecked(p),
                        )
                    };
                    let sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w, yv));
                    acc[p % 2] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dy), sums, acc[p % 2]);
                }
                unsafe { *c.add(i) = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) };
            }
        }
    };
}

gemv!(gemv_q4_0, BlockQ4, pair_q4_0, 8);
gemv!(gemv_q8_0, BlockQ8, pair_q8_0, 128);
