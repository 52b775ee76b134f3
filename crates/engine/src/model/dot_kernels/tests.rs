//! The kernels against ggml's own (read from its table, which the tests leave as it is: engine
//! tests in the same process compare decodes and must not see kernels change under them) and
//! against exact sums.

use std::os::raw::c_void;

use llama_cpp_sys_2::{GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0};

use super::install::{ggml_kernel, traits_of, Level};
use gantry_cpu_kernels::x86::QK;

/// xorshift64*: deterministic test data without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A positive normal f16 between about 2^-10 and 2^5, as a scale would be.
    fn scale(&mut self) -> u16 {
        let exponent = 5 + (self.next() % 20) as u16;
        (exponent << 10) | (self.next() % 1024) as u16
    }

    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
}

fn f16_value(bits: u16) -> f64 {
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    (1.0 + mantissa / 1024.0) * 2f64.powi(exponent - 15)
}

/// `n` values of Q8_0 activations (as ggml quantizes them: -127..=127), as raw blocks, and the
/// blocks' scales and values.
pub(super) fn q8_row(rng: &mut Rng, n: usize, lowest: i8) -> (Vec<u8>, Vec<(f64, [i32; QK])>) {
    let mut raw = Vec::new();
    let mut blocks = Vec::new();
    for _ in 0..n / QK {
        let d = rng.scale();
        raw.extend_from_slice(&d.to_le_bytes());
        let mut values = [0i32; QK];
        for v in &mut values {
            let q = (rng.byte() as i8).max(lowest);
            raw.push(q as u8);
            *v = i32::from(q);
        }
        blocks.push((f16_value(d), values));
    }
    (raw, blocks)
}

/// `n` Q5_0 weights as raw blocks, and the blocks' scales and values.
pub(super) fn q5_row(rng: &mut Rng, n: usize) -> (Vec<u8>, Vec<(f64, [i32; QK])>) {
    let mut raw = Vec::new();
    let mut blocks = Vec::new();
    for _ in 0..n / QK {
        let d = rng.scale();
        let qh = rng.next() as u32;
        let qs: Vec<u8> = (0..QK / 2).map(|_| rng.byte()).collect();
        raw.extend_from_slice(&d.to_le_bytes());
        raw.extend_from_slice(&qh.to_le_bytes());
        raw.extend_from_slice(&qs);
        let mut values = [0i32; QK];
        for (j, v) in values.iter_mut().enumerate() {
            let nibble = if j < 16 { qs[j] & 0x0f } else { qs[j - 16] >> 4 };
            *v = i32::from(nibble | (((qh >> j) & 1) as u8) << 4) - 16;
        }
        blocks.push((f16_value(d), values));
    }
    (raw, blocks)
}

/// `n` Q4_0 weights as raw blocks, and the blocks' scales and values.
pub(super) fn q4_row(rng: &mut Rng, n: usize) -> (Vec<u8>, Vec<(f64, [i32; QK])>) {
    let mut raw = Vec::new();
    let mut blocks = Vec::new();
    for _ in 0..n / QK {
        let d = rng.scale();
        let qs: Vec<u8> = (0..QK / 2).map(|_| rng.byte()).collect();
        raw.extend_from_slice(&d.to_le_bytes());
        raw.extend_from_slice(&qs);
        let mut values = [0i32; QK];
        for (j, v) in values.iter_mut().enumerate() {
            *v = i32::from(if j < 16 { qs[j] & 0x0f } else { qs[j - 16] >> 4 }) - 8;
        }
        blocks.push((f16_value(d), values));
    }
    (raw, blocks)
}

/// Σ of the blocks' exact integer dot products times their scales, and Σ of the scaled products'
/// magnitudes (the float sums round relative to those: partial sums cancel).
pub(super) fn exact(x: &[(f64, [i32; QK])], y: &[(f64, [i32; QK])]) -> (f64, f64) {
    x.iter().zip(y).fold((0.0, 0.0), |(sum, size), ((dx, vx), (dy, vy))| {
        let dot: i32 = vx.iter().zip(vy).map(|(a, b)| a * b).sum();
        let magnitude: i32 = vx.iter().zip(vy).map(|(a, b)| (a * b).abs()).sum();
        (sum + dx * dy * f64::from(dot), size + (dx * dy).abs() * f64::from(magnitude))
    })
}

/// ggml's kernels convert f16 scales through a table that its CPU backend fills at init.
pub(super) fn ggml_ready() {
    crate::model::backend::llama_backend();
    // SAFETY: takes no arguments; idempotent (ggml guards it).
    unsafe { llama_cpp_sys_2::ggml_cpu_init() };
}

