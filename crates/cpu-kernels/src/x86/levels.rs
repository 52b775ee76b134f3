//! The Q8_0, Q5_0 and Q4_0 kernels of each feature level (`v3`, `avxvnni`, `v4`): a level's
//! tiles and `gemm`s are stamped out from its Q5_0 unpacking and its byte products, and it
//! re-exports its kernels of the other layouts (the K-quants' and the 16-row copies').

use super::*;

/// `out[r][c] = Σ_b x[r]_b · y[c]_b` over `k` blocks for `R` weight rows and `C` activation
/// columns at once: each weight block is loaded (and its signs taken) once for all `C` columns,
/// each activation block once for all `R` rows, and the `R × C` sums are independent chains.
/// `dy[c]` holds column `c`'s `k` block scales as f32; each row is fetched `ahead` bytes on.
macro_rules! tile {
    ($features:literal, $name:ident, $Block:ty, $values:ident) => {
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn $name<const R: usize, const C: usize>(
            k: usize,
            x: [*const $Block; R],
            y: [*const BlockQ8; C],
            dy: [*const f32; C],
            ahead: usize,
        ) -> [[f32; C]; R] {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for b in 0..k {
                if b % 4 == 0 {
                    fetch_ahead(x, b, ahead);
                }
                let mut xv = [_mm256_setzero_si256(); R];
                let mut dx = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    let block = unsafe { x[r].add(b) };
                    xv[r] = $values(block);
                    dx[r] = _mm256_set1_ps(f16_to_f32(unsafe { <$Block as Block>::scale_bits(block) }));
                }
                for c in 0..C {
                    let yv = values_q8(unsafe { y[c].add(b) });
                    let dyc = _mm256_set1_ps(unsafe { *dy[c].add(b) });
                    for r in 0..R {
                        let p = mul_sum(xv[r], yv);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dyc), p, acc[r][c]);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = hsum(acc[r][c]);
                }
            }
            out
        }
    };
}

/// The product of weight rows `rows` of `a` (`lda` blocks apart) with `n` columns of Q8_0
/// activations `b` (`ldb` blocks apart), `k` blocks long: `c[j * ldc + i] = a_i · b_j`, as
/// llamafile's `sgemm` lays it out. Rows go in pairs, columns in fours, a row pair's columns
/// one group after another while its weights are still in L1.
macro_rules! gemm {
    ($features:literal, $name:ident, $Block:ty, $tile:ident) => {
        /// # Safety
        /// `a` holds every row in `rows`, `b` `n` columns, each `k` blocks long; `c` has room
        /// for every `j * ldc + i`; and this CPU has the level's features.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn $name(
            rows: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const $Block,
            lda: usize,
            b: *const BlockQ8,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            let dy: Vec<f32> =
                (0..n * k).map(|i| f16_to_f32(unsafe { BlockQ8::scale_bits(b.add((i / k) * ldb + i % k)) })).collect();
            let ahead = prefetch_distance(2 * lda * std::mem::size_of::<$Block>());
            let column = |j: usize| unsafe { b.add(j * ldb) };
            let scales = |j: usize| unsafe { dy.as_ptr().add(j * k) };
            /// One tile: rows `i..i + R`, columns `j..j + C`.
            macro_rules! run {
                ($R:literal, $C:literal, $i:expr, $j:expr) => {{
                    let (i, j) = ($i, $j);
                    unsafe {
                        $tile::<$R, $C>(
                            k,
                            std::array::from_fn(|r| a.add((i + r) * lda)),
                            std::array::from_fn(|q| column(j + q)),
                            std::array::from_fn(|q| scales(j + q)),
                            ahead,
                        )
                    }
                }};
            }
            each_tile!(rows, n, c, ldc, run, [1 2 3] 4);
        }
    };
}

