//! The K-quant kernels (Q4_K, Q5_K, Q6_K and IQ4_XS, AVX-512 only) against ggml's own `· Q8_K` kernels: one
//! row, and a few rows through `multiply` with the strides and row shares ggml uses; on weights
//! ggml quantized and on a pulled model's own rows.

use std::os::raw::{c_int, c_void};

use llama_cpp_sys_2::{
    ggml_type, GGML_TYPE_F32, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K,
};

use super::install::{ggml_kernel, quantize_q8_k_v3, quantize_q8_k_v4, traits_of, Level};
use super::small_batches::{multiply, ComputeParams, Product};
use super::tests::{ggml_ready, Rng};
use gantry_cpu_kernels::x86::{BlockQ8K, QK_K};

pub(super) const Q8_K_BYTES: usize = std::mem::size_of::<BlockQ8K>();

/// The weight types, with their block sizes in bytes.
pub(super) const TYPES: [(ggml_type, usize); 4] =
    [(GGML_TYPE_Q4_K, 144), (GGML_TYPE_Q6_K, 210), (GGML_TYPE_Q5_K, 176), (GGML_TYPE_IQ4_XS, 136)];

/// Values spread as a layer's weights or activations are: mostly small, a few large.
fn floats(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u = (rng.next() >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
            if rng.next().is_multiple_of(64) {
                40.0 * u
            } else {
                u
            }
        })
        .collect()
}

