//! Gantry's own x86 kernels for ggml's Q8_0 · Q8_0, Q5_0 · Q8_0, Q4_0 · Q8_0 and (AVX-512 only) Q4_K · Q8_K,
//! Q5_K · Q8_K, Q6_K · Q8_K and IQ4_XS · Q8_K dot products, put in place of ggml's at start.
//!
//! A step with one decoding stream multiplies each weight row by a single row of activations: one
//! dot product per weight row (ggml's `vec_dot`; two or more rows of activations go to llamafile's
//! tiled kernels instead, which this leaves alone). With the default model nearly all weight bytes
//! read per token are Q5_0 (attention, FFN gate/up) and Q8_0 (the output layer, and the Q5_0
//! matrices where `q5_as_q8` serves them as Q8_0). A perf profile of one decoding stream on a
//! 2-core Zen 5: `ggml_vec_dot_q5_0_q8_0` 47% and `ggml_vec_dot_q8_0_q8_0` 25% of the time, the
//! token at 15.5 ms, which streams the weights at under half the bandwidth a sequential read
//! reaches here (70 GB/s): the cores wait on memory (ggml hands each thread short runs of rows,
//! where the hardware prefetchers restart), and each block's fused multiply-add waits on the last
//! one's. The kernels (crate `gantry-cpu-kernels`) fetch the weights 4 KiB ahead and keep four
//! accumulators; they compute each block's integer products and f16 scales as ggml's do, so only
//! the order in which the float block sums are added differs (rounding in the last bits of a logit, as between any two
//! ggml CPU builds). Measured the same way: 13.2-13.8 ms a token, with either the AVX2 or the
//! AVX-512 level. `--cpu-kernels ggml` keeps ggml's own.
//!
//! The AVX-512 level also serves the K-quants of every Q4_K_M and Q5_K_M model, Q4_K, Q5_K and
//! Q6_K, and IQ4_XS (`gantry-cpu-kernels`' `k_quants`), one row here and a few rows in
//! `small_batches`: ggml's x86 Q5_K, Q6_K and IQ4_XS kernels multiply each activation row
//! separately, and its Q4_K one reads a repacked copy (`repack` says why that copy is no longer
//! made). With AVX2 alone, K-quant products are served from their 16-row copies
//! (`k_quant_copies`) or stay with ggml.
//!
//! ggml looks its kernels up in a constant table (`ggml_get_type_traits_cpu`) at every matrix
//! product, so putting ours there needs no change to llama.cpp: the table's page is made
//! writable for the two writes and then given back the protection it had. This happens once,
//! before any model is loaded: in the table of the CPU backend linked into the binary, or in the
//! portable build in that of the variant loaded at start (its `ggml_get_type_traits_cpu` found
//! with `dlsym`).
#![allow(unsafe_code, reason = "writes ggml's kernel table and calls the kernels through its C signature")]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod install;
#[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
pub(crate) mod k_quant_copies;
#[cfg(all(test, ggml_cpu_static))]
mod k_quant_copies_tests;
#[cfg(all(test, ggml_cpu_static))]
mod k_quant_tests;
#[cfg(ggml_cpu_static)]
mod repack;
#[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
pub(crate) mod small_batches;
#[cfg(all(test, ggml_cpu_static))]
mod small_batches_tests;
#[cfg(all(test, target_arch = "x86_64", target_os = "linux", not(feature = "cpu-variants")))]
mod tests;
#[cfg(ggml_cpu_static)]
mod tiled;

/// Whose dot-product kernels serve Q8_0, Q5_0, Q4_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights on the CPU
/// (`--cpu-kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKernels {
    /// Gantry's, where this CPU and build allow them; else ggml's.
    Gantry,
    /// Gantry's AVX2 level even where the CPU has AVX-512 or AVX-VNNI: what a CPU without them
    /// runs, to compare on one machine.
    GantryAvx2,
    /// Gantry's AVX2 level with AVX-VNNI even where the CPU has AVX-512: what Intel's client cores
    /// run, to compare on one machine (ggml's kernels where the CPU lacks AVX-VNNI).
    GantryAvxVnni,
    /// ggml's own.
    Ggml,
}