fn call(kernel: super::install::VecDot, n: usize, x: &[u8], y: &[u8]) -> f64 {
    let mut s = f32::NAN;
    // SAFETY: x and y hold n / 32 blocks of their types; s is one float.
    unsafe { kernel(n as i32, &mut s, 0, x.as_ptr().cast::<c_void>(), 0, y.as_ptr().cast::<c_void>(), 0, 1) };
    f64::from(s)
}

pub(super) fn levels() -> Vec<Level> {
    // Every level this CPU runs: the AVX-512 one and the AVX-VNNI one where it can, and always
    // the AVX2 one.
    Level::ALL.into_iter().filter(|level| level.runs_here()).collect()
}

/// Row lengths of the default model (896, 4864), the shortest, and ones that leave 1-3 blocks
/// past the last group of four.
const LENGTHS: [usize; 7] = [32, 64, 96, 160, 896, 4864, 4896];

#[test]
fn every_level_agrees_with_ggml_and_with_the_exact_sum() {
    assert!(!levels().is_empty(), "the machines these tests run on all have AVX2");
    ggml_ready();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for level in levels() {
        let (q8_0, q5_0, q4_0) = level.kernels();
        for n in LENGTHS {
            for _ in 0..20 {
                let (y, y_blocks) = q8_row(&mut rng, n, -127);
                let (x8, x8_blocks) = q8_row(&mut rng, n, -128);
                let (x5, x5_blocks) = q5_row(&mut rng, n);
                let (x4, x4_blocks) = q4_row(&mut rng, n);
                for (ours, theirs, x, x_blocks) in [
                    (q8_0, ggml_kernel(GGML_TYPE_Q8_0), &x8, &x8_blocks),
                    (q5_0, ggml_kernel(GGML_TYPE_Q5_0), &x5, &x5_blocks),
                    (q4_0, ggml_kernel(GGML_TYPE_Q4_0), &x4, &x4_blocks),
                ] {
                    let (sum, size) = exact(x_blocks, &y_blocks);
                    let (ours, theirs) = (call(ours, n, x, &y), call(theirs, n, x, &y));
                    // f32 rounding of each block's scaled sum and of the running sums.
                    let tolerance = 1e-6 * size * (n / QK) as f64;
                    assert!((ours - sum).abs() <= tolerance, "{level:?} n={n}: {ours} against exact {sum}");
                    assert!((ours - theirs).abs() <= 2.0 * tolerance, "{level:?} n={n}: {ours} against ggml {theirs}");
                }
            }
        }
    }
}

#[test]
fn values_at_the_ends_of_the_ranges_are_exact() {
    // All weights -128 (Q8_0), -16 (Q5_0: nibble 0, fifth bit clear) or -8 (Q4_0: nibble 0)
    // against all activations 127 with unit scales: each block sums to exactly -128·127·32,
    // -16·127·32 or -8·127·32.
    let one = 0x3c00u16.to_le_bytes();
    let block = |body: &[u8]| [&one[..], body].concat();
    let y = block(&[127u8; QK]).repeat(8);
    let x8 = block(&[0x80u8; QK]).repeat(8);
    let x5 = block(&[0u8; 4 + QK / 2]).repeat(8);
    let x4 = block(&[0u8; QK / 2]).repeat(8);
    for level in levels() {
        let (q8_0, q5_0, q4_0) = level.kernels();
        assert_eq!(call(q8_0, 8 * QK, &x8, &y), f64::from(-128 * 127 * 32 * 8), "{level:?}");
        assert_eq!(call(q5_0, 8 * QK, &x5, &y), f64::from(-16 * 127 * 32 * 8), "{level:?}");
        assert_eq!(call(q4_0, 8 * QK, &x4, &y), f64::from(-8 * 127 * 32 * 8), "{level:?}");
    }
}

#[test]
fn the_table_entries_ggml_reads_are_where_the_bindings_say() {
    // install writes the vec_dot field through the bindings' struct layout; the kernel read
    // back through it must be ggml's own Q8_0 kernel, which this test runs.
    ggml_ready();
    let traits = traits_of(GGML_TYPE_Q8_0);
    // SAFETY: a pointer into ggml's static table.
    let kernel = unsafe { (*traits).vec_dot }.expect("a kernel");
    let one = 0x3c00u16.to_le_bytes();
    let row = [&one[..], &[2u8; QK][..]].concat();
    assert_eq!(call(kernel, QK, &row, &row), f64::from(2 * 2 * 32));
}

static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static GGML_Q8_0: std::sync::OnceLock<super::install::VecDot> = std::sync::OnceLock::new();

