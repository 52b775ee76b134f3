//! Products served from the 16-row K-quant copies against ggml's own `· Q8_K` kernels row by row,
//! with both levels' kernels (AVX-512 and AVX2, on these machines that have both),
//! for 1 to 512 activation rows (a decoding stream to a prompt's ubatch) in every thread share,
//! on weights ggml quantized and on a pulled model's rows; an activation row gives the same bits
//! alone as beside others; copies that no longer match the weights at their
//! address are made anew.

use llama_cpp_sys_2::{
    ggml_type, ggml_type_size, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0,
};

use super::install::Level;
use super::k_quant_copies;
use super::k_quant_tests::{
    check_against_ggml, k_quant_product, pulled_rows, q8_k_row, weight_rows, Q8_K_BYTES, TYPES,
};
use super::tests::{ggml_ready, levels, Rng};
use gantry_cpu_kernels::x86::{IQ4XSRows16, Q4KRows16, Q5KRows16, Q6KRows16, QK_K};

/// The types that have 16-row copies.
pub(super) const COPIED: [ggml_type; 4] = [GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS];

/// `m` rows of `k` blocks (`lda` apart) of `ty` times `n` Q8_K rows, as three threads compute it
/// from the copies with `level`'s kernels, or `None` where they declined; `C`'s entries past the
/// rows stay NaN.
fn from_copies(
    level: Level,
    ty: ggml_type,
    a: &[u8],
    (m, k, lda): (usize, usize, usize),
    b: &[u8],
    n: usize,
) -> Option<Vec<f32>> {
    let mut c = vec![f32::NAN; n * (m + 3)];
    let product = k_quant_product(ty, a, (m, k, lda), b, n, &mut c);
    let nth = 3;
    // SAFETY: the matrices hold what the sizes say; this CPU has AVX-512 (checked by the callers).
    let done: Vec<bool> = (0..nth).map(|ith| unsafe { k_quant_copies::multiply(level, &product, ith, nth) }).collect();
    assert!(done.iter().all(|d| *d == done[0]), "threads disagree: {done:?}");
    done[0].then_some(c)
}

fn activations(rng: &mut Rng, n: usize, ldb: usize) -> Vec<u8> {
    (0..n).flat_map(|_| q8_k_row(rng, ldb * QK_K)).collect()
}

#[test]
fn a_few_rows_from_the_copies_agree_with_ggml_row_by_row() {
    ggml_ready();
    k_quant_copies::serve(true);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for level in levels() {
        for ty in COPIED {
            let bytes = TYPES.iter().find(|t| t.0 == ty).expect("a K-quant").1;
            for (m, k) in [(16, 1), (32, 6), (48, 3)] {
                // Padding between rows, as ggml's views may have.
                let lda = k + 2;
                let a = weight_rows(&mut rng, (ty, bytes), m, lda * QK_K);
                for n in [1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 34, 97, 512] {
                    let b = activations(&mut rng, n, k + 1);
                    let c = from_copies(level, ty, &a, (m, k, lda), &b, n).expect("served from the copies");
                    check_against_ggml(ty, &a, (m, k, lda), &b, n, &c);
                }
            }
        }
        // A pulled model's own rows (a Q4_K gate projection, a Q6_K down projection), 16 of each.
        for (ty, a, values) in pulled_rows(16) {
            let k = values / QK_K;
            for n in [1, 2, 4, 8, 100] {
                let b = activations(&mut rng, n, k);
                let c = from_copies(level, ty, &a, (16, k, k), &b, n).expect("served from the copies");
                check_against_ggml(ty, &a, (16, k, k), &b, n, &c);
            }
        }
    }
}

