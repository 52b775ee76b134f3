//! The 16-row layouts' AVX2 kernels (`x86/rows16_avx2.rs`, for CPUs without AVX-512 VNNI, and
//! `x86/rows16_avxvnni.rs` where they have AVX-VNNI) timed against the AVX-512 ones on the same
//! copies. `cargo run --release -p gantry-cpu-kernels --example rows16_avx2_bench`: for Q4_K,
//! Q5_K, Q6_K and IQ4_XS, weights in L2, nanoseconds per weight block and activation row at 1 to
//! 64 activation rows; then one activation row against 384 MiB of Q4_K weights, GB/s. Needs
//! AVX-512 VNNI (it times every level).
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
    use gantry_cpu_kernels::x86::{
        avxvnni, repack_iq4_xs_rows16, repack_q4_k_rows16, repack_q5_k_rows16, repack_q6_k_rows16, v3, v4, BlockIQ4XS,
        BlockQ4K, BlockQ5K, BlockQ6K,
    };

    use crate::common::{best, best_of_3, masked_blocks, q8_k_activations, Rng, Rows16Gemm};

    pub(crate) fn run() {
        assert!(is_x86_feature_detected!("avx512vnni"), "needs AVX-512 VNNI");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // 128 rows of 1536 values (qwen2.5-coder-1.5b's row); small positive f16 scales.
        let (rows, k) = (128usize, 6usize);
        let q4: Vec<BlockQ4K> = masked_blocks(&mut rng, rows * k, 0x3b);
        let q5: Vec<BlockQ5K> = masked_blocks(&mut rng, rows * k, 0x3b);
        let q6: Vec<BlockQ6K> = masked_blocks::<BlockQ6K>(&mut rng, rows * k, 0xff)
            .into_iter()
            .map(|b| BlockQ6K { d: 0x3c00, ..b })
            .collect();
        let iq4: Vec<BlockIQ4XS> = masked_blocks::<BlockIQ4XS>(&mut rng, rows * k, 0xff)
            .into_iter()
            .map(|b| BlockIQ4XS { d: 0x3c00, ..b })
            .collect();
        // SAFETY: each set of kernels multiplies the copy it is given; AVX-512 VNNI was checked (and
        // AVX-VNNI is before its kernels run).
        unsafe {
            let r = repack_q4_k_rows16(&q4, rows, k, k);
            compare(
                "Q4_K",
                &mut rng,
                &r,
                rows,
                k,
                [v4::gemm_q4_k_rows16, v3::gemm_q4_k_rows16, avxvnni::gemm_q4_k_rows16],
            );
            let r = repack_q5_k_rows16(&q5, rows, k, k);
            compare(
                "Q5_K",
                &mut rng,
                &r,
                rows,
                k,
                [v4::gemm_q5_k_rows16, v3::gemm_q5_k_rows16, avxvnni::gemm_q5_k_rows16],
            );
            let r = repack_q6_k_rows16(&q6, rows, k, k);
            compare(
                "Q6_K",
                &mut rng,
                &r,
                rows,
                k,
                [v4::gemm_q6_k_rows16, v3::gemm_q6_k_rows16, avxvnni::gemm_q6_k_rows16],
            );
            let r = repack_iq4_xs_rows16(&iq4, rows, k, k);
            compare(
                "IQ4_XS",
                &mut rng,
                &r,
                rows,
                k,
                [v4::gemm_iq4_xs_rows16, v3::gemm_iq4_xs_rows16, avxvnni::gemm_iq4_xs_rows16],
            );
        }
        streamed(&mut rng);
    }

    /// The three levels' kernels on one copy (AVX-512, AVX2, AVX-VNNI where this CPU has it) (`rows` rows of `k` blocks): ns per block and activation row.
    ///
    /// # Safety
    /// `r` holds `rows / 16` groups of `k` blocks; this CPU has AVX-512 VNNI.
    unsafe fn compare<R>(name: &str, rng: &mut Rng, r: &[R], rows: usize, k: usize, [a, b, v]: [Rows16Gemm<R>; 3]) {
        for n in [1usize, 2, 4, 8, 64] {
            let y = q8_k_activations(rng, n * k);
            let mut c = vec![0f32; rows * n];
            let mut time = |g: Rows16Gemm<R>| {
                // SAFETY: the caller's; `y` holds `n` columns and `c` `rows · n` values.
                best(|| unsafe { g(0..rows / 16, n, k, r.as_ptr(), y.as_ptr(), k, c.as_mut_ptr(), rows) })
            };
            let per = |s: f64| s * 1e9 / (2000 * rows * k * n) as f64;
            let (t4, t3) = (per(time(a)), per(time(b)));
            let tv = if is_x86_feature_detected!("avxvnni") { format!("{:.2} ns", per(time(v))) } else { "-".into() };
            println!(
                "{name} {n} rows: AVX-512 {t4:.2} ns, AVX2 {t3:.2} ns, AVX-VNNI {tv} per block and activation row"
            );
        }
    }

    /// One activation row against 384 MiB of Q4_K weights in the copy (rows of 1536 values), one
    /// pass each, best of 3: GB/s of the copy's bytes.
    fn streamed(rng: &mut Rng) {
        let k = 6usize;
        let rows = (384usize << 20) / (k * std::mem::size_of::<BlockQ4K>()) / 16 * 16;
        let x: Vec<BlockQ4K> = masked_blocks(rng, rows * k, 0x3b);
        let r = repack_q4_k_rows16(&x, rows, k, k);
        let y = q8_k_activations(rng, k);
        let mut out = vec![0f32; rows];
        let bytes = std::mem::size_of_val(r.as_slice()) as f64;
        // SAFETY: `r` holds `rows / 16` groups of `k` blocks, `y` one column; AVX-512 VNNI was checked.
        let t4 = best_of_3(&mut || unsafe {
            v4::gemm_q4_k_rows16(0..rows / 16, 1, k, r.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), rows)
        });
        // SAFETY: as above.
        let t3 = best_of_3(&mut || unsafe {
            v3::gemm_q4_k_rows16(0..rows / 16, 1, k, r.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), rows)
        });
        println!(
            "Q4_K 1 row streamed, 1 thread: AVX-512 {:.1} GB/s, AVX2 {:.1} GB/s",
            bytes / t4 / 1e9,
            bytes / t3 / 1e9
        );
    }
}