/// ggml's own Q8_0 kernel, counted: the same numbers, so tests running meanwhile see no change.
unsafe extern "C" fn counting_q8_0(
    n: i32,
    s: *mut f32,
    bs: usize,
    x: *const c_void,
    bx: usize,
    y: *const c_void,
    by: usize,
    nrc: i32,
) {
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ggml = GGML_Q8_0.get().expect("set before installing");
    // SAFETY: ggml's own kernel, called as ggml called this one.
    unsafe { ggml(n, s, bs, x, bx, y, by, nrc) }
}

#[test]
fn ggml_takes_its_kernel_from_the_table_at_every_product() {
    // What install relies on: a kernel written into the table is the one a matrix product of one
    // activation row calls: ones_times_127 of one row.
    ggml_ready();
    let ggml = *GGML_Q8_0.get_or_init(|| ggml_kernel(GGML_TYPE_Q8_0));
    // SAFETY: the table entry's page is only made writable here (install runs in servers only).
    unsafe { super::install::write_kernel(GGML_TYPE_Q8_0, counting_q8_0) }.expect("writable table");
    let before = CALLS.load(std::sync::atomic::Ordering::Relaxed);
    let out = ones_times_127(1, 1);
    // SAFETY: as above.
    unsafe { super::install::write_kernel(GGML_TYPE_Q8_0, ggml) }.expect("writable table");
    assert!(CALLS.load(std::sync::atomic::Ordering::Relaxed) >= before + 16, "ggml did not call the table's kernel");
    assert_eq!(out, vec![8128.0; 16]);
}

/// ggml's matrix product, on `threads` threads, of W (16 rows of 64 Q8_0 values, all 1 with
/// scale 1) and `rows` rows of activations all 127 (which quantize to 127 with scale 1): every
/// output is 64 products of 127, 8128.
pub(super) fn ones_times_127(rows: i64, threads: i32) -> Vec<f32> {
    use llama_cpp_sys_2::*;
    ggml_ready();
    let params = ggml_init_params { mem_size: 4 << 20, mem_buffer: std::ptr::null_mut(), no_alloc: false };
    let outputs = 16 * usize::try_from(rows).expect("positive");
    // SAFETY: a context of its own, freed below; tensors are written within their sizes.
    unsafe {
        let ctx = ggml_init(params);
        let w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 16);
        let row = [&0x3c00u16.to_le_bytes()[..], &[1u8; QK][..]].concat().repeat(2 * 16);
        std::ptr::copy_nonoverlapping(row.as_ptr(), (*w).data.cast::<u8>(), row.len());
        let x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, rows);
        std::slice::from_raw_parts_mut((*x).data.cast::<f32>(), outputs * 4).fill(127.0);
        let y = ggml_mul_mat(ctx, w, x);
        let graph = ggml_new_graph(ctx);
        ggml_build_forward_expand(graph, y);
        ggml_graph_compute_with_ctx(ctx, graph, threads);
        let out = std::slice::from_raw_parts((*y).data.cast::<f32>(), outputs).to_vec();
        ggml_free(ctx);
        out
    }
}

#[cfg(ggml_cpu_static)]
#[test]
fn ggml_asks_the_wrapper_for_its_repacking_buffer_type() {
    // The link step's `--wrap=ggml_backend_cpu_repack_buffer_type`: ggml's list of extra buffer
    // types (built once, at the first ask) comes through `repack`, which passes ggml's own on (no
    // test tells it to skip, so that engine tests running meanwhile load models as ggml would).
    use llama_cpp_sys_2::*;
    ggml_ready();
    // SAFETY: the CPU device is always registered; the proc address has ggml's signature
    // (`ggml_backend_dev_get_extra_bufts_t`), and its list ends with a null entry.
    let names = unsafe {
        let device = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        let reg = ggml_backend_dev_backend_reg(device);
        let address = ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr());
        assert!(!address.is_null(), "the CPU backend lists extra buffer types");
        let extra_bufts = std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(ggml_backend_dev_t) -> *mut ggml_backend_buffer_type_t,
        >(address);
        let mut list = extra_bufts(device);
        let mut names = Vec::new();
        while !(*list).is_null() {
            names.push(std::ffi::CStr::from_ptr(ggml_backend_buft_name(*list)).to_string_lossy().into_owned());
            list = list.add(1);
        }
        names
    };
    assert!(super::repack::asked() >= 1, "ggml's ask did not reach the wrapper");
    assert!(names.iter().any(|n| n == "CPU_REPACK"), "ggml's own repacking passed on: {names:?}");
}
