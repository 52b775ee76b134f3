//! The AVX-512 level's products of K-quant weights (256 values a block: Q4_K, Q5_K, Q6_K, and
//! IQ4_XS, which ggml multiplies with the same Q8_K activations) with Q8_K activations, one row
//! (ggml's `vec_dot`) and a few rows of activations at once.
//!
//! ggml's x86 kernels for these types multiply each weight row by one activation row at a time
//! (AVX2), or, for Q4_K, by four at a time from a copy repacked at load. Here each weight block is
//! unpacked once into registers of unsigned bytes, its sub-block scales spread to match, and then
//! multiplied with each activation row: bytes times bytes into 16-bit pairs (`vpmaddubsw`), times
//! the scales into 32-bit sums (`vpdpwssd`). What the unsigned form adds (Q6_K's `+ 32`) or the
//! type subtracts (Q4_K's mins) comes off through the activations' own block sums (`bsums`, 16
//! values each) times the scales. The integer sums are ggml's; the float scales are applied to
//! them per block as ggml does, and only the order of the float additions differs. The weights
//! are fetched 4 KiB ahead, as the Q8_0 kernels fetch theirs.
#![allow(clippy::needless_range_loop, reason = "tiles index columns of fixed arrays")]

use super::*;

/// Values per K-quant block.
pub const QK_K: usize = 256;

/// ggml's `block_q8_K`: an f32 scale, 256 signed bytes, and the sums of each 16 of them.
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// A K-quant weight block type: unpacked once, then multiplied with any number of Q8_K blocks.
pub(super) trait KQuant: Sized {
    /// A block in registers.
    type Unpacked;

    /// # Safety
    /// `b` points to a whole block, and this CPU has the AVX-512 level's features.
    unsafe fn unpack(b: *const Self) -> Self::Unpacked;

    /// `acc` plus the block's product with `y`, in float lanes whose sum is the product.
    ///
    /// # Safety
    /// `y` points to a whole block, and this CPU has the AVX-512 level's features.
    unsafe fn add_product(w: &Self::Unpacked, y: *const BlockQ8K, acc: __m512) -> __m512;
}

/// `Σ_j scales[j] · (values[j] · y_j)` for the four 64-value quarters of a block, as 16 int32
/// lanes: bytes times bytes into 16-bit pairs, then times the pairs' scales into 32-bit sums.
///
/// # Safety
/// `y` points to a whole block, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn scaled_sums(values: &[__m512i; 4], scales: &[__m512i; 4], y: *const BlockQ8K) -> __m512i {
    let qs = unsafe { addr_of!((*y).qs).cast::<u8>() };
    let mut sums = _mm512_setzero_si512();
    for j in 0..4 {
        let yv = unsafe { _mm512_loadu_si512(qs.add(64 * j).cast()) };
        sums = _mm512_dpwssd_epi32(sums, _mm512_maddubs_epi16(values[j], yv), scales[j]);
    }
    sums
}

/// Fetches into L1 the four cache lines `ahead` bytes past block `at` of `row` (a block of
/// either type spans up to four).
#[inline(always)]
fn fetch_block_ahead<K>(row: *const K, at: usize, ahead: usize) {
    let line = row.wrapping_add(at).cast::<i8>().wrapping_add(ahead);
    for l in 0..4 {
        // SAFETY: SSE is part of every x86-64 CPU, and a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(64 * l)) };
    }
}

/// `out[c] = x · y[c]` over `k` blocks: each weight block unpacked once for all `C` columns, two
/// float accumulators a column (even and odd blocks) so consecutive blocks do not wait on each
/// other; the weights are fetched `ahead` bytes on.
///
/// # Safety
/// `x` and every `y[c]` point to `k` blocks, and this CPU has the AVX-512 level's features.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile<K: KQuant, const C: usize>(k: usize, x: *const K, y: [*const BlockQ8K; C], ahead: usize) -> [f32; C] {
    let mut acc = [[_mm512_setzero_ps(); 2]; C];
    for b in 0..k {
        fetch_block_ahead(x, b, ahead);
        let w = unsafe { K::unpack(x.add(b)) };
        for c in 0..C {
            acc[c][b % 2] = unsafe { K::add_product(&w, y[c].add(b), acc[c][b % 2]) };
        }
    }
    std::array::from_fn(|c| _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1])))
}

