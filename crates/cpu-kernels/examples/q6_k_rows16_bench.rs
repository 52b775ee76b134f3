//! `q4_k_rows16_bench`'s layout for Q6_K weights (a third of the bytes of a Q4_K_M model), timed
//! against today's kernel on the same data: 16 rows to a register, four values of a row in each
//! 32-bit lane, their low four bits as nibbles and their top two bits in a register of their own,
//! 212 bytes a row where Q6_K has 210 (`x86/q6_k_rows16.rs`, which the engine's K-quant copies
//! use). The `+ 32` of the unsigned values comes off through the activations' block sums times
//! the scales, for 16 rows at once. `cargo run --release -p gantry-cpu-kernels --example
//! q6_k_rows16_bench`: weights in L2, nanoseconds per weight block and activation row, and the
//! largest difference from `gemm_q6_k`'s results; then one activation row against 384 MiB.
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
    use gantry_cpu_kernels::x86::{repack_q6_k_rows16, v4, BlockQ6K};

    use crate::common::{best_of_3, compare_in_l2, masked_blocks, q8_k_activations, Rng};

    pub(crate) fn run() {
        assert!(is_x86_feature_detected!("avx512vnni"), "needs AVX-512 VNNI");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // 128 rows of 1536 values (qwen2.5-coder-1.5b's row); small positive f16 scales.
        let (rows, k) = (128usize, 6usize);
        let x: Vec<BlockQ6K> = masked_blocks(&mut rng, rows * k, 0xff)
            .into_iter()
            .map(|b: BlockQ6K| BlockQ6K { d: rng.scale(), ..b })
            .collect();
        let repacked = repack_q6_k_rows16(&x, rows, k, k);
        // SAFETY: `repacked` is `x` repacked; AVX-512 VNNI was checked.
        unsafe { compare_in_l2("gemm_q6_k", &mut rng, &x, &repacked, rows, k, v4::gemm_q6_k, v4::gemm_q6_k_rows16) };
        streamed(&mut rng);
    }

    /// One activation row against 384 MiB of weights (gate/up shaped: rows of 1536 values), one
    /// pass each, best of 3: GB/s of each layout's own bytes, and of the GGUF's bytes it stands for.
    fn streamed(rng: &mut Rng) {
        let k = 6usize;
        let rows = (384usize << 20) / (k * std::mem::size_of::<BlockQ6K>()) / 16 * 16;
        let x: Vec<BlockQ6K> = masked_blocks(rng, rows * k, 0xff);
        let x: Vec<BlockQ6K> = x.into_iter().map(|b| BlockQ6K { d: 0x3c00, ..b }).collect();
        let repacked = repack_q6_k_rows16(&x, rows, k, k);
        let y = q8_k_activations(rng, k);
        let mut out = vec![0f32; rows];
        // SAFETY: `x` holds `rows` rows of `k` blocks, `y` one; AVX-512 VNNI was checked.
        let today = best_of_3(&mut || unsafe {
            v4::gemm_q6_k(0..rows, 1, k, x.as_ptr(), k, y.as_ptr(), k, out.as_mut_ptr(), rows)
        });
        // SAFETY: as above, for the repacked groups.
        let candidate = best_of_3(&mut || unsafe {
            v4::gemm_q6_k_rows16(0..rows / 16, 1, k, repacked.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), rows)
        });
        let gb = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
        let gguf = std::mem::size_of_val(x.as_slice());
        println!(
            "1 row streamed, 1 thread: gemm_q6_k {:.1} GB/s ({:.1} ms), 16-row layout {:.1} GB/s of its own bytes, {:.1} of the GGUF's ({:.1} ms)",
            gb(gguf, today),
            today * 1e3,
            gb(std::mem::size_of_val(repacked.as_slice()), candidate),
            gb(gguf, candidate),
            candidate * 1e3
        );
    }
}
