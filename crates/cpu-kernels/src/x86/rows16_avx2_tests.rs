//! The AVX2 kernels of the 16-row layouts (`rows16_avx2`, and with AVX-VNNI `rows16_avxvnni`)
//! against the exact sums and, bit for bit, against the AVX-512 ones.

use super::iq4_xs::tests::{exact as exact_iq4, q8_rows, random_iq4};
use super::iq4_xs::BlockIQ4XS;
use super::k_quants::test_data::{avx512_here, check_rows16_at, check_rows16_with, random_q8, Rng, Rows16Gemm};
use super::k_quants::QK_K;
use super::q4_k::tests::{exact as exact_q4, random_q4};
use super::q4_k::BlockQ4K;
use super::q5_k::tests::{exact as exact_q5, random_q5};
use super::q5_k::BlockQ5K;
use super::q6_k::tests::{exact as exact_q6, random_q6};
use super::q6_k::BlockQ6K;
use super::rows16_avx2::*;
use super::*;
use super::{repack_iq4_xs_rows16, repack_q4_k_rows16, repack_q5_k_rows16, repack_q6_k_rows16};
use super::{rows16_avx2, rows16_avxvnni};

fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[test]
fn every_row_and_column_equals_the_exact_sums() {
    assert!(has_avx2(), "every x86 machine these servers run on has AVX2");
    check_rows16_at(&mut Rng(11), random_q4, exact_q4, repack_q4_k_rows16, gemm_q4_k_rows16);
    check_rows16_at(&mut Rng(12), random_q5, exact_q5, repack_q5_k_rows16, gemm_q5_k_rows16);
    check_rows16_at(&mut Rng(13), random_q6, exact_q6, repack_q6_k_rows16, gemm_q6_k_rows16);
    // IQ4_XS as its sign trick allows: activations as Q8_K quantization writes them, no −128.
    check_rows16_with(&mut Rng(15), random_iq4, q8_rows, exact_iq4, repack_iq4_xs_rows16, gemm_iq4_xs_rows16);
}

#[test]
fn with_avx_vnni_every_row_and_column_equals_the_exact_sums() {
    if !is_x86_feature_detected!("avxvnni") {
        eprintln!("SKIPPED: this CPU has no AVX-VNNI (Zen 4 has none; Intel's Xeons from Sapphire Rapids on do)");
        return;
    }
    check_rows16_at(&mut Rng(21), random_q4, exact_q4, repack_q4_k_rows16, rows16_avxvnni::gemm_q4_k_rows16);
    check_rows16_at(&mut Rng(22), random_q5, exact_q5, repack_q5_k_rows16, rows16_avxvnni::gemm_q5_k_rows16);
    check_rows16_at(&mut Rng(23), random_q6, exact_q6, repack_q6_k_rows16, rows16_avxvnni::gemm_q6_k_rows16);
    // The levels plus 128: exact for every activation, −128 included.
    check_rows16_at(&mut Rng(25), random_iq4, exact_iq4, repack_iq4_xs_rows16, rows16_avxvnni::gemm_iq4_xs_rows16);
}

/// One set of 256-bit kernels for the four layouts.
struct Kernels {
    q4_k: Rows16Gemm<Q4KRows16>,
    q5_k: Rows16Gemm<Q5KRows16>,
    q6_k: Rows16Gemm<Q6KRows16>,
    iq4_xs: Rows16Gemm<IQ4XSRows16>,
}

const AVX2: Kernels = Kernels {
    q4_k: rows16_avx2::gemm_q4_k_rows16,
    q5_k: rows16_avx2::gemm_q5_k_rows16,
    q6_k: rows16_avx2::gemm_q6_k_rows16,
    iq4_xs: rows16_avx2::gemm_iq4_xs_rows16,
};

const AVX_VNNI: Kernels = Kernels {
    q4_k: rows16_avxvnni::gemm_q4_k_rows16,
    q5_k: rows16_avxvnni::gemm_q5_k_rows16,
    q6_k: rows16_avxvnni::gemm_q6_k_rows16,
    iq4_xs: rows16_avxvnni::gemm_iq4_xs_rows16,
};

/// `gemm`'s output for `x` (32 rows of `k` blocks) by `n` columns `y`, both groups.
fn product<R>(repacked: &[R], k: usize, n: usize, y: &[BlockQ8K], gemm: Rows16Gemm<R>) -> Vec<u32> {
    let mut c = vec![f32::NAN; 32 * n];
    unsafe { gemm(0..2, n, k, repacked.as_ptr(), y.as_ptr(), k, c.as_mut_ptr(), 32) };
    c.into_iter().map(f32::to_bits).collect()
}

