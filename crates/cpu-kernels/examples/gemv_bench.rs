//! A decode step's matrix-vector products on K-quant weights, timed: one activation row against
//! a few hundred MB of Q4_K, Q5_K, Q6_K or IQ4_XS rows, on 2 threads as ggml runs them, against a
//! plain read of the same bytes; and Q4_K and Q6_K from their 16-row copies. `cargo run --release
//! -p gantry-cpu-kernels --example gemv_bench [TYPE]` (a prefix of `q4_k`, `q5_k`, `q6_k` or
//! `iq4_xs` measures that type only).
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use gantry_cpu_kernels::x86::{
        repack_q4_k_rows16, repack_q6_k_rows16, v4, BlockIQ4XS, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, Q4KRows16,
        Q6KRows16,
    };

    use crate::common::{masked_blocks, q8_k_activations, Rng};

    /// Spins until every thread arrived, as ggml's barrier does.
    struct Barrier {
        count: AtomicUsize,
        phase: AtomicUsize,
        n: usize,
    }
    impl Barrier {
        fn wait(&self) {
            let phase = self.phase.load(Ordering::Acquire);
            if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
                self.count.store(0, Ordering::Release);
                self.phase.fetch_add(1, Ordering::AcqRel);
            } else {
                while self.phase.load(Ordering::Acquire) == phase {
                    std::hint::spin_loop();
                }
            }
        }
    }

    type Kernel<B> = fn(&[B], usize, usize, std::ops::Range<usize>, &[BlockQ8K], &mut [f32]);

    /// `passes` times over `mats` matrices of `rows` × `k` blocks, 2 threads, each matrix split
    /// between them (chunks of 64 rows taken in turn, or halves), a barrier after each: GB/s.
    fn time<B: Sync>(
        weights: &[B],
        mats: usize,
        rows: usize,
        k: usize,
        y: &[BlockQ8K],
        kernel: Kernel<B>,
        chunked: bool,
    ) -> f64 {
        let threads = 2;
        let barrier = Barrier { count: AtomicUsize::new(0), phase: AtomicUsize::new(0), n: threads };
        let next: Vec<AtomicUsize> = (0..mats).map(|_| AtomicUsize::new(0)).collect();
        let passes = 5;
        let mut best = f64::MAX;
        for _ in 0..passes {
            for n in &next {
                n.store(0, Ordering::Relaxed);
            }
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (barrier, next) = (&barrier, &next);
                    s.spawn(move || {
                        let mut out = vec![0f32; rows];
                        for m in 0..mats {
                            let mat = &weights[m * rows * k..(m + 1) * rows * k];
                            if chunked {
                                loop {
                                    let c = next[m].fetch_add(1, Ordering::Relaxed);
                                    if c * 64 >= rows {
                                        break;
                                    }
                                    let r = c * 64..(c * 64 + 64).min(rows);
                                    kernel(mat, rows, k, r, y, &mut out);
                                }
                            } else {
                                let half = rows.div_ceil(threads).next_multiple_of(4);
                                let r = (t * half).min(rows)..((t + 1) * half).min(rows);
                                kernel(mat, rows, k, r, y, &mut out);
                            }
                            barrier.wait();
                        }
                        std::hint::black_box(out);
                    });
                }
            });
            best = best.min(start.elapsed().as_secs_f64());
        }
        std::mem::size_of_val(weights) as f64 / best / 1e9
    }

    /// [`time`] over `mats` matrices of 16-row groups (`rows / 16` groups of `k` blocks each),
    /// halves of the groups to each thread.
    fn time_groups<G: Sync>(g: &[G], mats: usize, rows: usize, k: usize, y: &[BlockQ8K], kernel: Kernel<G>) -> f64 {
        time(&g[..mats * rows / 16 * k], mats, rows / 16, k, y, kernel, false)
    }

    fn read_bytes<B>(mat: &[B], _rows: usize, k: usize, r: std::ops::Range<usize>, _y: &[BlockQ8K], out: &mut [f32]) {
        let size = std::mem::size_of::<B>() * k;
        let base = mat.as_ptr().cast::<u8>();
        // SAFETY: the range is within the matrix, and the machines this runs on have AVX-512.
        unsafe {
            let mut acc = _mm512_setzero_si512();
            let (from, to) = (r.start * size, r.end * size);
            let mut at = from;
            while at + 64 <= to {
                acc = _mm512_xor_si512(acc, _mm512_loadu_si512(base.add(at).cast()));
                at += 64;
            }
            out[0] += _mm512_reduce_add_epi32(acc) as f32;
        }
    }

    /// `fn $name`: one dot product per row of the share with `$dot`.
    macro_rules! per_row {
        ($name:ident, $Block:ty, $dot:path) => {
            fn $name(
                mat: &[$Block],
                _rows: usize,
                k: usize,
                r: std::ops::Range<usize>,
                y: &[BlockQ8K],
                out: &mut [f32],
            ) {
                for i in r {
                    // SAFETY: row `i` and `y` hold `k` blocks; the machines this runs on have
                    // AVX-512 VNNI.
                    out[i] = unsafe { $dot(k, mat.as_ptr().add(i * k), y.as_ptr()) };
                }
            }
        };
    }
    /// `fn $name`: the share's groups of 16 rows (`rows16`, repacked from `$Block`) by one
    /// activation row: as `k_quant_copies` serves a copied matrix.
    macro_rules! rows16 {
        ($name:ident, $Group:ty, $gemm:path) => {
            fn $name(
                mat: &[$Group],
                groups: usize,
                k: usize,
                r: std::ops::Range<usize>,
                y: &[BlockQ8K],
                _out: &mut [f32],
            ) {
                thread_local!(static OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) });
                OUT.with_borrow_mut(|out| {
                    out.resize(16 * groups, 0.0);
                    // SAFETY: groups `r` and `y` hold `k` blocks, `out` a result a row; the
                    // machines this runs on have AVX-512 VNNI.
                    unsafe { $gemm(r, 1, k, mat.as_ptr(), y.as_ptr(), k, out.as_mut_ptr(), out.len()) };
                });
            }
        };
    }
    rows16!(rows16_q4, Q4KRows16, v4::gemm_q4_k_rows16);
    rows16!(rows16_q6, Q6KRows16, v4::gemm_q6_k_rows16);
    per_row!(per_row_q4, BlockQ4K, v4::dot_q4_k);
    per_row!(per_row_q5, BlockQ5K, v4::dot_q5_k);
    per_row!(per_row_q6, BlockQ6K, v4::dot_q6_k);
    per_row!(per_row_iq4_xs, BlockIQ4XS, v4::dot_iq4_xs);

    pub(crate) fn run() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let filter = std::env::args().nth(1).unwrap_or_default();
        // (name, rows, k): qwen2.5-coder-1.5b's gate/up (8960 × 1536) and down (1536 × 8960).
        for (rows, k) in [(8960usize, 6usize), (1536, 35)] {
            let target = 400usize << 20;
            let y = q8_k_activations(&mut rng, k);
            macro_rules! measure {
                ($name:literal, $Block:ty, $per_row:ident) => {
                    if filter.is_empty() || $name.starts_with(filter.as_str()) {
                        let mats = target / (rows * k * std::mem::size_of::<$Block>());
                        let w: Vec<$Block> = masked_blocks(&mut rng, mats * rows * k, 0x3b);
                        for chunked in [true, false] {
                            let read = time(&w, mats, rows, k, &y, read_bytes, chunked);
                            let one = time(&w, mats, rows, k, &y, $per_row, chunked);
                            println!("{} {rows}x{k} chunked={chunked}: read {read:.1} GB/s, per-row {one:.1}", $name);
                        }
                        w
                    } else {
                        Vec::new()
                    }
                };
            }
            // The 16-row copies, in halves: GB/s of the copy's bytes, and of the GGUF's bytes it
            // stands for (what a token's time is paid for).
            macro_rules! copied {
                ($name:literal, $w:expr, $repack:path, $Group:ty, $rows16:ident, $gguf:expr) => {
                    if !$w.is_empty() {
                        let g: Vec<$Group> = $repack(&$w, $w.len() / k, k, k);
                        let mats = g.len() / (rows / 16 * k);
                        let gbs = time_groups(&g, mats, rows, k, &y, $rows16);
                        let of_gguf = gbs * $gguf as f64 / std::mem::size_of::<$Group>() as f64;
                        println!(
                            "{} {rows}x{k} rows16 halves: {gbs:.1} GB/s of copy, {of_gguf:.1} of GGUF bytes",
                            $name
                        );
                    }
                };
            }
            let q4 = measure!("q4_k", BlockQ4K, per_row_q4);
            copied!("q4_k", q4, repack_q4_k_rows16, Q4KRows16, rows16_q4, 16 * std::mem::size_of::<BlockQ4K>());
            measure!("q5_k", BlockQ5K, per_row_q5);
            let q6 = measure!("q6_k", BlockQ6K, per_row_q6);
            copied!("q6_k", q6, repack_q6_k_rows16, Q6KRows16, rows16_q6, 16 * std::mem::size_of::<BlockQ6K>());
            measure!("iq4_xs", BlockIQ4XS, per_row_iq4_xs);
        }
    }
}
