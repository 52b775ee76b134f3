//! Where ggml's CPU backend is linked into the binary itself (static libraries: not the portable
//! build's loadable variants, not `LLAMA_BUILD_SHARED_LIBS=1`), Gantry takes llamafile's
//! `llamafile_sgemm` calls through the linker's `--wrap` to multiply small batches itself
//! (`model::dot_kernels::small_batches`). Every binary linking the engine must then pass the flag:
//! the engine's own tests get it here, gantry-server's binaries and tests from its build script,
//! which reads `DEP_GANTRY_ENGINE_WRAP`.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ggml_cpu_static)");
    println!("cargo::rerun-if-env-changed=LLAMA_BUILD_SHARED_LIBS");
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let x86_linux = env("CARGO_CFG_TARGET_ARCH") == "x86_64" && env("CARGO_CFG_TARGET_OS") == "linux";
    // llama-cpp-sys-2 builds shared libraries when this is "1" (its build.rs).
    let shared = env("LLAMA_BUILD_SHARED_LIBS") == "1";
    let variants = std::env::var_os("CARGO_FEATURE_CPU_VARIANTS").is_some();
    if x86_linux && !shared && !variants {
        println!("cargo::rustc-cfg=ggml_cpu_static");
        println!("cargo::rustc-link-arg=-Wl,--wrap=llamafile_sgemm");
        println!("cargo::metadata=wrap=llamafile_sgemm");
    }
}