/// Stamps out one feature level: `$values_q5` unpacks a Q5_0 block into 32 signed bytes,
/// `$mul_sum` turns 32 signed byte pairs into 8 float lanes of their int32 pair sums, and
/// `$tail` is the level's `gemm_q8_0`, `gemm_q5_0` and `gemm_q4_0` for a few rows of activations.
macro_rules! level {
    ($level:ident, $features:literal, $values_q5:item, $mul_sum:item, $($tail:item)*) => {
        pub mod $level {
            use super::*;

            #[target_feature(enable = $features)]
            #[inline]
            $values_q5

            #[target_feature(enable = $features)]
            #[inline]
            $mul_sum

            #[target_feature(enable = $features)]
            #[inline]
            pub(crate) fn values_q8(b: *const BlockQ8) -> __m256i {
                unsafe { _mm256_loadu_si256(addr_of!((*b).qs).cast()) }
            }

            /// The four blocks' combined scales, `x.d * y.d` as ggml computes them (f32 products
            /// of the f16 values).
            #[target_feature(enable = $features)]
            #[inline]
            fn scales<B: Block>(x: *const B, y: *const BlockQ8) -> [f32; 4] {
                let (mut xs, mut ys) = (0i64, 0i64);
                for k in 0..4 {
                    unsafe {
                        xs |= i64::from(B::scale_bits(x.add(k))) << (16 * k);
                        ys |= i64::from(BlockQ8::scale_bits(y.add(k))) << (16 * k);
                    }
                }
                let mut out = [0f32; 4];
                let product = _mm_mul_ps(_mm_cvtph_ps(_mm_set_epi64x(0, xs)), _mm_cvtph_ps(_mm_set_epi64x(0, ys)));
                unsafe { _mm_storeu_ps(out.as_mut_ptr(), product) };
                out
            }

            #[target_feature(enable = $features)]
            #[inline]
            pub(crate) fn f16_to_f32(bits: u16) -> f32 {
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn hsum(v: __m256) -> f32 {
                let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
                _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
            }

            /// Σ over `nb` blocks of `x · y`: blocks of four, one accumulator each, then the rest.
            macro_rules! dot_body {
                ($nb:expr, $x:expr, $y:expr, $values:ident) => {{
                    let (nb, x, y) = ($nb, $x, $y);
                    let mut acc = [_mm256_setzero_ps(); 4];
                    let mut i = 0;
                    while i + 4 <= nb {
                        fetch_ahead([x], i, PREFETCH_AHEAD);
                        let s = unsafe { scales(x.add(i), y.add(i)) };
                        for (k, acc) in acc.iter_mut().enumerate() {
                            let p = unsafe { mul_sum($values(x.add(i + k)), values_q8(y.add(i + k))) };
                            *acc = _mm256_fmadd_ps(_mm256_set1_ps(s[k]), p, *acc);
                        }
                        i += 4;
                    }
                    while i < nb {
                        let (xb, yb) = unsafe { (x.add(i), y.add(i)) };
                        let (sx, sy) = unsafe { (Block::scale_bits(xb), BlockQ8::scale_bits(yb)) };
                        let s = f16_to_f32(sx) * f16_to_f32(sy);
                        let p = mul_sum($values(xb), values_q8(yb));
                        acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(s), p, acc[0]);
                        i += 1;
                    }
                    hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
                }};
            }

            /// Σ over `nb` blocks of `x · y`.
            ///
            /// # Safety
            /// `x` and `y` point to `nb` blocks each, and this CPU has the level's features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q8_0(nb: usize, x: *const BlockQ8, y: *const BlockQ8) -> f32 {
                dot_body!(nb, x, y, values_q8)
            }

            /// Σ over `nb` blocks of `x · y`.
            ///
            /// # Safety
            /// `x` and `y` point to `nb` blocks each, and this CPU has the level's features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q5_0(nb: usize, x: *const BlockQ5, y: *const BlockQ8) -> f32 {
                dot_body!(nb, x, y, values_q5)
            }

            /// Σ over `nb` blocks of `x · y`.
            ///
            /// # Safety
            /// `x` and `y` point to `nb` blocks each, and this CPU has the level's features.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q4_0(nb: usize, x: *const BlockQ4, y: *const BlockQ8) -> f32 {
                dot_body!(nb, x, y, values_q4)
            }

            $($tail)*
        }
    };
}