/// `rows` rows of `n` values quantized to `ty` (of `bytes` a block) by ggml.
pub(super) fn weight_rows(rng: &mut Rng, (ty, bytes): (ggml_type, usize), rows: usize, n: usize) -> Vec<u8> {
    let values = floats(rng, rows * n);
    let mut out = vec![0u8; rows * n / QK_K * bytes];
    let i = |v: usize| i64::try_from(v).expect("small");
    // SAFETY: `out` has room for `rows` rows of `n` values of `ty`.
    let written = unsafe {
        llama_cpp_sys_2::ggml_quantize_chunk(
            ty,
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

/// A row of `n` activations quantized to Q8_K as ggml quantizes them before a product.
pub(super) fn q8_k_row(rng: &mut Rng, n: usize) -> Vec<u8> {
    let values = floats(rng, n);
    let mut out = vec![0u8; n / QK_K * Q8_K_BYTES];
    // SAFETY: ggml's table entry; `out` has room for the row.
    unsafe {
        let from_float = (*traits_of(GGML_TYPE_Q8_K)).from_float.expect("ggml quantizes to Q8_K");
        from_float(values.as_ptr(), out.as_mut_ptr().cast(), i64::try_from(n).expect("small"));
    }
    out
}

/// Σ |w·y| over a row of `ty` and a Q8_K row, dequantized: what float rounding is relative to.
pub(super) fn magnitude(ty: ggml_type, x: &[u8], y: &[u8], n: usize) -> f64 {
    let mut w = vec![0f32; n];
    // SAFETY: ggml's table entry; `x` holds `n` values of `ty`.
    unsafe {
        let to_float = (*llama_cpp_sys_2::ggml_get_type_traits(ty)).to_float.expect("dequantizes");
        to_float(x.as_ptr().cast(), w.as_mut_ptr(), i64::try_from(n).expect("small"));
    }
    (0..n)
        .map(|i| {
            let block = &y[i / QK_K * Q8_K_BYTES..];
            let d = f32::from_le_bytes(block[..4].try_into().expect("4 bytes"));
            let q = block[4 + i % QK_K] as i8;
            (f64::from(w[i]) * f64::from(d) * f64::from(q)).abs()
        })
        .sum()
}

pub(super) fn dot(kernel: super::install::VecDot, n: usize, x: &[u8], y: &[u8]) -> f64 {
    let mut s = f32::NAN;
    // SAFETY: x and y hold n / 256 blocks of their types; s is one float.
    unsafe { kernel(n as c_int, &mut s, 0, x.as_ptr().cast::<c_void>(), 0, y.as_ptr().cast::<c_void>(), 0, 1) };
    f64::from(s)
}

/// The first rows of a pulled model's FFN down-projection (Q6_K in Q4_K_M models) and gate
/// projection (Q4_K), where this machine has a pulled Qwen model: `(type, rows, row length)`.
/// Empty (said on stderr) without one.
pub(super) fn pulled_rows(rows: usize) -> Vec<(ggml_type, Vec<u8>, usize)> {
    use std::io::{Read, Seek, SeekFrom};
    let files = ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", tiny_gguf::pulled::DEFAULT_MODEL];
    let Some(path) = tiny_gguf::pulled::pulled_models(&files, "real K-quant rows are not checked").into_iter().next()
    else {
        return Vec::new();
    };
    let header = crate::model::gguf_header::Header::open(&path).expect("a GGUF");
    let mut file = std::fs::File::open(&path).expect("readable");
    // A down-projection's rows are `feed_forward_length` long, a gate projection's
    // `embedding_length`.
    let wanted = [("ffn_down.weight", "qwen2.feed_forward_length"), ("ffn_gate.weight", "qwen2.embedding_length")];
    let mut found = Vec::new();
    for (ty, bytes) in TYPES {
        for (suffix, length) in wanted {
            let Some(id) = (0..header.n_tensors())
                .find(|&id| header.tensor_type(id) == ty && header.tensor_name(id).ends_with(suffix))
            else {
                continue;
            };
            let n = header.u32(length).expect("a Qwen2 model") as usize;
            let mut data = vec![0u8; rows * n / QK_K * bytes];
            file.seek(SeekFrom::Start(header.tensor_span(id).0)).expect("seek");
            file.read_exact(&mut data).expect("the tensor's first rows");
            eprintln!("real rows: {} of {}, type {ty}, {n} values", path.display(), header.tensor_name(id));
            found.push((ty, data, n));
            break;
        }
    }
    assert!(found.len() == 2, "Q4_K_M models have Q4_K and Q6_K projections: {} of 2 found", found.len());
    found
}

/// Whether this CPU runs the AVX-512 kernels; where not (an AVX2-only EPYC, a client core), the
/// test that asks says it skips them.
fn avx512() -> bool {
    let here = Level::detect() == Some(Level::V4);
    if !here {
        eprintln!("SKIPPED: this CPU has no AVX-512 VNNI, so its K-quant kernels are not run here");
    }
    here
}

#[test]
fn one_row_agrees_with_ggml_on_quantized_and_real_weights() {
    if !avx512() {
        return;
    }
    ggml_ready();
    let k_quants = Level::V4.k_quants().expect("AVX-512 has K-quant kernels");
    assert!(Level::V3.k_quants().is_none(), "with AVX2 ggml's kernels serve K-quants");
    assert!(Level::AvxVnni.k_quants().is_none(), "with AVX-VNNI too, where not from the copies");
    let ours = |ty: ggml_type| k_quants.iter().find(|k| k.0 == ty).expect("a kernel for every type tested").1;
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let mut cases = Vec::new();
    for t in TYPES {
        for n in [256, 512, 1536, 4864, 8960] {
            cases.push((t.0, weight_rows(&mut rng, t, 4, n), n));
        }
    }
    cases.extend(pulled_rows(4));
    for (ty, rows, n) in cases {
        let bytes = TYPES.iter().find(|t| t.0 == ty).expect("a K-quant").1;
        for x in rows.chunks(n / QK_K * bytes) {
            let y = q8_k_row(&mut rng, n);
            let (ours, theirs) = (dot(ours(ty), n, x, &y), dot(ggml_kernel(ty), n, x, &y));
            let tolerance = 1e-5 * magnitude(ty, x, &y, n);
            assert!((ours - theirs).abs() <= tolerance, "type {ty} n={n}: {ours} against ggml {theirs} (±{tolerance})");
        }
    }
}

#[test]
fn one_row_and_a_few_rows_agree_with_ggml_row_by_row_in_every_share() {
    if !avx512() {
        return;
    }
    ggml_ready();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for ((ty, bytes), (m, k)) in TYPES.into_iter().flat_map(|t| [(1, 1), (2, 6), (7, 2), (9, 35)].map(|s| (t, s))) {
        // Padding between rows, as ggml's views may have.
        let (lda, ldb) = (k + 2, k + 1);
        let a = weight_rows(&mut rng, (ty, bytes), m, lda * QK_K);
        for n in [1, 2, 3, 5, 7, 8, 9, 17] {
            let b: Vec<u8> = (0..n).flat_map(|_| q8_k_row(&mut rng, ldb * QK_K)).collect();
            let mut c = vec![f32::NAN; n * (m + 3)];
            let product = k_quant_product(ty, &a, (m, k, lda), &b, n, &mut c);
            for ith in 0..3 {
                // SAFETY: the matrices hold what the sizes say.
                let done = unsafe { multiply(Some(Level::V4), &ComputeParams { ith, nth: 3 }, product) };
                assert!(done, "type {ty} m={m} k={k} n={n}: declined");
            }
            check_against_ggml(ty, &a, (m, k, lda), &b, n, &c);
        }
    }
}

/// The product of `m` rows of `k` blocks (`lda` apart) of `ty` in `a` and `n` Q8_K rows of `b`
/// (as long as each fits) into `c`, `m + 3` floats a column.
pub(super) fn k_quant_product(
    ty: ggml_type,
    a: &[u8],
    (m, k, lda): (usize, usize, usize),
    b: &[u8],
    n: usize,
    c: &mut [f32],
) -> Product {
    let i = |v: usize| i64::try_from(v).expect("small");
    Product {
        m: i(m),
        n: i(n),
        k: i(k),
        a: a.as_ptr().cast(),
        lda: i(lda),
        b: b.as_ptr().cast(),
        ldb: i(b.len() / n / Q8_K_BYTES),
        c: c.as_mut_ptr().cast(),
        ldc: i(m + 3),
        a_type: ty as c_int,
        b_type: GGML_TYPE_Q8_K as c_int,
        c_type: GGML_TYPE_F32 as c_int,
    }
}

/// Checks `c` (as [`k_quant_product`] lays it out) against ggml's kernel row by row, and that
/// nothing past the rows was written.
pub(super) fn check_against_ggml(
    ty: ggml_type,
    a: &[u8],
    (m, k, lda): (usize, usize, usize),
    b: &[u8],
    n: usize,
    c: &[f32],
) {
    let bytes = TYPES.iter().find(|t| t.0 == ty).expect("a K-quant").1;
    let (ldb, ldc) = (b.len() / n / Q8_K_BYTES, m + 3);
    for j in 0..n {
        for r in 0..ldc {
            let at = format!("type {ty} m={m} k={k} n={n} row {r} column {j}");
            let got = c[j * ldc + r];
            if r >= m {
                assert!(got.is_nan(), "{at}: wrote past the rows");
                continue;
            }
            let x = &a[r * lda * bytes..][..k * bytes];
            let y = &b[j * ldb * Q8_K_BYTES..][..k * Q8_K_BYTES];
            let want = dot(ggml_kernel(ty), k * QK_K, x, y);
            let tolerance = 1e-5 * magnitude(ty, x, y, k * QK_K);
            assert!((f64::from(got) - want).abs() <= tolerance, "{at}: {got} against ggml {want}");
        }
    }
}

#[test]
fn with_avx2_k_quant_products_stay_with_ggml() {
    // The AVX2 level has no K-quant kernels but those of the 16-row copies, which take whole
    // groups of 16 rows only: multiply declines four (llamafile does too), and ggml multiplies
    // row by row with its own.
    ggml_ready();
    let mut rng = Rng(7);
    let a = weight_rows(&mut rng, TYPES[1], 4, QK_K);
    let b: Vec<u8> = (0..3).flat_map(|_| q8_k_row(&mut rng, QK_K)).collect();
    let mut c = vec![f32::NAN; 12];
    let product = Product {
        m: 4,
        n: 3,
        k: 1,
        a: a.as_ptr().cast(),
        lda: 1,
        b: b.as_ptr().cast(),
        ldb: 1,
        c: c.as_mut_ptr().cast(),
        ldc: 4,
        a_type: GGML_TYPE_Q6_K as c_int,
        b_type: GGML_TYPE_Q8_K as c_int,
        c_type: GGML_TYPE_F32 as c_int,
    };
    // SAFETY: the matrices hold what the sizes say.
    let done = unsafe { multiply(Some(Level::V3), &ComputeParams { ith: 0, nth: 1 }, product) };
    assert!(!done, "llamafile has no K-quant kernels, and AVX2 none of Gantry's");
    assert!(c.iter().all(|v| v.is_nan()));
}

extern "C" {
    /// ggml's reference quantizer (`ggml-quants.c`), which its x86 CPU backend calls.
    fn quantize_row_q8_K_ref(x: *const f32, y: *mut c_void, k: i64);
}

#[test]
fn activations_quantize_to_the_bytes_of_ggmls_reference() {
    let mut rng = Rng(0x5bd1_e995);
    let n = 64 * QK_K;
    let mut values = floats(&mut rng, n);
    values[3 * QK_K..4 * QK_K].fill(0.0);
    values[5 * QK_K + 17] = -3.5;
    values[5 * QK_K + 90] = 3.5;
    let mut quantizers = vec![("AVX2", quantize_q8_k_v3 as unsafe extern "C" fn(_, _, _))];
    if avx512() {
        quantizers.push(("AVX-512", quantize_q8_k_v4));
    }
    for (level, quantizer) in quantizers {
        for scale in [1e-4f32, 1.0, 300.0] {
            let x: Vec<f32> = values.iter().map(|v| v * scale).collect();
            let (mut ours, mut theirs) = (vec![0u8; n / QK_K * Q8_K_BYTES], vec![0u8; n / QK_K * Q8_K_BYTES]);
            let k = i64::try_from(n).expect("small");
            // SAFETY: both have room for the row's blocks; ggml's reference takes the same arguments.
            unsafe {
                quantizer(x.as_ptr(), ours.as_mut_ptr().cast(), k);
                quantize_row_q8_K_ref(x.as_ptr(), theirs.as_mut_ptr().cast(), k);
            }
            for (b, (ours, theirs)) in ours.chunks(Q8_K_BYTES).zip(theirs.chunks(Q8_K_BYTES)).enumerate() {
                assert_eq!(ours, theirs, "{level}, scale {scale}: block {b}");
            }
        }
    }
}