#[test]
fn an_activation_row_gives_the_same_bits_alone_as_beside_others() {
    ggml_ready();
    k_quant_copies::serve(true);
    let mut rng = Rng(23);
    let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for level in levels() {
        for ty in COPIED {
            let bytes = TYPES.iter().find(|t| t.0 == ty).expect("a K-quant").1;
            let (m, k) = (48, 6);
            let a = weight_rows(&mut rng, (ty, bytes), m, k * QK_K);
            // Eleven rows: tiles of eight and three (AVX-512) or four, four and three (AVX2); a
            // row alone is a decoding stream's step.
            let b = activations(&mut rng, 11, k);
            let beside = from_copies(level, ty, &a, (m, k, k), &b, 11).expect("served");
            for row in [0, 4, 7, 8, 10] {
                let one = &b[row * k * Q8_K_BYTES..(row + 1) * k * Q8_K_BYTES];
                let alone = from_copies(level, ty, &a, (m, k, k), one, 1).expect("served");
                let at = row * (m + 3);
                assert_eq!(bits(&alone[..m]), bits(&beside[at..at + m]), "{level:?} type {ty}, row {row}");
            }
        }
    }
}

#[test]
fn many_rows_odd_rows_and_other_types_are_not_served_from_copies() {
    ggml_ready();
    k_quant_copies::serve(true);
    let mut rng = Rng(11);
    for level in levels() {
        for (ty, bytes) in TYPES {
            let copied = COPIED.contains(&ty);
            for (m, n) in [(16, 1), (16, 513), (17, 4), (24, 4), (16, 4), (17, 1)] {
                let a = weight_rows(&mut rng, (ty, bytes), m, QK_K);
                let b = activations(&mut rng, n, 1);
                let served = from_copies(level, ty, &a, (m, 1, 1), &b, n).is_some();
                assert_eq!(served, copied && m == 16 && n <= 4, "{level:?} type {ty} m={m} n={n}");
            }
        }
    }
}

#[test]
fn a_copy_whose_address_now_holds_other_weights_is_made_anew() {
    ggml_ready();
    k_quant_copies::serve(true);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let level = levels()[0];
    let (ty, bytes) = TYPES[0];
    let (m, k, n) = (32, 4, 3);
    let mut a = weight_rows(&mut rng, (ty, bytes), m, k * QK_K);
    let b = activations(&mut rng, n, k);
    let first = from_copies(level, ty, &a, (m, k, k), &b, n).expect("served");
    check_against_ggml(ty, &a, (m, k, k), &b, n, &first);
    // Other weights in the same buffer, as a model loaded where a freed one was.
    let other = weight_rows(&mut rng, (ty, bytes), m, k * QK_K);
    a.copy_from_slice(&other);
    let second = from_copies(level, ty, &a, (m, k, k), &b, n).expect("served");
    check_against_ggml(ty, &a, (m, k, k), &b, n, &second);
    assert_ne!(first[..m], second[..m], "the products of other weights differ");
    // Forgotten, the copy is made again and gives the same.
    k_quant_copies::forget_all();
    let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&from_copies(level, ty, &a, (m, k, k), &b, n).expect("served")), bits(&second));
}

#[test]
fn the_bytes_counted_for_a_copy_are_the_files_block_and_the_layouts_row() {
    let row = |group_bytes: usize| group_bytes / 16;
    for (ty, layout) in [
        (GGML_TYPE_Q4_K, row(std::mem::size_of::<Q4KRows16>())),
        (GGML_TYPE_Q5_K, row(std::mem::size_of::<Q5KRows16>())),
        (GGML_TYPE_Q6_K, row(std::mem::size_of::<Q6KRows16>())),
        (GGML_TYPE_IQ4_XS, row(std::mem::size_of::<IQ4XSRows16>())),
    ] {
        // SAFETY: a plain lookup in ggml's type table.
        let file = unsafe { ggml_type_size(ty) };
        assert_eq!(k_quant_copies::block_bytes(ty), Some((file, layout)), "type {ty}");
    }
    assert_eq!(k_quant_copies::block_bytes(GGML_TYPE_Q8_0), None, "Q8_0 has no copies");
}
