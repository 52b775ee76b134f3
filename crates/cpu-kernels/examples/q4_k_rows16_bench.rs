//! A candidate layout for Q4_K weights, timed against today's kernel on the same data: 16 weight
//! rows repacked so that each 32-bit lane of a register holds four values of its own row. One
//! `vpdpbusd` with four activations broadcast then adds four products to each of 16 rows, the
//! sub-block scales multiply 16 rows' sums at once, and the float work of a block is one
//! conversion and two multiply-adds for 16 rows, where `k_quants::gemm` pays them for every row
//! (its float work is about a third of its time at 4 activation rows). Nothing serves this layout
//! yet: the weights would have to be repacked at load. `cargo run --release -p gantry-cpu-kernels
//! --example q4_k_rows16_bench`: with weights in L2 as `kq_gemm_bench` has them, nanoseconds per
//! weight block and activation row, and the largest difference from `gemm_q4_k`'s results; then
//! one activation row against 384 MiB of weights on one thread, in GB/s of each layout's bytes.
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
    use std::arch::x86_64::*;
    use std::time::Instant;

    use gantry_cpu_kernels::x86::{v4, BlockQ4K, BlockQ8K};

    use crate::common::{best, q8_k_activations, Rng};

    /// Sub-block `j`'s six-bit scale and min, as ggml's `get_scale_min_k4` reads them.
    fn scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
        }
    }

    /// Value `i` of a block, before scaling (0-15).
    fn value(b: &BlockQ4K, i: usize) -> u8 {
        let (chunk, l) = (i / 64, i % 64);
        let byte = b.qs[32 * chunk + l % 32];
        if l < 32 {
            byte & 0xf
        } else {
            byte >> 4
        }
    }

    /// One block of 16 rows: `nibbles[s][i]` holds, in bytes `4r..4r + 4`, row `r`'s values
    /// `32s + 4i + j` (low nibbles) and `32s + 16 + 4i + j` (high nibbles); `scales[s][r]`;
    /// `mins[p]` row `r`'s mins of sub-blocks `2p` and `2p + 1` in bytes `2r`, `2r + 1`; both f16
    /// scales of each row. 148 bytes a row where Q4_K has 144.
    #[repr(C, align(64))]
    struct Rows16 {
        nibbles: [[[u8; 64]; 4]; 8],
        scales: [[u8; 16]; 8],
        mins: [[u8; 32]; 4],
        d: [u16; 16],
        dmin: [u16; 16],
    }

    fn repack(x: &[BlockQ4K], k: usize, group: usize) -> Vec<Rows16> {
        (0..k)
            .map(|b| {
                let mut g = Rows16 {
                    nibbles: [[[0; 64]; 4]; 8],
                    scales: [[0; 16]; 8],
                    mins: [[0; 32]; 4],
                    d: [0; 16],
                    dmin: [0; 16],
                };
                for r in 0..16 {
                    let block = &x[(16 * group + r) * k + b];
                    (g.d[r], g.dmin[r]) = (block.d, block.dmin);
                    let packed = block.scales;
                    for s in 0..8 {
                        (g.scales[s][r], g.mins[s / 2][2 * r + s % 2]) = scale_min(s, &packed);
                        for i in 0..4 {
                            for j in 0..4 {
                                let (lo, hi) =
                                    (value(block, 32 * s + 4 * i + j), value(block, 32 * s + 16 + 4 * i + j));
                                g.nibbles[s][i][4 * r + j] = lo | (hi << 4);
                            }
                        }
                    }
                }
                g
            })
            .collect()
    }

    /// Each Q8_K block's sums of 32 activations, sub-blocks `2p` and `2p + 1` as the two 16-bit
    /// halves of word `p`.
    fn sub_block_sums(y: &[BlockQ8K]) -> Vec<[i32; 4]> {
        y.iter()
            .map(|b| {
                let sum = |s: usize| u32::from((b.bsums[2 * s] + b.bsums[2 * s + 1]) as u16);
                std::array::from_fn(|p| (sum(2 * p) | (sum(2 * p + 1) << 16)) as i32)
            })
            .collect()
    }

    /// 16 rows (`k` blocks of `g`) times `C` activation rows: lane `r` of result `c` is row `r`'s
    /// product with column `c`.
    ///
    /// # Safety
    /// `g`, every `y[c]` and every `sums[c]` hold `k` blocks, and this CPU has AVX-512 VNNI.
    #[allow(
        clippy::undocumented_unsafe_blocks,
        clippy::needless_range_loop,
        reason = "every block reads the caller's blocks; columns index fixed arrays"
    )]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const C: usize>(
        k: usize,
        g: *const Rows16,
        y: [*const BlockQ8K; C],
        sums: [*const [i32; 4]; C],
    ) -> [__m512; C] {
        let low4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..k {
            let w = unsafe { &*g.add(b) };
            let qs: [*const u8; C] = std::array::from_fn(|c| unsafe { (*y[c].add(b)).qs.as_ptr().cast::<u8>() });
            let broadcast =
                |c: usize, at: usize| _mm512_set1_epi32(unsafe { qs[c].add(at).cast::<i32>().read_unaligned() });
            let mut block = [_mm512_setzero_si512(); C];
            for s in 0..8 {
                let mut sub = [_mm512_setzero_si512(); C];
                for i in 0..4 {
                    let v = unsafe { _mm512_load_si512(w.nibbles[s][i].as_ptr().cast()) };
                    let (lo, hi) = (_mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4));
                    for c in 0..C {
                        sub[c] = _mm512_dpbusd_epi32(sub[c], lo, broadcast(c, 32 * s + 4 * i));
                        sub[c] = _mm512_dpbusd_epi32(sub[c], hi, broadcast(c, 32 * s + 16 + 4 * i));
                    }
                }
                let scale = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(w.scales[s].as_ptr().cast()) });
                for c in 0..C {
                    block[c] = _mm512_add_epi32(block[c], _mm512_mullo_epi32(sub[c], scale));
                }
            }
            let mut mins = [_mm512_setzero_si512(); C];
            for p in 0..4 {
                let m = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(w.mins[p].as_ptr().cast()) });
                for c in 0..C {
                    mins[c] = _mm512_dpwssd_epi32(mins[c], m, _mm512_set1_epi32(unsafe { (*sums[c].add(b))[p] }));
                }
            }
            let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.d.as_ptr().cast()) });
            let dmin = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.dmin.as_ptr().cast()) });
            for c in 0..C {
                let dy = _mm512_set1_ps(unsafe { (*y[c].add(b)).d });
                acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(block[c]), acc[c]);
                acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(mins[c]), acc[c]);
            }
        }
        acc
    }

    /// `c[j * rows + i]` for every repacked group and activation row, as `gemm_q4_k` writes it.
    ///
    /// # Safety
    /// As [`tile`]'s, for `groups` groups and `n` columns; `c` holds `n · 16 · groups` values.
    #[allow(clippy::undocumented_unsafe_blocks, reason = "every block stays within the caller's sizes")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn gemm(groups: usize, k: usize, g: &[Rows16], y: &[BlockQ8K], sums: &[[i32; 4]], n: usize, c: &mut [f32]) {
        let rows = 16 * groups;
        macro_rules! run {
            ($C:literal, $j:expr, $group:expr) => {{
                let (j, group) = ($j, $group);
                let columns = std::array::from_fn(|q| unsafe { y.as_ptr().add((j + q) * k) });
                let column_sums = std::array::from_fn(|q| unsafe { sums.as_ptr().add((j + q) * k) });
                let out = unsafe { tile::<$C>(k, g.as_ptr().add(group * k), columns, column_sums) };
                for (q, v) in out.into_iter().enumerate() {
                    unsafe { _mm512_storeu_ps(c.as_mut_ptr().add((j + q) * rows + 16 * group), v) };
                }
            }};
        }
        for group in 0..groups {
            let mut j = 0;
            while j < n {
                match n - j {
                    1 => run!(1, j, group),
                    2 => run!(2, j, group),
                    3 => run!(3, j, group),
                    _ => run!(4, j, group),
                }
                j += 4;
            }
        }
    }

    pub(crate) fn run() {
        assert!(is_x86_feature_detected!("avx512vnni"), "needs AVX-512 VNNI");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // 128 rows of 1536 values (qwen2.5-coder-1.5b's row).
        let (rows, k) = (128usize, 6usize);
        let x: Vec<BlockQ4K> = (0..rows * k)
            .map(|_| BlockQ4K {
                d: rng.scale(),
                dmin: rng.scale(),
                scales: std::array::from_fn(|_| rng.byte()),
                qs: std::array::from_fn(|_| rng.byte()),
            })
            .collect();
        let groups = rows / 16;
        let repacked: Vec<Rows16> = (0..groups).flat_map(|group| repack(&x, k, group)).collect();
        in_l2(&mut rng, &x, &repacked, rows, k);
        streamed(&mut rng);
    }

    /// One activation row against 384 MiB of weights (gate/up shaped: rows of 1536 values), one
    /// pass each, best of 3: GB/s of each layout's own bytes.
    fn streamed(rng: &mut Rng) {
        let k = 6usize;
        let rows = (384usize << 20) / (k * std::mem::size_of::<BlockQ4K>()) / 16 * 16;
        let x: Vec<BlockQ4K> = (0..rows * k)
            .map(|_| BlockQ4K { d: 0x3c00, dmin: 0x3c00, scales: [0x3b; 12], qs: std::array::from_fn(|_| rng.byte()) })
            .collect();
        let groups = rows / 16;
        let repacked: Vec<Rows16> = (0..groups).flat_map(|group| repack(&x, k, group)).collect();
        let y = q8_k_activations(rng, k);
        let sums = sub_block_sums(&y);
        let mut out = vec![0f32; rows];
        let time = |f: &mut dyn FnMut()| {
            (0..3)
                .map(|_| {
                    let start = Instant::now();
                    f();
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        // SAFETY: `x` holds `rows` rows of `k` blocks, `y` one; AVX-512 VNNI was checked.
        let today =
            time(&mut || unsafe { v4::gemm_q4_k(0..rows, 1, k, x.as_ptr(), k, y.as_ptr(), k, out.as_mut_ptr(), rows) });
        // SAFETY: as above, for the repacked groups.
        let candidate = time(&mut || unsafe { gemm(groups, k, &repacked, &y, &sums, 1, &mut out) });
        let gb = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
        println!(
            "1 row streamed, 1 thread: gemm_q4_k {:.1} GB/s ({:.1} ms), 16-row layout {:.1} GB/s ({:.1} ms)",
            gb(std::mem::size_of_val(x.as_slice()), today),
            today * 1e3,
            gb(std::mem::size_of_val(repacked.as_slice()), candidate),
            candidate * 1e3
        );
    }

    fn in_l2(rng: &mut Rng, x: &[BlockQ4K], repacked: &[Rows16], rows: usize, k: usize) {
        let groups = rows / 16;
        for n in [1usize, 2, 4, 8] {
            let y = q8_k_activations(rng, n * k);
            let sums = sub_block_sums(&y);
            let (mut today, mut candidate) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            // SAFETY: `x` holds `rows` rows and `y` `n` columns of `k` blocks; the outputs hold
            // `rows · n` values; AVX-512 VNNI was checked above.
            let mut today_run =
                || unsafe { v4::gemm_q4_k(0..rows, n, k, x.as_ptr(), k, y.as_ptr(), k, today.as_mut_ptr(), rows) };
            let today_s = best(&mut today_run);
            // SAFETY: as above, for the repacked groups.
            let mut candidate_run = || unsafe { gemm(groups, k, repacked, &y, &sums, n, &mut candidate) };
            let candidate_s = best(&mut candidate_run);
            today_run();
            candidate_run();
            let largest = today.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = today.iter().zip(&candidate).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let per = |s: f64| s * 1e9 / (2000 * rows * k * n) as f64;
            println!(
                "{n} rows: gemm_q4_k {:.2} ns, 16-row layout {:.2} ns per block and activation row; largest difference {:.1e} of the largest value",
                per(today_s),
                per(candidate_s),
                diff / largest
            );
        }
    }
}