level!(
    v3,
    "avx2,fma,f16c",
    pub(crate) fn values_q5(b: *const BlockQ5) -> __m256i {
        let nibbles = unsafe { low_nibbles(b) };
        unsafe {
            // Byte j gets bit j of the fifth bits (ggml's bytes_from_bits_32): spread the word
            // over the bytes, set every other bit, and see which bytes are all ones.
            let qh = i32::from_le_bytes(read_unaligned(addr_of!((*b).qh)));
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh),
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
            );
            let set = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                _mm256_set1_epi64x(-1),
            );
            // Without its fifth bit a value is its nibble less 16: the nibble with 0xF0 above it.
            _mm256_or_si256(nibbles, _mm256_andnot_si256(set, _mm256_set1_epi8(0xf0u8 as i8)))
        }
    },
    fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    },
    tile!("avx2,fma,f16c", tile_q8_0, BlockQ8, values_q8);
    tile!("avx2,fma,f16c", tile_q5_0, BlockQ5, values_q5);
    tile!("avx2,fma,f16c", tile_q4_0, BlockQ4, values_q4);
    gemm!("avx2,fma,f16c", gemm_q8_0, BlockQ8, tile_q8_0);
    gemm!("avx2,fma,f16c", gemm_q5_0, BlockQ5, tile_q5_0);
    gemm!("avx2,fma,f16c", gemm_q4_0, BlockQ4, tile_q4_0);
    pub use super::{
        q8_k::quantize_q8_k_avx2 as quantize_q8_k,
        rows16_avx2::{gemm_iq4_xs_rows16, gemm_q4_k_rows16, gemm_q5_k_rows16, gemm_q6_k_rows16},
    };
);

level!(
    avxvnni,
    "avx2,fma,f16c,avxvnni",
    fn values_q5(b: *const BlockQ5) -> __m256i {
        super::v3::values_q5(b)
    },
    fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
        let sums = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_cvtepi32_ps(sums)
    },
    tile!("avx2,fma,f16c,avxvnni", tile_q8_0, BlockQ8, values_q8);
    tile!("avx2,fma,f16c,avxvnni", tile_q5_0, BlockQ5, values_q5);
    tile!("avx2,fma,f16c,avxvnni", tile_q4_0, BlockQ4, values_q4);
    gemm!("avx2,fma,f16c,avxvnni", gemm_q8_0, BlockQ8, tile_q8_0);
    gemm!("avx2,fma,f16c,avxvnni", gemm_q5_0, BlockQ5, tile_q5_0);
    gemm!("avx2,fma,f16c,avxvnni", gemm_q4_0, BlockQ4, tile_q4_0);
    pub use super::{
        q8_k::quantize_q8_k_avx2 as quantize_q8_k,
        rows16_avxvnni::{gemm_iq4_xs_rows16, gemm_q4_k_rows16, gemm_q5_k_rows16, gemm_q6_k_rows16},
    };
);

level!(
    v4,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    pub(crate) fn values_q5(b: *const BlockQ5) -> __m256i {
        let nibbles = unsafe { low_nibbles(b) };
        unsafe {
            let fifth = u32::from_le_bytes(read_unaligned(addr_of!((*b).qh)));
            // Where the fifth bit is clear the value is its nibble less 16 (0xF0 above it).
            _mm256_mask_blend_epi8(fifth, _mm256_or_si256(nibbles, _mm256_set1_epi8(0xf0u8 as i8)), nibbles)
        }
    },
    fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
        let pairs = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_cvtepi32_ps(pairs)
    },
    pub use super::{
        iq4_xs::{dot_iq4_xs, gemm_iq4_xs},
        iq4_xs_rows16::gemm_iq4_xs_rows16,
        q4_k::{dot_q4_k, gemm_q4_k},
        q4_k_rows16::gemm_q4_k_rows16,
        q5_k::{dot_q5_k, gemm_q5_k},
        q5_k_rows16::gemm_q5_k_rows16,
        q6_k::{dot_q6_k, gemm_q6_k},
        q6_k_rows16::gemm_q6_k_rows16,
        q8_k::quantize_q8_k,
        wide::{gemm_q4_0, gemm_q5_0, gemm_q8_0},
        wide_row::{gemv_q4_0, gemv_q8_0},
    };
);
