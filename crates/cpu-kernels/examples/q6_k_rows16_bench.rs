//! `q4_k_rows16_bench`'s layout for Q6_K weights (a third of the bytes of a Q4_K_M model), timed
//! against today's kernel on the same data: 16 rows to a register, four values of a row in each
//! 32-bit lane, their low four bits as nibbles and their top two bits in a register of their own,
//! 228 bytes a row where Q6_K has 210 (`x86/q6_k_rows16.rs`; nothing serves it yet). The `+ 32`
//! of the unsigned values comes off through the activations' block sums times the scales, for 16
//! rows at once. `cargo run --release -p gantry-cpu-kernels --example q6_k_rows16_bench`: weights
//! in L2, nanoseconds per weight block and activation row, and the largest difference from
//! `gemm_q6_k`'s results.
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

    use crate::common::{compare_in_l2, masked_blocks, Rng};

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
    }
}
