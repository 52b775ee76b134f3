//! What every 16-row layout (`q4_k_rows16`, `q5_k_rows16`, `q6_k_rows16`, `iq4_xs_rows16`) shares:
//! the loops of its `gemm` over groups and columns, and the loop that repacks a matrix into it.

/// The loops of a 16-row layout's `gemm`: for each group in `$groups`, the `$n` columns eight at a
/// time (the last one to seven alone); `$tile!(C, group, j)` gives the group's 16 rows against
/// columns `j..j + C` as `[__m512; C]`, stored at `$c[(j + q) * $ldc + 16 * group]`. Each weight
/// register is unpacked once for all `C` columns: eight rather than four took 12–20% less time a
/// block and column at 8–512 columns (Sapphire Rapids, weights in L2, `q5_k_rows16_bench` and
/// `q6_k_rows16_bench`), and the three accumulators a column leave room in 32 registers.
macro_rules! each_group {
    ($groups:expr, $n:expr, $c:expr, $ldc:expr, $tile:ident) => {{
        let (n, c, ldc): (usize, *mut f32, usize) = ($n, $c, $ldc);
        macro_rules! store {
            ($C:literal, $group:expr, $j:expr) => {{
                let (group, j) = ($group, $j);
                let out: [__m512; $C] = $tile!($C, group, j);
                for (q, v) in out.into_iter().enumerate() {
                    unsafe { _mm512_storeu_ps(c.add((j + q) * ldc + 16 * group), v) };
                }
            }};
        }
        for group in $groups {
            let mut j = 0;
            while j < n {
                match n - j {
                    1 => store!(1, group, j),
                    2 => store!(2, group, j),
                    3 => store!(3, group, j),
                    4 => store!(4, group, j),
                    5 => store!(5, group, j),
                    6 => store!(6, group, j),
                    7 => store!(7, group, j),
                    _ => store!(8, group, j),
                }
                j += 8;
            }
        }
    }};
}

/// Every group of `out` (16 rows of `k` blocks of `a`, `lda` apart, in a 16-row layout): each
/// group's block starts as `empty()` and takes its rows one by one from `put`. Panics unless `out`
/// holds whole groups and `a` every row of them.
pub(super) fn repack_each<B, G>(
    a: &[B],
    k: usize,
    lda: usize,
    out: &mut [std::mem::MaybeUninit<G>],
    empty: impl Fn() -> G,
    put: impl Fn(&mut G, usize, &B),
) {
    let rows = out.len().checked_div(k).unwrap_or(0) * 16;
    assert!(
        (k == 0 || out.len().is_multiple_of(k)) && (rows == 0 || a.len() >= (rows - 1) * lda + k),
        "{rows} rows of {k} blocks, {lda} apart"
    );
    for group in 0..rows / 16 {
        for b in 0..k {
            let mut g = empty();
            for r in 0..16 {
                put(&mut g, r, &a[(16 * group + r) * lda + b]);
            }
            out[group * k + b].write(g);
        }
    }
}

/// `rows` rows of `k` blocks (`lda` apart) of `a` in a 16-row layout, as a new `Vec` of the
/// groups `repack_into` (one of the `_into` repackers) writes. Panics unless `rows` is a multiple
/// of 16.
pub(super) fn repacked_rows16<B, G>(
    a: &[B],
    rows: usize,
    k: usize,
    lda: usize,
    repack_into: fn(&[B], usize, usize, &mut [std::mem::MaybeUninit<G>]),
) -> Vec<G> {
    assert!(rows.is_multiple_of(16), "{rows} rows are not whole groups of 16");
    let len = rows / 16 * k;
    let mut out = Vec::with_capacity(len);
    repack_into(a, k, lda, &mut out.spare_capacity_mut()[..len]);
    // SAFETY: the `_into` repackers write every group of the buffer they are given.
    unsafe { out.set_len(len) };
    out
}
