//! The Q4_0 kernels (AVX-512 only) against ggml's own `Q4_0 · Q8_0` kernel: one row, and a few
//! rows through `multiply` with the strides and row shares ggml uses, on weights and activations
//! quantized by ggml.

use std::os::raw::{c_int, c_void};

use llama_cpp_sys_2::{ggml_type, GGML_TYPE_F32, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0};

use super::install::{ggml_kernel, traits_of, Level};
use super::k_quant_tests::floats;
use super::small_batches::{multiply, ComputeParams, Product};
use super::tests::{ggml_ready, Rng};
use gantry_cpu_kernels::x86::{BlockQ4, BlockQ8, QK};

const Q4_BYTES: usize = std::mem::size_of::<BlockQ4>();
const Q8_BYTES: usize = std::mem::size_of::<BlockQ8>();

fn i(v: usize) -> i64 {
    i64::try_from(v).expect("small")
}

/// `rows` rows of `n` weights quantized to Q4_0 by ggml.
fn q4_0_rows(rng: &mut Rng, rows: usize, n: usize) -> Vec<u8> {
    let values = floats(rng, rows * n);
    let mut out = vec![0u8; rows * n / QK * Q4_BYTES];
    // SAFETY: `out` has room for `rows` rows of `n` Q4_0 values.
    let written = unsafe {
        llama_cpp_sys_2::ggml_quantize_chunk(
            GGML_TYPE_Q4_0,
            values.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            i(rows),
            i(n),
            std::ptr::null(),
        )
    };
    assert_eq!(written, out.len());
    out
}

/// A row of `n` activations quantized to Q8_0 as ggml quantizes them before a product.
fn q8_0_row(rng: &mut Rng, n: usize) -> Vec<u8> {
    let values = floats(rng, n);
    let mut out = vec![0u8; n / QK * Q8_BYTES];
    // SAFETY: ggml's table entry; `out` has room for the row.
    unsafe {
        let from_float = (*traits_of(GGML_TYPE_Q8_0)).from_float.expect("ggml quantizes to Q8_0");
        from_float(values.as_ptr(), out.as_mut_ptr().cast(), i(n));
    }
    out
}

/// `n` values of `ty` dequantized by ggml.
fn dequantized(ty: ggml_type, row: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // SAFETY: ggml's table entry; `row` holds `n` values of `ty`.
    unsafe {
        let to_float = (*llama_cpp_sys_2::ggml_get_type_traits(ty)).to_float.expect("dequantizes");
        to_float(row.as_ptr().cast(), out.as_mut_ptr(), i(n));
    }
    out
}

/// Σ |w·y| over a Q4_0 row and a Q8_0 row, dequantized: what float rounding is relative to.
fn magnitude(x: &[u8], y: &[u8], n: usize) -> f64 {
    let (w, a) = (dequantized(GGML_TYPE_Q4_0, x, n), dequantized(GGML_TYPE_Q8_0, y, n));
    w.iter().zip(&a).map(|(w, a)| (f64::from(*w) * f64::from(*a)).abs()).sum()
}

fn dot(kernel: super::install::VecDot, n: usize, x: &[u8], y: &[u8]) -> f64 {
    let mut s = f32::NAN;
    // SAFETY: x and y hold n / 32 blocks of their types; s is one float.
    unsafe { kernel(n as c_int, &mut s, 0, x.as_ptr().cast::<c_void>(), 0, y.as_ptr().cast::<c_void>(), 0, 1) };
    f64::from(s)
}

fn avx512() -> bool {
    Level::detect() == Some(Level::V4)
}

#[test]
fn one_row_agrees_with_ggml_on_quantized_weights() {
    assert!(avx512(), "the machines these tests run on all have AVX-512 VNNI");
    ggml_ready();
    let ours = Level::V4.q4_0().expect("AVX-512 has a Q4_0 kernel");
    assert!(Level::V3.q4_0().is_none(), "with AVX2 ggml's repacked kernels serve Q4_0");
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    // The 1.5B's row lengths (1,536 and 8,960), the shortest, and 1-3 blocks past a group of four.
    for n in [32, 64, 96, 160, 1536, 8960] {
        let rows = q4_0_rows(&mut rng, 4, n);
        for x in rows.chunks(n / QK * Q4_BYTES) {
            let y = q8_0_row(&mut rng, n);
            let (ours, theirs) = (dot(ours, n, x, &y), dot(ggml_kernel(GGML_TYPE_Q4_0), n, x, &y));
            let tolerance = 1e-5 * magnitude(x, &y, n);
            assert!((ours - theirs).abs() <= tolerance, "n={n}: {ours} against ggml {theirs} (±{tolerance})");
        }
    }
}

#[test]
fn a_few_rows_agree_with_ggml_row_by_row_in_every_share() {
    assert!(avx512(), "the machines these tests run on all have AVX-512 VNNI");
    ggml_ready();
    let theirs = ggml_kernel(GGML_TYPE_Q4_0);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (m, k) in [(1, 1), (2, 6), (7, 3), (9, 48)] {
        // Padding between rows, as ggml's views may have.
        let (lda, ldb) = (k + 2, k + 1);
        let a = q4_0_rows(&mut rng, m, lda * QK);
        for n in [2, 3, 5, 7, 8, 9, 17, 64] {
            let b: Vec<u8> = (0..n).flat_map(|_| q8_0_row(&mut rng, ldb * QK)).collect();
            let ldc = m + 3;
            let mut c = vec![f32::NAN; n * ldc];
            let product = Product {
                m: i(m),
                n: i(n),
                k: i(k),
                a: a.as_ptr().cast(),
                lda: i(lda),
                b: b.as_ptr().cast(),
                ldb: i(ldb),
                c: c.as_mut_ptr().cast(),
                ldc: i(ldc),
                a_type: GGML_TYPE_Q4_0 as c_int,
                b_type: GGML_TYPE_Q8_0 as c_int,
                c_type: GGML_TYPE_F32 as c_int,
            };
            for ith in 0..3 {
                // SAFETY: the matrices hold what the sizes say.
                let done = unsafe { multiply(Some(Level::V4), &ComputeParams { ith, nth: 3 }, product) };
                assert!(done, "m={m} k={k} n={n}: declined");
            }
            for j in 0..n {
                for r in 0..ldc {
                    let at = format!("m={m} k={k} n={n} row {r} column {j}");
                    let got = c[j * ldc + r];
                    if r >= m {
                        assert!(got.is_nan(), "{at}: wrote past the rows");
                        continue;
                    }
                    let x = &a[r * lda * Q4_BYTES..][..k * Q4_BYTES];
                    let y = &b[j * ldb * Q8_BYTES..][..k * Q8_BYTES];
                    let want = dot(theirs, k * QK, x, y);
                    let tolerance = 1e-5 * magnitude(x, y, k * QK);
                    assert!((f64::from(got) - want).abs() <= tolerance, "{at}: {got} against ggml {want}");
                }
            }
        }
    }
}
