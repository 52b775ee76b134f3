//! `q4_k_rows16_bench`'s layout for Q5_K weights (most of a Q5_K_M model's bytes), timed against
//! `gemm_q5_k` and against the Q4_K layout on the same nibbles: what the fifth bits cost.
//! `cargo run --release -p gantry-cpu-kernels --example q5_k_rows16_bench`: with weights in L2,
//! nanoseconds per weight block and activation row, and the largest difference from `gemm_q5_k`'s
//! results.
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
    use gantry_cpu_kernels::x86::{repack_q4_k_rows16, repack_q5_k_rows16, v4, BlockQ4K, BlockQ5K};

    use crate::common::{best, compare_in_l2, q8_k_activations, Rng};

    pub(crate) fn run() {
        assert!(is_x86_feature_detected!("avx512vnni"), "needs AVX-512 VNNI");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // 128 rows of 1536 values (qwen2.5-coder-1.5b's row).
        let (rows, k) = (128usize, 6usize);
        let x: Vec<BlockQ5K> = (0..rows * k)
            .map(|_| BlockQ5K {
                d: rng.scale(),
                dmin: rng.scale(),
                scales: std::array::from_fn(|_| rng.byte()),
                qh: std::array::from_fn(|_| rng.byte()),
                qs: std::array::from_fn(|_| rng.byte()),
            })
            .collect();
        let repacked = repack_q5_k_rows16(&x, rows, k, k);
        // SAFETY: `repacked` is `x` repacked; AVX-512 VNNI was checked.
        unsafe { compare_in_l2("gemm_q5_k", &mut rng, &x, &repacked, rows, k, v4::gemm_q5_k, v4::gemm_q5_k_rows16) };
        // The same nibbles without fifth bits, in Q4_K's layout, at a prompt's columns too.
        let x4: Vec<BlockQ4K> =
            x.iter().map(|b| BlockQ4K { d: b.d, dmin: b.dmin, scales: b.scales, qs: b.qs }).collect();
        let repacked4 = repack_q4_k_rows16(&x4, rows, k, k);
        for n in [1usize, 4, 64, 512] {
            let y = q8_k_activations(&mut rng, n * k);
            let mut out = vec![0f32; rows * n];
            let groups = rows / 16;
            // SAFETY: both layouts hold `rows` rows of `k` blocks, `y` `n` columns; `out` `rows · n`.
            let q5 = best(|| unsafe {
                v4::gemm_q5_k_rows16(0..groups, n, k, repacked.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), rows)
            });
            // SAFETY: as above.
            let q4 = best(|| unsafe {
                v4::gemm_q4_k_rows16(0..groups, n, k, repacked4.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), rows)
            });
            let per = |s: f64| s * 1e9 / (rows * k * n) as f64;
            println!(
                "{n} rows: Q5_K layout {:.2} ns, Q4_K layout {:.2} ns per block and activation row",
                per(q5),
                per(q4)
            );
        }
    }
}
