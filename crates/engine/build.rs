//! Gantry takes ggml's `llamafile_sgemm` calls to multiply small batches itself
//! (`model::dot_kernels::small_batches`). Where ggml's CPU backend is linked into the binary
//! (static libraries: not the portable build, not `LLAMA_BUILD_SHARED_LIBS=1`) the linker's
//! `--wrap` sends them there (`cfg(ggml_cpu_static)`); in the portable build, which loads the
//! backend at run time, the binary exports a `llamafile_sgemm` of its own (`cfg(ggml_cpu_loaded)`).
//! Every binary linking the engine must then pass the link argument: the engine's own tests get
//! it here, gantry-server's binaries and tests from its build script, which reads
//! `DEP_GANTRY_ENGINE_LINK_ARG`.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ggml_cpu_static)");
    println!("cargo::rustc-check-cfg=cfg(ggml_cpu_loaded)");
    println!("cargo::rerun-if-env-changed=LLAMA_BUILD_SHARED_LIBS");
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let x86_linux = env("CARGO_CFG_TARGET_ARCH") == "x86_64" && env("CARGO_CFG_TARGET_OS") == "linux";
    // llama-cpp-sys-2 builds shared libraries when this is "1" (its build.rs).
    let shared = env("LLAMA_BUILD_SHARED_LIBS") == "1";
    let variants = std::env::var_os("CARGO_FEATURE_CPU_VARIANTS").is_some();
    if x86_linux && !shared && !variants {
        println!("cargo::rustc-cfg=ggml_cpu_static");
        // And ggml's question whether to repack weights (`model::dot_kernels::repack`), a C++
        // function under its mangled name.
        // And ggml's tiled K-quant kernel, which would take products of a few rows first
        // (`model::dot_kernels::tiled`).
        let wraps = "-Wl,--wrap=llamafile_sgemm,--wrap=_Z35ggml_backend_cpu_repack_buffer_typev,\
                     --wrap=ggml_compute_forward_mul_mat_tiled";
        println!("cargo::rustc-link-arg={wraps}");
        println!("cargo::metadata=link_arg={wraps}");
    } else if x86_linux && variants {
        // The portable build loads its CPU backend (libggml-cpu-<variant>.so) at run time. ggml
        // builds it with default visibility and without -Bsymbolic, so its call to
        // `llamafile_sgemm` binds at load time to the first definition in the global scope: the
        // binary's own, once the binary exports it.
        println!("cargo::rustc-cfg=ggml_cpu_loaded");
        println!("cargo::rustc-link-arg=-Wl,--export-dynamic-symbol=llamafile_sgemm");
        println!("cargo::metadata=link_arg=-Wl,--export-dynamic-symbol=llamafile_sgemm");
    }
}
