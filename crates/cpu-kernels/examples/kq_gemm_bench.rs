//! The K-quant kernels' arithmetic, timed apart from memory: 128 weight rows that stay in L2,
//! multiplied again and again with 1, 2, 4 and 8 activation rows on one thread, in nanoseconds
//! per weight block and activation row: what a decode step of a few streams costs once its
//! weights are read (`gemv_bench` times the reads). `cargo run --release -p gantry-cpu-kernels
//! --example kq_gemm_bench [TYPE]` (a prefix of `q4_k`, `q5_k`, `q6_k` or `iq4_xs`).
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
    use gantry_cpu_kernels::x86::{v4, BlockIQ4XS, BlockQ4K, BlockQ5K, BlockQ6K};

    use crate::common::{best, masked_blocks, q8_k_activations, Gemm, Rng};

    /// Best of 5 runs of 2000 products of 128 rows × 6 blocks (qwen2.5-coder-1.5b's row of
    /// 1536 values) with `n` activation rows: nanoseconds per weight block and activation row.
    fn time<B>(rng: &mut Rng, gemm: Gemm<B>, n: usize) -> f64 {
        let (rows, k) = (128usize, 6usize);
        let a: Vec<B> = masked_blocks(rng, rows * k, 0x3b);
        let b = q8_k_activations(rng, n * k);
        let mut c = vec![0f32; rows * n];
        let seconds = best(|| {
            // SAFETY: `a` holds `rows` rows and `b` `n` columns of `k` blocks; `c` holds every
            // `j * rows + i`; the machines this runs on have AVX-512 VNNI.
            unsafe { gemm(0..rows, n, k, a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), rows) };
            std::hint::black_box(&mut c);
        });
        seconds * 1e9 / (2000 * rows * k * n) as f64
    }

    pub(crate) fn run() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let filter = std::env::args().nth(1).unwrap_or_default();
        macro_rules! measure {
            ($name:literal, $gemm:expr) => {
                if filter.is_empty() || $name.starts_with(filter.as_str()) {
                    let cells: Vec<String> =
                        [1, 2, 4, 8].iter().map(|&n| format!("{n}: {:.2}", time(&mut rng, $gemm, n))).collect();
                    println!("{} ns per block and activation row, by rows: {}", $name, cells.join(", "));
                }
            };
        }
        measure!("q4_k", v4::gemm_q4_k as Gemm<BlockQ4K>);
        measure!("q5_k", v4::gemm_q5_k as Gemm<BlockQ5K>);
        measure!("q6_k", v4::gemm_q6_k as Gemm<BlockQ6K>);
        measure!("iq4_xs", v4::gemm_iq4_xs as Gemm<BlockIQ4XS>);
    }
}