/// Σ over `nb` blocks of `x · y`.
///
/// # Safety
/// `x` and `y` point to `nb` blocks each, and this CPU has AVX-512 BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot<K: KQuant>(nb: usize, x: *const K, y: *const BlockQ8K) -> f32 {
    let [sum] = unsafe { tile::<K, 1>(nb, x, [y], PREFETCH_AHEAD) };
    sum
}

/// The most activation rows one weight row is multiplied with while it is in L1.
const COLUMNS: usize = 8;

/// The product of weight rows `rows` of `a` (`lda` blocks apart) with `n` columns of Q8_K
/// activations `b` (`ldb` blocks apart), `k` blocks long: `c[j * ldc + i] = a_i · b_j`, as
/// llamafile's `sgemm` lays it out. Each row is unpacked once per eight columns; the rows are one
/// stream, fetched ahead as one (past a row's end the fetch reaches into the next rows).
///
/// # Safety
/// `a` holds every row in `rows`, `b` `n` columns, each `k` blocks long; `c` has room for every
/// `j * ldc + i`; and this CPU has AVX-512 BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
pub(super) unsafe fn gemm<K: KQuant>(
    rows: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: *const K,
    lda: usize,
    b: *const BlockQ8K,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    macro_rules! run {
        ($C:literal, $i:expr, $j:expr) => {{
            let (i, j) = ($i, $j);
            let columns = std::array::from_fn(|q| unsafe { b.add((j + q) * ldb) });
            let out = unsafe { tile::<K, $C>(k, a.add(i * lda), columns, PREFETCH_AHEAD) };
            for (q, v) in out.iter().enumerate() {
                unsafe { *c.add((j + q) * ldc + i) = *v };
            }
        }};
    }
    for i in rows {
        let mut j = 0;
        while j < n {
            match n - j {
                1 => run!(1, i, j),
                2 => run!(2, i, j),
                3 => run!(3, i, j),
                4 => run!(4, i, j),
                5 => run!(5, i, j),
                6 => run!(6, i, j),
                7 => run!(7, i, j),
                _ => run!(8, i, j),
            }
            j += COLUMNS;
        }
    }
}

/// Implements [`KQuant`] for a block type with its module's `Unpacked`, `unpack` and
/// `add_product` (functions with the level's target features, which a trait method cannot have).
macro_rules! impl_k_quant {
    ($Block:ty) => {
        impl KQuant for $Block {
            type Unpacked = Unpacked;

            #[inline(always)]
            unsafe fn unpack(b: *const Self) -> Unpacked {
                // SAFETY: the caller's.
                unsafe { unpack(b) }
            }

            #[inline(always)]
            unsafe fn add_product(w: &Unpacked, y: *const BlockQ8K, acc: __m512) -> __m512 {
                // SAFETY: the caller's.
                unsafe { add_product(w, y, acc) }
            }
        }
    };
}
pub(super) use impl_k_quant;

/// Defines the public one-row and few-rows entry points of a block type.
macro_rules! entry_points {
    ($Block:ty, $dot:ident, $gemm:ident) => {
        /// Σ over `nb` blocks of `x · y`.
        ///
        /// # Safety
        /// `x` and `y` point to `nb` blocks each, and this CPU has AVX-512 BW/VL and VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub unsafe fn $dot(nb: usize, x: *const $Block, y: *const BlockQ8K) -> f32 {
            unsafe { super::k_quants::dot(nb, x, y) }
        }

        /// The product of weight rows `rows` of `a` with `n` columns of Q8_K activations `b`,
        /// laid out as llamafile's `sgemm` does (`k_quants::gemm`).
        ///
        /// # Safety
        /// `a` holds every row in `rows`, `b` `n` columns, each `k` blocks long; `c` has room
        /// for every `j * ldc + i`; and this CPU has AVX-512 BW/VL and VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn $gemm(
            rows: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const $Block,
            lda: usize,
            b: *const BlockQ8K,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            unsafe { super::k_quants::gemm(rows, n, k, a, lda, b, ldb, c, ldc) }
        }
    };
}
pub(super) use entry_points;

#[cfg(test)]
pub(super) mod test_data {
    use super::{BlockQ8K, QK_K};

