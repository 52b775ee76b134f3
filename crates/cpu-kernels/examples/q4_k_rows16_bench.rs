//! A candidate layout for Q4_K weights, timed against today's kernel on the same data: 16 weight
//! rows repacked so that each 32-bit lane of a register holds four values of its own row. One
//! `vpdpbusd` with four activations broadcast then adds four products to each of 16 rows, the
//! sub-block scales multiply 16 rows' sums at once, and the float work of a block is one
//! conversion and two multiply-adds for 16 rows, where `k_quants::gemm` pays them for every row
//! (its float work is about a third of its time at 4 activation rows). The kernel and the repacking
//! are `gantry-cpu-kernels`' (`x86/q4_k_rows16.rs`); nothing serves the layout yet. `cargo run --release -p gantry-cpu-kernels
//! --example q4_k_rows16_bench`: with weights in L2 as `kq_gemm_bench` has them, nanoseconds per
//! weight block and activation row, and the largest difference from `gemm_q4_k`'s results; then
//! one activation row against 384 MiB of weights on one thread, in GB/s of each layout's bytes.
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
    use gantry_cpu_kernels::x86::{repack_q4_k_rows16, v4, BlockQ4K};

    use crate::common::{best_of_3, compare_in_l2, q8_k_activations, Rng};

    pub(crate) fn run() {
        assert!(is_x86_feature_detected!("avx512vnni"), "needs AVX-512 VNNI");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // 128 rows of 1536 values (qwen2.5-coder-1.5b's row).
        let (rows, k) = (128usize, 6usize);
        let x: Vec<BlockQ4K> = (0..rows * k)
            .map(|_| BlockQ4K {
                d: rng.scale(),
                dmin: rng.scale(),
                scales: std::array::from_fn(|_| rng.byte()),
                qs: std::array::from_fn(|_| rng.byte()),
            })
            .collect();
        let repacked = repack_q4_k_rows16(&x, rows, k, k);
        // SAFETY: `repacked` is `x` repacked; AVX-512 VNNI was checked.
        unsafe { compare_in_l2("gemm_q4_k", &mut rng, &x, &repacked, rows, k, v4::gemm_q4_k, v4::gemm_q4_k_rows16) };
        streamed(&mut rng);
    }

    /// One activation row against 384 MiB of weights (gate/up shaped: rows of 1536 values), one
    /// pass each, best of 3: GB/s of each layout's own bytes.
    fn streamed(rng: &mut Rng) {
        let k = 6usize;
        let rows = (384usize << 20) / (k * std::mem::size_of::<BlockQ4K>()) / 16 * 16;
        let x: Vec<BlockQ4K> = (0..rows * k)
            .map(|_| BlockQ4K { d: 0x3c00, dmin: 0x3c00, scales: [0x3b; 12], qs: std::array::from_fn(|_| rng.byte()) })
            .collect();
        let groups = rows / 16;
        let repacked = repack_q4_k_rows16(&x, rows, k, k);
        let y = q8_k_activations(rng, k);
        let mut out = vec![0f32; rows];
        // SAFETY: `x` holds `rows` rows of `k` blocks, `y` one; AVX-512 VNNI was checked.
        let today = best_of_3(&mut || unsafe {
            v4::gemm_q4_k(0..rows, 1, k, x.as_ptr(), k, y.as_ptr(), k, out.as_mut_ptr(), rows)
        });
        // SAFETY: as above, for the repacked groups.
        let candidate = best_of_3(&mut || unsafe {
            v4::gemm_q4_k_rows16(0..groups, 1, k, repacked.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), rows)
        });
        let gb = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
        println!(
            "1 row streamed, 1 thread: gemm_q4_k {:.1} GB/s ({:.1} ms), 16-row layout {:.1} GB/s ({:.1} ms)",
            gb(std::mem::size_of_val(x.as_slice()), today),
            today * 1e3,
            gb(std::mem::size_of_val(repacked.as_slice()), candidate),
            candidate * 1e3
        );
    }
}
