//! The small-batch products against the exact sums and llamafile's, with the strides and row
//! shares ggml uses; and ggml's products of a few rows reaching them through `--wrap`.

use std::os::raw::c_int;

use llama_cpp_sys_2::{
    ggml_blck_size, ggml_quantize_chunk, ggml_row_size, ggml_type, GGML_TYPE_F32, GGML_TYPE_IQ4_XS, GGML_TYPE_Q2_K,
    GGML_TYPE_Q3_K, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K, GGML_TYPE_Q8_0,
};

use super::install::{ggml_kernel, traits_of, Level};
use super::small_batches::{calls, max_columns, multiply, share, ComputeParams, Product};
use super::tests::{exact, ggml_ready, levels, ones_times_127, q4_row, q5_row, q8_row, Rng};
use gantry_cpu_kernels::x86::QK;

type Blocks = Vec<(f64, [i32; QK])>;

#[test]
fn the_threads_shares_cover_every_row_once_in_pairs() {
    for m in [1, 2, 3, 7, 896, 4865] {
        for nth in 1..=5 {
            let shares: Vec<_> = (0..nth).map(|ith| share(m, ith, nth)).collect();
            let mut next = 0;
            for s in &shares {
                assert!(s.start == next || s.is_empty(), "m={m} nth={nth}: {shares:?}");
                next = next.max(s.end);
                assert!(s.start % 2 == 0 || s.is_empty(), "m={m} nth={nth}: {shares:?}");
            }
            assert_eq!(next, m, "m={m} nth={nth}: {shares:?}");
        }
    }
}

/// `m` weight rows of `ty` (`lda` blocks apart, `k` used), as raw bytes and their values.
fn weights(rng: &mut Rng, ty: u32, m: usize, k: usize, lda: usize) -> (Vec<u8>, Vec<Blocks>) {
    let (mut raw, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..m {
        let (bytes, blocks) = match ty {
            GGML_TYPE_Q8_0 => q8_row(rng, lda * QK, -128),
            GGML_TYPE_Q4_0 => q4_row(rng, lda * QK),
            _ => q5_row(rng, lda * QK),
        };
        raw.extend_from_slice(&bytes);
        rows.push(blocks[..k].to_vec());
    }
    (raw, rows)
}

/// A product's matrices: `m` weight rows of `ty` and `n` activation rows, `k` blocks long, with
/// padding between rows as ggml's views may have; and their values.
struct Matrices {
    ty: u32,
    m: usize,
    n: usize,
    k: usize,
    a: Vec<u8>,
    b: Vec<u8>,
    rows: Vec<Blocks>,
    columns: Vec<Blocks>,
}

impl Matrices {
    fn new(rng: &mut Rng, ty: u32, m: usize, n: usize, k: usize) -> Self {
        let (a, rows) = weights(rng, ty, m, k, k + 2);
        let (mut b, mut columns) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let (bytes, blocks) = q8_row(rng, (k + 1) * QK, -127);
            b.extend_from_slice(&bytes);
            columns.push(blocks[..k].to_vec());
        }
        Self { ty, m, n, k, a, b, rows, columns }
    }

    fn ldc(&self) -> usize {
        self.m + 3
    }

    /// `C` as `multiply` leaves it with `level`, run as `nth` threads would, or `None` where it
    /// declined; entries past the rows stay NaN.
    fn multiply(&self, level: Option<Level>, nth: i32) -> Option<Vec<f32>> {
        let mut c = vec![f32::NAN; self.n * self.ldc()];
        let i = |v: usize| i64::try_from(v).expect("small");
        let product = Product {
            m: i(self.m),
            n: i(self.n),
            k: i(self.k),
            a: self.a.as_ptr().cast(),
            lda: i(self.k + 2),
            b: self.b.as_ptr().cast(),
            ldb: i(self.k + 1),
            c: c.as_mut_ptr().cast(),
            ldc: i(self.ldc()),
            a_type: self.ty as c_int,
            b_type: GGML_TYPE_Q8_0 as c_int,
            c_type: GGML_TYPE_F32 as c_int,
        };
        let mut done = Vec::new();
        for ith in 0..nth {
            // SAFETY: the matrices hold what the sizes say; llamafile's kernels for these types read
            // only the thread index and count of the parameters.
            done.push(unsafe { multiply(level, &ComputeParams { ith, nth }, product) });
        }
        assert!(done.iter().all(|d| *d == done[0]), "threads disagree: {done:?}");
        done[0].then_some(c)
    }
}

