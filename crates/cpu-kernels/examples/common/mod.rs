//! What the kernel benchmarks share: a deterministic generator, random weight blocks and Q8_K
//! activations. Each example uses a part.
#![allow(dead_code, unsafe_code, reason = "each example uses a part; blocks are written as raw bytes")]

use gantry_cpu_kernels::x86::{BlockQ8K, QK_K};

/// A `gemm` on the GGUF's blocks, as `llamafile_sgemm` lays out its product.
pub(crate) type Gemm<B> =
    unsafe fn(std::ops::Range<usize>, usize, usize, *const B, usize, *const BlockQ8K, usize, *mut f32, usize);

/// A `gemm` on a 16-row layout's groups.
pub(crate) type Rows16Gemm<R> =
    unsafe fn(std::ops::Range<usize>, usize, usize, *const R, *const BlockQ8K, usize, *mut f32, usize);

/// xorshift64*: the same data on every run.
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

/// `count` blocks of random bytes, each masked with `mask` (0x3b keeps f16 scales small).
pub(crate) fn masked_blocks<B>(rng: &mut Rng, count: usize, mask: u8) -> Vec<B> {
    let bytes = count * std::mem::size_of::<B>();
    let mut v: Vec<B> = Vec::with_capacity(count);
    // SAFETY: every byte of the capacity is written before the length is set; the block types
    // benchmarked here are plain bytes, any of which are valid.
    unsafe {
        let p = v.as_mut_ptr().cast::<u8>();
        for i in 0..bytes {
            *p.add(i) = rng.byte() & mask;
        }
        v.set_len(count);
    }
    v
}

/// `blocks` Q8_K blocks of random activations with their block sums, as ggml quantizes them.
pub(crate) fn q8_k_activations(rng: &mut Rng, blocks: usize) -> Vec<BlockQ8K> {
    (0..blocks)
        .map(|_| {
            let qs: [i8; QK_K] = std::array::from_fn(|_| rng.byte() as i8);
            let bsums = std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| i16::from(q)).sum());
            BlockQ8K { d: (rng.next() % 1000) as f32 / 997.0 + 0.01, qs, bsums }
        })
        .collect()
}

/// Best of 3 single runs of `f` (one pass over more weights than any cache holds): seconds.
pub(crate) fn best_of_3(f: &mut dyn FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let start = std::time::Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// Best of 5 runs of `f` 2000 times: seconds a run.
pub(crate) fn best(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..2000 {
                f();
            }
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// Today's `gemm` on `x` (`rows` rows of `k` blocks) against a 16-row layout's on the same rows
/// repacked, with 1, 2, 4 and 8 activation rows: nanoseconds per weight block and activation row,
/// and the largest difference between their results.
///
/// # Safety
/// `repacked` is `x` repacked, and this CPU has AVX-512 VNNI.
#[allow(clippy::too_many_arguments, reason = "both layouts and both kernels")]
pub(crate) unsafe fn compare_in_l2<B, R>(
    name: &str,
    rng: &mut Rng,
    x: &[B],
    repacked: &[R],
    rows: usize,
    k: usize,
    today: Gemm<B>,
    candidate: Rows16Gemm<R>,
) {
    for n in [1usize, 2, 4, 8] {
        let y = q8_k_activations(rng, n * k);
        let (mut ours, mut theirs) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        // SAFETY: `x` holds `rows` rows and `y` `n` columns of `k` blocks; the outputs hold
        // `rows · n` values; the caller's.
        let mut today_run = || unsafe { today(0..rows, n, k, x.as_ptr(), k, y.as_ptr(), k, ours.as_mut_ptr(), rows) };
        let today_s = best(&mut today_run);
        // SAFETY: as above, for the repacked groups.
        let mut candidate_run =
            || unsafe { candidate(0..rows / 16, n, k, repacked.as_ptr(), y.as_ptr(), k, theirs.as_mut_ptr(), rows) };
        let candidate_s = best(&mut candidate_run);
        today_run();
        candidate_run();
        let largest = ours.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = ours.iter().zip(&theirs).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let per = |s: f64| s * 1e9 / (2000 * rows * k * n) as f64;
        println!(
            "{n} rows: {name} {:.2} ns, 16-row layout {:.2} ns per block and activation row; largest difference {:.1e} of the largest value",
            per(today_s),
            per(candidate_s),
            diff / largest
        );
    }
}
