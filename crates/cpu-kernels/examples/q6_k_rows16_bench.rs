//! `q4_k_rows16_bench`'s layout for Q6_K weights (a third of the bytes of a Q4_K_M model), timed
//! against today's kernel on the same data: 16 rows to a register, four values of a row in each
//! 32-bit lane, their low four bits as nibbles and their top two bits in a register of their own,
//! 210 bytes a row as in Q6_K. The `+ 32` of the unsigned values comes off through the
//! activations' block sums times the scales, for 16 rows at once. `cargo run --release -p
//! gantry-cpu-kernels --example q6_k_rows16_bench`: weights in L2, nanoseconds per weight block and
//! activation row, and the largest difference from `gemm_q6_k`'s results.
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

    use gantry_cpu_kernels::x86::{v4, BlockQ6K, BlockQ8K};

    use crate::common::{best, masked_blocks, q8_k_activations, Rng};

    /// Value `i` of a block as an unsigned six-bit number (`q + 32`), as ggml's
    /// `dequantize_row_q6_K` reads its bits.
    fn value(b: &BlockQ6K, i: usize) -> u8 {
        let (half, l) = (i / 128, i % 128);
        let (ql, qh) = (&b.ql[64 * half..], &b.qh[32 * half..]);
        let (g, l) = (l / 32, l % 32);
        let low = match g {
            0 => ql[l] & 0xf,
            1 => ql[l + 32] & 0xf,
            2 => ql[l] >> 4,
            _ => ql[l + 32] >> 4,
        };
        low | (((qh[l] >> (2 * g)) & 3) << 4)
    }

    /// One block of 16 rows, sub-block `s` being values `16s..16s + 16` (one scale): in bytes
    /// `4r..4r + 4` of `nibbles[s][i]`, row `r`'s values `16s + 4i + j` (low nibbles) and
    /// `16s + 8 + 4i + j` (high); of `high[s]`, byte `j` holds the top two bits of values
    /// `16s + 4q + j` at bits `2q`; `scales[p]` the scales of sub-blocks `2p`, `2p + 1` as 16-bit
    /// pairs, row after row; `d` each row's f16 scale.
    #[repr(C, align(64))]
    struct Rows16 {
        nibbles: [[[u8; 64]; 2]; 16],
        high: [[u8; 64]; 16],
        scales: [[i16; 32]; 8],
        d: [u16; 16],
    }

    fn repack(x: &[BlockQ6K], k: usize, group: usize) -> Vec<Rows16> {
        (0..k)
            .map(|b| {
                let mut g =
                    Rows16 { nibbles: [[[0; 64]; 2]; 16], high: [[0; 64]; 16], scales: [[0; 32]; 8], d: [0; 16] };
                for r in 0..16 {
                    let block = &x[(16 * group + r) * k + b];
                    g.d[r] = block.d;
                    for s in 0..16 {
                        g.scales[s / 2][2 * r + s % 2] = i16::from(block.scales[s]);
                        for j in 0..4 {
                            let v = |q: usize| value(block, 16 * s + 4 * q + j);
                            for i in 0..2 {
                                g.nibbles[s][i][4 * r + j] = (v(i) & 0xf) | ((v(2 + i) & 0xf) << 4);
                            }
                            g.high[s][4 * r + j] = (0..4).map(|q| (v(q) >> 4) << (2 * q)).sum();
                        }
                    }
                }
                g
            })
            .collect()
    }

    /// 16 rows (`k` blocks of `g`) times `C` activation rows: lane `r` of result `c` is row `r`'s
    /// product with column `c`.
    ///
    /// # Safety
    /// `g` and every `y[c]` hold `k` blocks, and this CPU has AVX-512 VNNI.
    #[allow(
        clippy::undocumented_unsafe_blocks,
        clippy::needless_range_loop,
        reason = "every block reads the caller's blocks; columns index fixed arrays"
    )]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const C: usize>(k: usize, g: *const Rows16, y: [*const BlockQ8K; C]) -> [__m512; C] {
        let (low4, bits45) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..k {
            let w = unsafe { &*g.add(b) };
            let yb: [*const BlockQ8K; C] = std::array::from_fn(|c| unsafe { y[c].add(b) });
            let broadcast = |c: usize, at: usize| {
                _mm512_set1_epi32(unsafe { (*yb[c]).qs.as_ptr().add(at).cast::<i32>().read_unaligned() })
            };
            let mut block = [_mm512_setzero_si512(); C];
            for s in 0..16 {
                let (v0, v1, h) = unsafe {
                    (
                        _mm512_load_si512(w.nibbles[s][0].as_ptr().cast()),
                        _mm512_load_si512(w.nibbles[s][1].as_ptr().cast()),
                        _mm512_load_si512(w.high[s].as_ptr().cast()),
                    )
                };
                // Quads 0-3 of the sub-block; 16-bit shifts are exact here, what crosses from the
                // next byte lands outside the bits kept.
                let quads = [
                    _mm512_or_si512(_mm512_and_si512(v0, low4), _mm512_and_si512(_mm512_slli_epi16::<4>(h), bits45)),
                    _mm512_or_si512(_mm512_and_si512(v1, low4), _mm512_and_si512(_mm512_slli_epi16::<2>(h), bits45)),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(v0), low4), _mm512_and_si512(h, bits45)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(v1), low4),
                        _mm512_and_si512(_mm512_srli_epi16::<2>(h), bits45),
                    ),
                ];
                // Each 32-bit lane holds a row's scales of sub-blocks 2p and 2p + 1: this one's,
                // sign-extended.
                let pair = unsafe { _mm512_load_si512(w.scales[s / 2].as_ptr().cast()) };
                let scale = if s % 2 == 0 {
                    _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair))
                } else {
                    _mm512_srai_epi32::<16>(pair)
                };
                for c in 0..C {
                    let mut sub = _mm512_setzero_si512();
                    for (q, quad) in quads.iter().enumerate() {
                        sub = _mm512_dpbusd_epi32(sub, *quad, broadcast(c, 16 * s + 4 * q));
                    }
                    block[c] = _mm512_add_epi32(block[c], _mm512_mullo_epi32(sub, scale));
                }
            }
            let mut offset = [_mm512_setzero_si512(); C];
            for p in 0..8 {
                let pair = unsafe { _mm512_load_si512(w.scales[p].as_ptr().cast()) };
                for c in 0..C {
                    let sums = unsafe { (*yb[c]).bsums.as_ptr().add(2 * p).cast::<i32>().read_unaligned() };
                    offset[c] = _mm512_dpwssd_epi32(offset[c], pair, _mm512_set1_epi32(sums));
                }
            }
            let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(w.d.as_ptr().cast()) });
            for c in 0..C {
                let dy = _mm512_set1_ps(unsafe { (*yb[c]).d });
                let sums = _mm512_sub_epi32(block[c], _mm512_slli_epi32::<5>(offset[c]));
                acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(sums), acc[c]);
            }
        }
        acc
    }

    /// `c[j * rows + i]` for every repacked group and activation row, as `gemm_q6_k` writes it.
    ///
    /// # Safety
    /// As [`tile`]'s, for `groups` groups and `n` columns; `c` holds `n · 16 · groups` values.
    #[allow(clippy::undocumented_unsafe_blocks, reason = "every block stays within the caller's sizes")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn gemm(groups: usize, k: usize, g: &[Rows16], y: &[BlockQ8K], n: usize, c: &mut [f32]) {
        let rows = 16 * groups;
        macro_rules! run {
            ($C:literal, $j:expr, $group:expr) => {{
                let (j, group) = ($j, $group);
                let columns = std::array::from_fn(|q| unsafe { y.as_ptr().add((j + q) * k) });
                let out = unsafe { tile::<$C>(k, g.as_ptr().add(group * k), columns) };
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
        // 128 rows of 1536 values (qwen2.5-coder-1.5b's row); small positive f16 scales.
        let (rows, k) = (128usize, 6usize);
        let x: Vec<BlockQ6K> = masked_blocks(&mut rng, rows * k, 0xff)
            .into_iter()
            .map(|b: BlockQ6K| BlockQ6K { d: rng.scale(), ..b })
            .collect();
        let groups = rows / 16;
        let repacked: Vec<Rows16> = (0..groups).flat_map(|group| repack(&x, k, group)).collect();
        for n in [1usize, 2, 4, 8] {
            let y = q8_k_activations(&mut rng, n * k);
            let (mut today, mut candidate) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            // SAFETY: `x` holds `rows` rows and `y` `n` columns of `k` blocks; the outputs hold
            // `rows · n` values; AVX-512 VNNI was checked above.
            let mut today_run =
                || unsafe { v4::gemm_q6_k(0..rows, n, k, x.as_ptr(), k, y.as_ptr(), k, today.as_mut_ptr(), rows) };
            let today_s = best(&mut today_run);
            // SAFETY: as above, for the repacked groups.
            let mut candidate_run = || unsafe { gemm(groups, k, &repacked, &y, n, &mut candidate) };
            let candidate_s = best(&mut candidate_run);
            today_run();
            candidate_run();
            let largest = today.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = today.iter().zip(&candidate).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let per = |s: f64| s * 1e9 / (2000 * rows * k * n) as f64;
            println!(
                "{n} rows: gemm_q6_k {:.2} ns, 16-row layout {:.2} ns per block and activation row; largest difference {:.1e} of the largest value",
                per(today_s),
                per(candidate_s),
                diff / largest
            );
        }
    }
}
