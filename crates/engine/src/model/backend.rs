//! Which CPU kernels this binary runs: the features ggml's CPU backend was compiled with (AVX2,
//! AVX512_VNNI, AMX_INT8, …), as llama.cpp's `llama_print_system_info()` reports them. ggml picks
//! its kernels from these at compile time, so they name the variant that serves requests.
#![allow(unsafe_code, reason = "llama_print_system_info is a C call")]

use std::ffi::CStr;
use std::sync::OnceLock;

use llama_cpp_2::llama_backend::LlamaBackend;

/// Which build of ggml's CPU backend runs: in the portable build (feature `cpu-variants`) the
/// variant chosen for this CPU at start (`haswell`, `icelake`, `zen4`, …); otherwise `built-in`,
/// the one compiled into the binary (native for the build host with `make build`, AVX2 without).
pub fn cpu_backend_variant() -> String {
    #[cfg(feature = "cpu-variants")]
    if let Some(v) = crate::model::cpu_variants::loaded() {
        return v.name;
    }
    "built-in".to_string()
}

/// Loads the CPU backend where it is not built in (the portable build), so a server can fail at
/// start with the reason rather than at its first model. A no-op in other builds.
pub fn load_cpu_backend() -> Result<(), String> {
    #[cfg(feature = "cpu-variants")]
    crate::model::cpu_variants::load()?;
    Ok(())
}

/// The CPU backend's features, e.g. `["SSE3", "AVX", "AVX2", "F16C", "FMA", "OPENMP"]`, in
/// llama.cpp's order. Features with a value other than `1` keep it (`SVE_CNT=32`).
pub fn cpu_backend_features() -> Vec<String> {
    // The backend registry is filled when llama.cpp's backend is initialised.
    llama_backend();
    // SAFETY: llama_print_system_info takes no arguments and returns a pointer to a
    // NUL-terminated string owned by llama.cpp (a function-local static); it is copied out at once.
    let info = unsafe {
        let ptr = llama_cpp_sys_2::llama_print_system_info();
        if ptr.is_null() {
            return Vec::new();
        }
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    };
    parse_features(&info, "CPU")
}

/// Parses `llama_print_system_info()`'s `NAME : F = V | F = V | NAME2 : F = V | ` text and returns
/// the features of backend `backend` that are on.
fn parse_features(info: &str, backend: &str) -> Vec<String> {
    let mut current = String::new();
    let mut features = Vec::new();
    for item in info.split('|') {
        let mut item = item.trim();
        // A backend's name precedes its first feature: "CPU : SSE3 = 1".
        if let Some((name, rest)) = item.split_once(" : ") {
            current = name.trim().to_string();
            item = rest.trim();
        }
        if current != backend {
            continue;
        }
        let Some((name, value)) = item.split_once('=') else { continue };
        let (name, value) = (name.trim(), value.trim());
        match value {
            "" | "0" => {}
            "1" => features.push(name.to_string()),
            v => features.push(format!("{name}={v}")),
        }
    }
    features
}

/// llama.cpp's backend may be initialised once per process.
pub(crate) fn llama_backend() -> &'static LlamaBackend {
    static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        llama_cpp_2::send_logs_to_tracing(
            llama_cpp_2::LogOptions::default()
                .with_logs_enabled(std::env::var("GANTRY_LLAMA_LOGS").is_ok_and(|v| v == "1")),
        );
        // The portable build has no CPU backend linked in: one of its variants is loaded first.
        load_cpu_backend().unwrap_or_else(|e| panic!("{e}"));
        LlamaBackend::init().expect("llama.cpp backend initialises once")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_cpu_section_only() {
        let info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | SVE_CNT = 32 | OPENMP = 1 | \
                    BLAS : ACCELERATE = 1 | ";
        assert_eq!(parse_features(info, "CPU"), ["SSE3", "AVX", "AVX2", "SVE_CNT=32", "OPENMP"]);
        assert_eq!(parse_features(info, "BLAS"), ["ACCELERATE"]);
        assert!(parse_features("", "CPU").is_empty());
    }

    #[test]
    fn this_build_reports_its_cpu_features() {
        let features = cpu_backend_features();
        // Every x86-64 build of ggml has at least SSE3; other architectures report their own.
        assert!(!features.is_empty(), "llama.cpp reported no CPU backend features");
        #[cfg(target_arch = "x86_64")]
        assert!(features.iter().any(|f| f == "SSE3"), "{features:?}");
    }
}
