//! Products on Q4_0, Q5_0 and Q8_0 weights, timed. With COLUMNS > 1, a prompt's on one thread:
//! qwen2.5-coder-1.5b's gate/up shape (a share of 8960 rows × 1536 values) against 512 activation
//! columns (one ubatch of a long prompt) or as many as asked, in multiply-adds per second. With
//! COLUMNS = 1, a decode step's on 2 threads: the row kernels against a dot product per row, GB/s.
//! `cargo run --release -p gantry-cpu-kernels --example gemm_bench [q4_0|q5_0|q8_0 [COLUMNS
//! [v4|avxvnni|v3]]]` (the level's tiles; AVX-512 by default).
#![allow(unsafe_code, clippy::print_stdout, reason = "a benchmark of raw kernels")]

#[cfg(target_arch = "x86_64")]
mod common;

#[cfg(target_arch = "x86_64")]
fn main() {
    bench::run();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {}

#[cfg(target_arch = "x86_64")]
mod bench {
    use std::time::Instant;

    use gantry_cpu_kernels::x86::{avxvnni, v3, v4, BlockQ4, BlockQ5, BlockQ8};

    use crate::common::Rng;

    /// `count` blocks of random bytes whose first two bytes (the f16 scale) are a small number.
    fn random<B>(rng: &mut Rng, count: usize) -> Vec<B> {
        let size = std::mem::size_of::<B>();
        let mut v: Vec<B> = Vec::with_capacity(count);
        // SAFETY: every byte of the capacity is written before the length is set; any bytes
        // are valid blocks.
        unsafe {
            let p = v.as_mut_ptr().cast::<u8>();
            for i in 0..count * size {
                *p.add(i) = if i % size == 1 { 0x20 } else { rng.byte() };
            }
            v.set_len(count);
        }
        v
    }

    type Gemm<B> =
        unsafe fn(std::ops::Range<usize>, usize, usize, *const B, usize, *const BlockQ8, usize, *mut f32, usize);

    fn time<B>(name: &str, gemm: Gemm<B>, rng: &mut Rng, n: usize) {
        let (rows, k) = (4480usize, 48usize);
        let a: Vec<B> = random(rng, rows * k);
        let b: Vec<BlockQ8> = random(rng, n * k);
        let mut c = vec![0f32; rows * n];
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            // SAFETY: `a` holds `rows` rows and `b` `n` columns of `k` blocks; `c` holds every
            // `j * rows + i`; the machines this runs on have AVX-512 VNNI.
            unsafe { gemm(0..rows, n, k, a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), rows) };
            best = best.min(start.elapsed().as_secs_f64());
        }
        let macs = (rows * k * 32 * n) as f64;
        println!("{name}: {:.1} ms, {:.1} GMAC/s (c[7] = {})", best * 1e3, macs / best / 1e9, c[7]);
    }

    type Gemv<B> = unsafe fn(std::ops::Range<usize>, usize, *const B, usize, *const BlockQ8, *mut f32);
    type Dot<B> = unsafe fn(usize, *const B, *const BlockQ8) -> f32;

    /// One activation row over 256 MB of weights (the 1.5B's gate/up shape, many matrices, as a
    /// decode step streams them), 2 threads with halves of each matrix: the row kernel against a
    /// dot product per row, GB/s.
    fn time_one_row<B: Sync>(name: &str, gemv: Gemv<B>, dot: Dot<B>, rng: &mut Rng) {
        let (rows, k) = (8960usize, 48usize);
        let mats = (256usize << 20) / (rows * k * std::mem::size_of::<B>());
        let a: Vec<B> = random(rng, mats * rows * k);
        let y: Vec<BlockQ8> = random(rng, k);
        let run = |use_gemv: bool| {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..2 {
                        let (a, y) = (&a, &y);
                        s.spawn(move || {
                            let mut c = vec![0f32; rows];
                            let half = rows / 2;
                            let share = t * half..(t + 1) * half;
                            for m in 0..mats {
                                let mat = &a[m * rows * k..];
                                // SAFETY: every row of the share and `y` hold `k` blocks; the
                                // machines this runs on have AVX-512 VNNI.
                                unsafe {
                                    if use_gemv {
                                        gemv(share.clone(), k, mat.as_ptr(), k, y.as_ptr(), c.as_mut_ptr());
                                    } else {
                                        for i in share.clone() {
                                            c[i] = dot(k, mat.as_ptr().add(i * k), y.as_ptr());
                                        }
                                    }
                                }
                            }
                            std::hint::black_box(c);
                        });
                    }
                });
                best = best.min(start.elapsed().as_secs_f64());
            }
            std::mem::size_of_val(a.as_slice()) as f64 / best / 1e9
        };
        println!("{name} one row: dot per row {:.1} GB/s, row kernel {:.1} GB/s", run(false), run(true));
    }

    pub(crate) fn run() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let filter = std::env::args().nth(1).unwrap_or_default();
        let n = std::env::args().nth(2).map_or(512, |n| n.parse().expect("a column count"));
        if n == 1 {
            time_one_row::<BlockQ4>("q4_0", v4::gemv_q4_0, v4::dot_q4_0, &mut rng);
            time_one_row::<BlockQ8>("q8_0", v4::gemv_q8_0, v4::dot_q8_0, &mut rng);
            return;
        }
        // The level whose tiles are timed: `v4` (AVX-512), `avxvnni` or `v3` (AVX2).
        let level = std::env::args().nth(3).unwrap_or_else(|| "v4".into());
        let (q4_0, q5_0, q8_0): (Gemm<BlockQ4>, Gemm<BlockQ5>, Gemm<BlockQ8>) = match level.as_str() {
            "v4" => (v4::gemm_q4_0, v4::gemm_q5_0, v4::gemm_q8_0),
            "avxvnni" => (avxvnni::gemm_q4_0, avxvnni::gemm_q5_0, avxvnni::gemm_q8_0),
            "v3" => (v3::gemm_q4_0, v3::gemm_q5_0, v3::gemm_q8_0),
            other => panic!("level {other}: v4, avxvnni or v3"),
        };
        if filter.is_empty() || filter == "q4_0" {
            time::<BlockQ4>("q4_0", q4_0, &mut rng, n);
        }
        if filter.is_empty() || filter == "q5_0" {
            time::<BlockQ5>("q5_0", q5_0, &mut rng, n);
        }
        if filter.is_empty() || filter == "q8_0" {
            time::<BlockQ8>("q8_0", q8_0, &mut rng, n);
        }
    }
}