/// Puts Gantry's kernels in ggml's table, and its small-batch products in llamafile's place
/// where the build lets them (once per process; later calls return the first answer), and says
/// which dot products now serve: `gantry-avx512`, `gantry-avxvnni` or `gantry-avx2`, or `ggml` where they were not
/// wanted or cannot run here. ggml's repacked copies of weights are skipped where Gantry's
/// kernels serve every type of `models` (all the process may load) that ggml would copy.
pub fn use_cpu_kernels(choice: CpuKernels, models: &[&std::path::Path]) -> &'static str {
    static CHOSEN: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    #[cfg(not(ggml_cpu_static))]
    let _ = models;
    CHOSEN.get_or_init(|| {
        if choice == CpuKernels::Ggml {
            return "ggml";
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        let wanted = match choice {
            CpuKernels::GantryAvx2 => Some(install::Level::V3),
            CpuKernels::GantryAvxVnni => Some(install::Level::AvxVnni),
            CpuKernels::Gantry | CpuKernels::Ggml => None,
        };
        match install::install(wanted) {
            Ok(level) => {
                #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
                match small_batches::enable(level) {
                    // Gantry's kernels read the weights as loaded: repacked copies would only
                    // cost memory, where they serve every type ggml would copy. With AVX2 Q4_K
                    // is served only from its 16-row copies (`serve_k_quant_copies`, set before);
                    // should the memory budget turn them off later, ggml's unrepacked kernel
                    // takes it.
                    #[cfg(ggml_cpu_static)]
                    Ok(()) => match repack::tensor_types(models) {
                        Some(types) if repack::costs_nothing(&served_unrepacked(level), &types) => repack::skip(),
                        Some(_) => tracing::info!("ggml's repacked kernels serve some of the models' weights"),
                        None => tracing::warn!("a model's GGUF header is unreadable: ggml keeps repacking"),
                    },
                    #[cfg(not(ggml_cpu_static))]
                    Ok(()) => {}
                    Err(e) => tracing::warn!(error = %e, "llamafile's kernels keep multiplying small batches"),
                }
                return level.name();
            }
            Err(e) => tracing::warn!(error = %e, "keeping ggml's CPU dot-product kernels"),
        }
        "ggml"
    })
}

/// The weight types `level`'s kernels serve at every row count without ggml's repacked copies:
/// its own, and those of its K-quant copies where they are served.
#[cfg(ggml_cpu_static)]
fn served_unrepacked(level: install::Level) -> Vec<llama_cpp_sys_2::ggml_type> {
    let mut served = level.serves_without_repacking();
    if k_quant_copies::serving() {
        served.extend(k_quant_copies::COPIED_TYPES.map(|(ty, _)| ty));
    }
    served
}

/// Whether ggml keeps repacked copies of Q4_0, Q4_K, IQ4_NL and MXFP4 weights: not where
/// Gantry's kernels serve every such type of the models ([`use_cpu_kernels`] decides, before any
/// model loads).
pub fn weights_repacked() -> bool {
    #[cfg(ggml_cpu_static)]
    return !repack::skipped();
    #[cfg(not(ggml_cpu_static))]
    true
}

/// Whose kernels multiply Q8_0, Q5_0, Q4_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights by a few rows of activations
/// (`small_batches`):
/// `gantry-avx512`, `gantry-avxvnni` or `gantry-avx2` once [`use_cpu_kernels`] put Gantry's in place where ggml's
/// CPU backend is linked in, else `llamafile`.
pub fn small_batch_kernels() -> &'static str {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    return small_batches::kernels();
    #[cfg(not(any(ggml_cpu_static, ggml_cpu_loaded)))]
    "llamafile"
}

/// Serves Q4_K, Q5_K, Q6_K and IQ4_XS products of 1 to 512 activation rows from 16-row copies of the matrices
/// (`k_quant_copies`, `--k-quant-copies`) from now on, where the AVX-512 level serves small
/// batches: call after [`use_cpu_kernels`], before any model loads.
pub fn serve_k_quant_copies(on: bool) {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    k_quant_copies::serve(on);
    #[cfg(not(any(ggml_cpu_static, ggml_cpu_loaded)))]
    let _ = on;
}

/// Whether products are served from K-quant copies ([`serve_k_quant_copies`] on, with AVX-512).
pub fn k_quant_copies_served() -> bool {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    return k_quant_copies::serving();
    #[cfg(not(any(ggml_cpu_static, ggml_cpu_loaded)))]
    false
}

/// The weight types products are served from K-quant copies of, where they are
/// ([`k_quant_copies_served`]): Q4_K, Q5_K, Q6_K and IQ4_XS.
pub fn k_quant_copied_types() -> Vec<&'static str> {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    if k_quant_copies::serving() {
        return k_quant_copies::COPIED_TYPES.map(|(_, name)| name).to_vec();
    }
    Vec::new()
}

/// Bytes `model`'s K-quant copies take where they are served, else 0.
pub(crate) fn k_quant_copy_bytes(model: &std::path::Path) -> u64 {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    return if k_quant_copies::serving() { k_quant_copies::copy_bytes(model) } else { 0 };
    #[cfg(not(any(ggml_cpu_static, ggml_cpu_loaded)))]
    {
        let _ = model;
        0
    }
}

/// Drops every K-quant copy: a model is being freed, and its addresses may be reused.
pub(crate) fn forget_k_quant_copies() {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    k_quant_copies::forget_all();
}

/// Bytes the K-quant copies made so far take, and how many matrices they hold.
pub fn k_quant_copies_made() -> (u64, usize) {
    #[cfg(any(ggml_cpu_static, ggml_cpu_loaded))]
    return k_quant_copies::made();
    #[cfg(not(any(ggml_cpu_static, ggml_cpu_loaded)))]
    (0, 0)
}
