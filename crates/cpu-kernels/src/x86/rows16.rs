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

/// The loops of a 16-row layout's `gemm` on 256-bit registers (`rows16_avx2`, `rows16_avxvnni`): for each group in `$groups`, the `$n` columns four
/// at a time (the last one to three alone) and each group's two halves; `$half!(C, group, h, j)`
/// gives rows `8h..8h + 8` of the group against columns `j..j + C` as `[__m256; C]`, stored at
/// `$c[(j + q) * $ldc + 16 * group + 8 * h]`. Four columns: three accumulators a column and the
/// unpacked registers fit AVX2's 16.
macro_rules! each_half_group {
    ($groups:expr, $n:expr, $c:expr, $ldc:expr, $half:ident) => {{
        let (n, c, ldc): (usize, *mut f32, usize) = ($n, $c, $ldc);
        macro_rules! store {
            ($C:literal, $group:expr, $j:expr) => {{
                let (group, j) = ($group, $j);
                for h in 0..2 {
                    let out: [__m256; $C] = $half!($C, group, h, j);
                    for (q, v) in out.into_iter().enumerate() {
                        unsafe { _mm256_storeu_ps(c.add((j + q) * ldc + 16 * group + 8 * h), v) };
                    }
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
                    _ => store!(4, group, j),
                }
                j += 4;
            }
        }
    }};
}

/// The public `gemm`s of the four 16-row layouts for a level on 256-bit registers
/// (`rows16_avx2`, `rows16_avxvnni`): each the level's `$nibble_half`, `$q6_k_half` or
/// `$iq4_xs_half` (rows `8h..8h + 8` of a group against `C` columns) over every group, half and
/// column ([`each_half_group!`]); `$features` are the level's, `$level` its name in the docs.
macro_rules! half_gemms {
    ($features:literal, $level:literal, $nibble_half:ident, $q6_k_half:ident, $iq4_xs_half:ident) => {
        #[doc = concat!($level, "'s [`v4::gemm_q4_k_rows16`](super::v4::gemm_q4_k_rows16): the product of the")]
        /// repacked groups `groups` of `a` with `n` columns of Q8_K activations `b` (`ldb` blocks
        /// apart), `c[j * ldc + 16g + r]` row `r` of group `g` times column `j`.
        ///
        /// # Safety
        /// `a` holds every group in `groups`, `b` `n` columns of `k` blocks; `c` has room for every
        /// `j * ldc + 16g + r`; and this CPU has the level's features.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn gemm_q4_k_rows16(
            groups: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const NibbleRows16<0>,
            b: *const BlockQ8K,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            unsafe { gemm_nibble_rows16(groups, n, k, a, b, ldb, c, ldc) }
        }

        #[doc = concat!($level, "'s [`v4::gemm_q5_k_rows16`](super::v4::gemm_q5_k_rows16), as [`gemm_q4_k_rows16`].")]
        ///
        /// # Safety
        /// As [`gemm_q4_k_rows16`]'s.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn gemm_q5_k_rows16(
            groups: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const NibbleRows16<8>,
            b: *const BlockQ8K,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            unsafe { gemm_nibble_rows16(groups, n, k, a, b, ldb, c, ldc) }
        }

        /// [`gemm_q4_k_rows16`] for either nibble layout.
        ///
        /// # Safety
        /// As [`gemm_q4_k_rows16`]'s.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        unsafe fn gemm_nibble_rows16<const FIFTH: usize>(
            groups: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const NibbleRows16<FIFTH>,
            b: *const BlockQ8K,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            let sums: Vec<[i32; 4]> =
                (0..n * k).map(|i| sub_block_sums(unsafe { &*b.add((i / k) * ldb + i % k) })).collect();
            macro_rules! run {
                ($C:literal, $group:expr, $h:expr, $j:expr) => {{
                    let (group, j) = ($group, $j);
                    let columns = std::array::from_fn(|q| unsafe { b.add((j + q) * ldb) });
                    let column_sums = std::array::from_fn(|q| unsafe { sums.as_ptr().add((j + q) * k) });
                    unsafe { $nibble_half::<$C, FIFTH>(k, a.add(group * k), $h, columns, column_sums) }
                }};
            }
            each_half_group!(groups, n, c, ldc, run);
        }

        #[doc = concat!($level, "'s [`v4::gemm_q6_k_rows16`](super::v4::gemm_q6_k_rows16), as [`gemm_q4_k_rows16`].")]
        ///
        /// # Safety
        /// As [`gemm_q4_k_rows16`]'s.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn gemm_q6_k_rows16(
            groups: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const Q6KRows16,
            b: *const BlockQ8K,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            macro_rules! run {
                ($C:literal, $group:expr, $h:expr, $j:expr) => {{
                    let (group, j) = ($group, $j);
                    let columns = std::array::from_fn(|q| unsafe { b.add((j + q) * ldb) });
                    unsafe { $q6_k_half::<$C>(k, a.add(group * k), $h, columns) }
                }};
            }
            each_half_group!(groups, n, c, ldc, run);
        }

        #[doc = concat!($level, "'s [`v4::gemm_iq4_xs_rows16`](super::v4::gemm_iq4_xs_rows16), as [`gemm_q4_k_rows16`].")]
        ///
        /// # Safety
        /// As [`gemm_q4_k_rows16`]'s.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "llamafile_sgemm's own parameters")]
        pub unsafe fn gemm_iq4_xs_rows16(
            groups: std::ops::Range<usize>,
            n: usize,
            k: usize,
            a: *const IQ4XSRows16,
            b: *const BlockQ8K,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
        ) {
            macro_rules! run {
                ($C:literal, $group:expr, $h:expr, $j:expr) => {{
                    let (group, j) = ($group, $j);
                    let columns = std::array::from_fn(|q| unsafe { b.add((j + q) * ldb) });
                    unsafe { $iq4_xs_half::<$C>(k, a.add(group * k), $h, columns) }
                }};
            }
            each_half_group!(groups, n, c, ldc, run);
        }
    };
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