/// The same integer sums, scaled and added in the same order: bit for bit the AVX-512
/// kernels' results, on random values and on the largest a 16-bit sum meets (every value at
/// its top, every activation −128 or 127; for IQ4_XS ±127, as its sign trick allows).
#[test]
fn results_are_the_avx512_kernels_bit_for_bit() {
    if !avx512_here() {
        return;
    }
    bit_for_bit("AVX2", &AVX2, -127);
    if is_x86_feature_detected!("avxvnni") {
        bit_for_bit("AVX-VNNI", &AVX_VNNI, -128);
    } else {
        eprintln!("SKIPPED the AVX-VNNI kernels: this CPU has none");
    }
}

/// `kernels` against the AVX-512 ones; IQ4_XS with activations from `lowest` up (AVX2's sign
/// trick leaves −128 unnegated).
fn bit_for_bit(name: &str, kernels: &Kernels, lowest: i8) {
    let rng = &mut Rng(14);
    for (k, n) in [(1, 1), (6, 5), (35, 9)] {
        let ends = |y: i8| -> Vec<BlockQ8K> {
            (0..n * k).map(|_| BlockQ8K { d: 0.5, qs: [y; QK_K], bsums: [16 * i16::from(y); 16] }).collect()
        };
        for y in [random_q8(rng, n * k), ends(-128), ends(127)] {
            let q4: Vec<BlockQ4K> = random_q4(rng, 32 * k);
            let top4: Vec<BlockQ4K> = (0..32 * k)
                .map(|_| BlockQ4K { d: 0x3c00, dmin: 0x3c00, scales: [0xff; 12], qs: [0xff; 128] })
                .collect();
            for x in [q4, top4] {
                let r = repack_q4_k_rows16(&x, 32, k, k);
                let want = product(&r, k, n, &y, super::v4::gemm_q4_k_rows16);
                assert_eq!(product(&r, k, n, &y, kernels.q4_k), want, "{name} Q4_K k={k} n={n}");
            }
            let q5: Vec<BlockQ5K> = random_q5(rng, 32 * k);
            let top5: Vec<BlockQ5K> = (0..32 * k)
                .map(|_| BlockQ5K { d: 0x3c00, dmin: 0x3c00, scales: [0xff; 12], qh: [0xff; 32], qs: [0xff; 128] })
                .collect();
            for x in [q5, top5] {
                let r = repack_q5_k_rows16(&x, 32, k, k);
                let want = product(&r, k, n, &y, super::v4::gemm_q5_k_rows16);
                assert_eq!(product(&r, k, n, &y, kernels.q5_k), want, "{name} Q5_K k={k} n={n}");
            }
            let q6: Vec<BlockQ6K> = random_q6(rng, 32 * k);
            let top6: Vec<BlockQ6K> = (0..32 * k)
                .map(|_| BlockQ6K { ql: [0xff; 128], qh: [0xff; 64], scales: [127; 16], d: 0x3c00 })
                .collect();
            let low6: Vec<BlockQ6K> =
                (0..32 * k).map(|_| BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [-128; 16], d: 0x3c00 }).collect();
            for x in [q6, top6, low6] {
                let r = repack_q6_k_rows16(&x, 32, k, k);
                let want = product(&r, k, n, &y, super::v4::gemm_q6_k_rows16);
                assert_eq!(product(&r, k, n, &y, kernels.q6_k), want, "{name} Q6_K k={k} n={n}");
            }
        }
        // IQ4_XS: every index 0 (level −127) or 15 (113), every scale −32 or 31; activations
        // from `lowest` up.
        let random = if lowest == -128 { random_q8(rng, n * k) } else { q8_rows(rng, n * k) };
        for y in [random, ends(lowest), ends(127)] {
            let uniform = |index: u8, scales: u8| -> Vec<BlockIQ4XS> {
                let (scales_h, scales_l) = (u16::from(scales) * 0x0101, [scales; 4]);
                (0..32 * k).map(|_| BlockIQ4XS { d: 0x3c00, scales_h, scales_l, qs: [index; 128] }).collect()
            };
            let edges = [uniform(0, 0), uniform(0xff, 0xff), uniform(0, 0xff), uniform(0xff, 0)];
            for x in std::iter::once(random_iq4(rng, 32 * k)).chain(edges) {
                let r = repack_iq4_xs_rows16(&x, 32, k, k);
                let want = product(&r, k, n, &y, super::v4::gemm_iq4_xs_rows16);
                assert_eq!(product(&r, k, n, &y, kernels.iq4_xs), want, "{name} IQ4_XS k={k} n={n}");
            }
        }
    }
}