    /// xorshift64*: deterministic test data.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        pub(crate) fn byte(&mut self) -> u8 {
            (self.next() >> 32) as u8
        }

        /// A positive normal f16 between about 2^-10 and 2^5, as a scale would be.
        pub(crate) fn scale(&mut self) -> u16 {
            ((5 + (self.next() % 20) as u16) << 10) | (self.next() % 1024) as u16
        }
    }

    pub(crate) fn random_q8(rng: &mut Rng, k: usize) -> Vec<BlockQ8K> {
        (0..k)
            .map(|_| {
                let qs: [i8; QK_K] = std::array::from_fn(|_| rng.byte() as i8);
                BlockQ8K { d: (rng.next() % 1000) as f32 / 997.0 + 0.01, qs, bsums: bsums(&qs) }
            })
            .collect()
    }

    /// The sums of each 16 of a Q8_K block's values, as its `bsums`.
    pub(crate) fn bsums(qs: &[i8; QK_K]) -> [i16; QK_K / 16] {
        std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| i16::from(q)).sum())
    }

    /// Scale and min `j` of Q4_K's and Q5_K's packed 12 bytes, as ggml's `get_scale_min_k4`
    /// reads them.
    pub(crate) fn scale_min(j: usize, q: &[u8; 12]) -> (i64, i64) {
        let (s, m) = super::super::q4_k::scale_min(j, q);
        (i64::from(s), i64::from(m))
    }

    /// The exact dot product of rows of a type with Q4_K's scales and mins (Q4_K, Q5_K) and Q8_K
    /// rows, and the sum of its terms' magnitudes: `parts` gives a block's `d`, `dmin` and packed
    /// scales, `value` its value `i` before scaling.
    pub(crate) fn exact_with_mins<B>(
        x: &[B],
        y: &[BlockQ8K],
        parts: impl Fn(&B) -> (u16, u16, [u8; 12]),
        value: impl Fn(&B, usize) -> i64,
    ) -> (f64, f64) {
        x.iter().zip(y).fold((0.0, 0.0), |(sum, size), (xb, yb)| {
            let (mut scaled, mut mins, mut magnitude) = (0i64, 0i64, 0f64);
            let (d, dmin, scales) = parts(xb);
            let (d, dmin) = (f16(d), f16(dmin));
            for i in 0..QK_K {
                let (s, m) = scale_min(i / 32, &scales);
                let (q, y) = (value(xb, i), i64::from(yb.qs[i]));
                scaled += s * q * y;
                mins += m * y;
                magnitude += d * (s * q * y).abs() as f64 + dmin * (m * y).abs() as f64;
            }
            let dy = f64::from(yb.d);
            (sum + dy * (d * scaled as f64 - dmin * mins as f64), size + dy * magnitude)
        })
    }

    pub(crate) fn f16(bits: u16) -> f64 {
        let exponent = i32::from((bits >> 10) & 0x1f);
        (1.0 + f64::from(bits & 0x3ff) / 1024.0) * 2f64.powi(exponent - 15)
    }

    /// Whether this CPU runs the AVX-512 VNNI kernels. A test of them on a CPU without (an
    /// AVX2-only EPYC, a client core) says it is skipped and returns: the AVX2 kernels' own tests
    /// still run there.
    pub(crate) fn avx512_here() -> bool {
        let here = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if !here {
            eprintln!("SKIPPED: this CPU has no AVX-512 VNNI, so its kernels are not run here");
        }
        here
    }

    /// A block type's `gemm`.
    pub(crate) type Gemm<B> =
        unsafe fn(std::ops::Range<usize>, usize, usize, *const B, usize, *const BlockQ8K, usize, *mut f32, usize);

    /// Checks `dot` and `gemm` against `exact` (the exact sum and the sum of its terms'
    /// magnitudes) for row lengths of 1 to 35 blocks and 1 to 11 columns.
    pub(crate) fn check<B>(
        rng: &mut Rng,
        random: impl Fn(&mut Rng, usize) -> Vec<B>,
        exact: impl Fn(&[B], &[BlockQ8K]) -> (f64, f64),
        dot: unsafe fn(usize, *const B, *const BlockQ8K) -> f32,
        gemm: Gemm<B>,
    ) {
        check_with(rng, random, random_q8, exact, dot, gemm);
    }

    /// A 16-row layout's `gemm` (`q4_k_rows16`, `q6_k_rows16`).
    pub(crate) type Rows16Gemm<R> =
        unsafe fn(std::ops::Range<usize>, usize, usize, *const R, *const BlockQ8K, usize, *mut f32, usize);

    /// Checks a 16-row layout's `repack` and `gemm` against `exact`: 32 rows of 1 to 35 blocks
    /// (padded apart), 1 to 9 columns, one group at a time (each must write its own rows only).
    pub(crate) fn check_rows16<B, R>(
        rng: &mut Rng,
        random: impl Fn(&mut Rng, usize) -> Vec<B>,
        exact: impl Fn(&[B], &[BlockQ8K]) -> (f64, f64),
        repack: fn(&[B], usize, usize, usize) -> Vec<R>,
        gemm: Rows16Gemm<R>,
    ) {
        if !avx512_here() {
            return;
        }
        check_rows16_at(rng, random, exact, repack, gemm);
    }

    /// [`check_rows16`] for a `gemm` of any level (the caller checks this CPU has it).
    pub(crate) fn check_rows16_at<B, R>(
        rng: &mut Rng,
        random: impl Fn(&mut Rng, usize) -> Vec<B>,
        exact: impl Fn(&[B], &[BlockQ8K]) -> (f64, f64),
        repack: fn(&[B], usize, usize, usize) -> Vec<R>,
        gemm: Rows16Gemm<R>,
    ) {
        check_rows16_with(rng, random, random_q8, exact, repack, gemm);
    }

    /// [`check_rows16_at`] with activations from `q8` (`k` blocks).
    pub(crate) fn check_rows16_with<B, R>(
        rng: &mut Rng,
        random: impl Fn(&mut Rng, usize) -> Vec<B>,
        q8: impl Fn(&mut Rng, usize) -> Vec<BlockQ8K>,
        exact: impl Fn(&[B], &[BlockQ8K]) -> (f64, f64),
        repack: fn(&[B], usize, usize, usize) -> Vec<R>,
        gemm: Rows16Gemm<R>,
    ) {
        // 1536 and 8960 values: qwen2.5-coder-1.5b's rows.
        for k in [1, 2, 6, 35] {
            let (rows, lda) = (32, k + 1);
            let x = random(rng, rows * lda);
            let repacked = repack(&x, rows, k, lda);
            for n in 1..=9 {
                let (ldb, ldc) = (k + 2, rows + 3);
                let y = q8(rng, n * ldb);
                let mut c = vec![f32::NAN; n * ldc];
                for groups in [1..2, 0..1] {
                    unsafe { gemm(groups, n, k, repacked.as_ptr(), y.as_ptr(), ldb, c.as_mut_ptr(), ldc) };
                }
                for i in 0..rows {
                    for j in 0..n {
                        let (sum, size) = exact(&x[i * lda..i * lda + k], &y[j * ldb..j * ldb + k]);
                        let got = f64::from(c[j * ldc + i]);
                        assert!((got - sum).abs() <= 1e-6 * size, "k={k} n={n} ({i}, {j}): {got} against {sum}");
                    }
                }
                let untouched = (0..n).all(|j| c[j * ldc + rows..(j + 1) * ldc].iter().all(|v| v.is_nan()));
                assert!(untouched, "k={k} n={n}: wrote past the rows");
            }
        }
    }

    /// [`check`] with activations from `q8` (`k` blocks).
    pub(crate) fn check_with<B>(
        rng: &mut Rng,
        random: impl Fn(&mut Rng, usize) -> Vec<B>,
        q8: impl Fn(&mut Rng, usize) -> Vec<BlockQ8K>,
        exact: impl Fn(&[B], &[BlockQ8K]) -> (f64, f64),
        dot: unsafe fn(usize, *const B, *const BlockQ8K) -> f32,
        gemm: Gemm<B>,
    ) {
        if !avx512_here() {
            return;
        }
        // 1536 and 8960 values: qwen2.5-coder-1.5b's rows.
        for k in [1, 2, 3, 6, 35] {
            let rows = 5;
            let x = random(rng, rows * k);
            for n in 1..=11 {
                let y = q8(rng, n * k);
                let mut c = vec![f32::NAN; n * rows];
                unsafe { gemm(0..rows, n, k, x.as_ptr(), k, y.as_ptr(), k, c.as_mut_ptr(), rows) };
                for i in 0..rows {
                    for j in 0..n {
                        let (xr, yr) = (&x[i * k..(i + 1) * k], &y[j * k..(j + 1) * k]);
                        let (sum, size) = exact(xr, yr);
                        let tolerance = 1e-6 * size;
                        let one = f64::from(unsafe { dot(k, xr.as_ptr(), yr.as_ptr()) });
                        let many = f64::from(c[j * rows + i]);
                        assert!((one - sum).abs() <= tolerance, "k={k}: one row {one} against exact {sum}");
                        assert!((many - sum).abs() <= tolerance, "k={k} n={n} ({i}, {j}): {many} against {sum}");
                    }
                }
            }
        }
    }
}