#[test]
fn every_level_agrees_with_the_exact_sums_and_with_llamafile() {
    ggml_ready();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for level in levels() {
        for ty in [GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0] {
            for (m, k) in [(1, 1), (2, 3), (7, 5), (38, 28), (9, 152)] {
                let max = max_columns(level) as usize;
                for n in [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 33, 64, 65, max].into_iter().filter(|n| *n <= max) {
                    let x = Matrices::new(&mut rng, ty, m, n, k);
                    let ours = x.multiply(Some(level), 3).expect("ours");
                    // llamafile declines one activation row (ggml's vec_dot would multiply it).
                    let theirs = x.multiply(None, 1);
                    assert_eq!(theirs.is_none(), n == 1, "llamafile multiplies two rows and more");
                    let theirs = theirs.unwrap_or_else(|| ours.clone());
                    let ldc = x.ldc();
                    for j in 0..n {
                        for i in 0..ldc {
                            let (ours, theirs) = (ours[j * ldc + i], theirs[j * ldc + i]);
                            let at = format!("{level:?} type {ty} m={m} k={k} n={n} row {i} column {j}");
                            if i >= m {
                                assert!(ours.is_nan(), "{at}: wrote past the rows");
                                continue;
                            }
                            let (sum, size) = exact(&x.rows[i], &x.columns[j]);
                            let tolerance = 1e-6 * size * k as f64;
                            let ours = f64::from(ours);
                            assert!((ours - sum).abs() <= tolerance, "{at}: {ours} against exact {sum}");
                            assert!(
                                (ours - f64::from(theirs)).abs() <= 2.0 * tolerance,
                                "{at}: {ours} against {theirs}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn what_the_kernels_do_not_serve_goes_to_llamafile_unchanged() {
    // More rows than the level takes (llamafile's own numbers, to the bit), and weights of other
    // types.
    ggml_ready();
    let mut rng = Rng(11);
    for level in levels() {
        let many = Matrices::new(&mut rng, GGML_TYPE_Q8_0, 6, max_columns(level) as usize + 1, 4);
        let (ours, theirs) =
            (many.multiply(Some(level), 2).expect("llamafile"), many.multiply(None, 2).expect("llamafile"));
        let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&theirs), "{level:?}");
        let mut other = Matrices::new(&mut rng, GGML_TYPE_Q8_0, 6, 4, 4);
        other.ty = llama_cpp_sys_2::GGML_TYPE_IQ4_NL;
        other.a.truncate(6 * (4 + 2) * 18);
        let (ours, theirs) =
            (other.multiply(Some(level), 2).expect("llamafile"), other.multiply(None, 2).expect("llamafile"));
        assert_eq!(bits(&ours), bits(&theirs), "{level:?}");
    }
}

#[test]
fn ggml_hands_its_products_of_a_few_rows_to_the_wrapper() {
    // The link step's `--wrap`: a product of 4 activation rows with Q8_0 weights reaches
    // `__wrap_llamafile_sgemm`, which (no level enabled in tests, so that engine tests running
    // meanwhile keep llamafile's numbers) passes it on to llamafile, and the result is right.
    let before = calls();
    let out = ones_times_127(4, 2);
    assert!(calls() > before, "ggml's call to llamafile_sgemm did not reach the wrapper");
    assert_eq!(out, vec![8128.0; 4 * 16]);
}

/// `rows` rows of `n` random values quantized by ggml to `ty`.
fn ggml_rows(rng: &mut Rng, ty: ggml_type, rows: usize, n: usize) -> Vec<u8> {
    let values: Vec<f32> = (0..rows * n).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
    let i = |v: usize| i64::try_from(v).expect("small");
    // SAFETY: a size for every type.
    let mut out = vec![0u8; rows * unsafe { ggml_row_size(ty, i(n)) }];
    // SAFETY: `out` has room for `rows` rows of `n` values of `ty`; no type here needs an imatrix.
    unsafe { ggml_quantize_chunk(ty, values.as_ptr(), out.as_mut_ptr().cast(), 0, i(rows), i(n), std::ptr::null()) };
    out
}

#[test]
fn other_types_one_row_is_ggmls_own_vec_dot_to_the_bit_in_every_share() {
    ggml_ready();
    let mut rng = Rng(0x6a09_e667_f3bc_c908);
    let types = [
        GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_1,
        GGML_TYPE_Q2_K,
        GGML_TYPE_Q3_K,
        GGML_TYPE_Q4_K,
        GGML_TYPE_Q5_K,
        GGML_TYPE_Q6_K,
        GGML_TYPE_IQ4_XS,
    ];
    for ty in types {
        // SAFETY: ggml's static table and type sizes.
        let (traits, values) = unsafe { (&*traits_of(ty), usize::try_from(ggml_blck_size(ty)).expect("a size")) };
        let theirs = ggml_kernel(ty);
        for (m, k) in [(1, 1), (2, 3), (7, 2), (9, 6)] {
            // Padding between weight rows, as ggml's views may have.
            let lda = k + 2;
            let a = ggml_rows(&mut rng, ty, m, lda * values);
            let row = a.len() / m;
            let x: Vec<f32> = (0..k * values).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
            // SAFETY: a size for every type.
            let mut y = vec![0u8; unsafe { ggml_row_size(traits.vec_dot_type, (k * values) as i64) }];
            // SAFETY: `y` has room for the row in ggml's activation type for `ty`.
            unsafe { traits.from_float.expect("a quantizer")(x.as_ptr(), y.as_mut_ptr().cast(), (k * values) as i64) };
            for level in levels() {
                let mut c = vec![f32::NAN; m + 3];
                let i = |v: usize| i64::try_from(v).expect("small");
                let product = |b_type: u32, n: usize, c: &mut Vec<f32>| Product {
                    m: i(m),
                    n: i(n),
                    k: i(k),
                    a: a.as_ptr().cast(),
                    lda: i(lda),
                    b: y.as_ptr().cast(),
                    ldb: i(k),
                    c: c.as_mut_ptr().cast(),
                    ldc: i(m + 3),
                    a_type: ty as c_int,
                    b_type: b_type as c_int,
                    c_type: GGML_TYPE_F32 as c_int,
                };
                let at = format!("{level:?} type {ty} m={m} k={k}");
                for ith in 0..3 {
                    // SAFETY: the matrices hold what the sizes say.
                    let done = unsafe {
                        multiply(Some(level), &ComputeParams { ith, nth: 3 }, product(traits.vec_dot_type, 1, &mut c))
                    };
                    assert!(done || level.serves_k_quant(ty), "{at}");
                }
                if level.serves_k_quant(ty) {
                    continue; // Gantry's own kernels (k_quant_tests).
                }
                for (r, got) in c.iter().enumerate() {
                    if r >= m {
                        assert!(got.is_nan(), "{at}: wrote past the rows");
                        continue;
                    }
                    let mut want = f32::NAN;
                    // SAFETY: row `r` and `y` hold `k * values` values of their types.
                    unsafe {
                        theirs(
                            i32::try_from(k * values).expect("small"),
                            &mut want,
                            0,
                            a[r * row..].as_ptr().cast(),
                            0,
                            y.as_ptr().cast(),
                            0,
                            1,
                        )
                    };
                    assert_eq!(got.to_bits(), want.to_bits(), "{at} row {r}: {got} against ggml's {want}");
                }
                // Activations of another type (ggml's first call, with its floats), and no level
                // enabled: not taken here, and llamafile has no kernel for these either.
                let mut untouched = vec![f32::NAN; m + 3];
                for (level, b_type) in [(Some(level), GGML_TYPE_F32), (None, traits.vec_dot_type)] {
                    // SAFETY: as above; llamafile reads only the thread index and count.
                    let done = unsafe {
                        multiply(level, &ComputeParams { ith: 0, nth: 1 }, product(b_type, 1, &mut untouched))
                    };
                    assert!(!done, "{at}: {level:?} with activations of type {b_type}");
                }
                assert!(untouched.iter().all(|v| v.is_nan()), "{at}");
            }
        }
    }
}
