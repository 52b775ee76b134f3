//! A decode step's matrix-vector products with ggml's own `vec_dot` for weight types Gantry has
//! no kernel of its own for, timed: one activation row (quantized to the type's `vec_dot_type`)
//! against a few hundred MB of weight rows on 2 threads, split as ggml splits them (runs of 64
//! rows claimed in turn) and as `small_batches` does (one contiguous share each). `cargo run
//! --release -p gantry-engine --example vec_dot_bench [TYPE]`, TYPE a ggml type name (`q4_1`).
#![allow(unsafe_code, clippy::print_stdout, reason = "a benchmark of ggml's raw kernels")]

// The engine's `__wrap_llamafile_sgemm`, which the link argument points ggml's calls at.
use gantry_engine as _;

use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use llama_cpp_sys_2::ggml_type_traits_cpu;

struct Rng(u64);
impl Rng {
    fn float(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u32 << 24) as f32) - 0.5
    }
}

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

struct Case<'a> {
    traits: &'a ggml_type_traits_cpu,
    weights: &'a [u8],
    mats: usize,
    rows: usize,
    n: usize,
    row_bytes: usize,
    y: &'a [u8],
}

/// `passes` times over the case's matrices, 2 threads, a barrier after each: best GB/s.
fn time(case: &Case<'_>, chunked: bool) -> f64 {
    let threads = 2;
    let barrier = Barrier { count: AtomicUsize::new(0), phase: AtomicUsize::new(0), n: threads };
    let next: Vec<AtomicUsize> = (0..case.mats).map(|_| AtomicUsize::new(0)).collect();
    let vec_dot = case.traits.vec_dot.expect("a vec_dot");
    let mut best = f64::MAX;
    for _ in 0..5 {
        for n in &next {
            n.store(0, Ordering::Relaxed);
        }
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (barrier, next) = (&barrier, &next);
                s.spawn(move || {
                    let mut out = vec![0f32; case.rows];
                    let run = |r: std::ops::Range<usize>, mat: &[u8], out: &mut [f32]| {
                        for i in r {
                            // SAFETY: row `i` and `y` hold `n` values of their types.
                            unsafe {
                                vec_dot(
                                    case.n as i32,
                                    &mut out[i],
                                    0,
                                    mat.as_ptr().add(i * case.row_bytes).cast::<c_void>(),
                                    0,
                                    case.y.as_ptr().cast::<c_void>(),
                                    0,
                                    1,
                                );
                            }
                        }
                    };
                    for (m, next) in next.iter().enumerate() {
                        let mat = &case.weights[m * case.rows * case.row_bytes..][..case.rows * case.row_bytes];
                        if chunked {
                            loop {
                                let c = next.fetch_add(1, Ordering::Relaxed);
                                if c * 64 >= case.rows {
                                    break;
                                }
                                run(c * 64..(c * 64 + 64).min(case.rows), mat, &mut out);
                            }
                        } else {
                            let half = case.rows.div_ceil(threads).next_multiple_of(2);
                            run((t * half).min(case.rows)..((t + 1) * half).min(case.rows), mat, &mut out);
                        }
                        barrier.wait();
                    }
                    std::hint::black_box(out);
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    case.weights.len() as f64 / best / 1e9
}

fn main() {
    use llama_cpp_sys_2::*;
    let filter = std::env::args().nth(1).unwrap_or_default();
    // SAFETY: takes no arguments; idempotent.
    unsafe { ggml_cpu_init() };
    let types: [(&str, ggml_type); 12] = [
        ("q4_0", GGML_TYPE_Q4_0),
        ("q4_1", GGML_TYPE_Q4_1),
        ("q5_1", GGML_TYPE_Q5_1),
        ("q2_k", GGML_TYPE_Q2_K),
        ("q3_k", GGML_TYPE_Q3_K),
        ("q4_k", GGML_TYPE_Q4_K),
        ("q5_k", GGML_TYPE_Q5_K),
        ("q6_k", GGML_TYPE_Q6_K),
        ("iq4_nl", GGML_TYPE_IQ4_NL),
        ("iq4_xs", GGML_TYPE_IQ4_XS),
        ("q8_0", GGML_TYPE_Q8_0),
        ("q5_0", GGML_TYPE_Q5_0),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // qwen2.5-coder-1.5b's gate/up (8960 × 1536) and down (1536 × 8960).
    for (rows, n) in [(8960usize, 1536usize), (1536, 8960)] {
        let source: Vec<f32> = (0..rows * n).map(|_| rng.float()).collect();
        let x: Vec<f32> = (0..n).map(|_| rng.float()).collect();
        for (name, ty) in types.iter().filter(|(name, _)| filter.is_empty() || *name == filter) {
            // SAFETY: ggml's table has an entry for every type.
            let traits = unsafe { &*ggml_get_type_traits_cpu(*ty) };
            // SAFETY: a size for every type.
            let row_bytes = unsafe { ggml_row_size(*ty, n as i64) };
            let mats = (256usize << 20) / (rows * row_bytes);
            let mut one = vec![0u8; rows * row_bytes];
            // SAFETY: `one` has room for `rows` rows of `n` values of the type.
            unsafe {
                ggml_quantize_chunk(
                    *ty,
                    source.as_ptr(),
                    one.as_mut_ptr().cast(),
                    0,
                    rows as i64,
                    n as i64,
                    std::ptr::null(),
                )
            };
            let weights: Vec<u8> = (0..mats).flat_map(|_| one.iter().copied()).collect();
            // SAFETY: a size for every type.
            let mut y = vec![0u8; unsafe { ggml_row_size(traits.vec_dot_type, n as i64) }];
            // SAFETY: `y` has room for one row of the activation type.
            unsafe { traits.from_float.expect("a quantizer")(x.as_ptr(), y.as_mut_ptr().cast(), n as i64) };
            let case = Case { traits, weights: &weights, mats, rows, n, row_bytes, y: &y };
            let (chunked, shares) = (time(&case, true), time(&case, false));
            println!(
                "{name:6} {rows}x{n}: chunks of 64 {chunked:5.1} GB/s, one share each {shares:5.1} ({:+.0}%)",
                (shares / chunked - 1.0) * 100.0
            );
        }
    }
}
