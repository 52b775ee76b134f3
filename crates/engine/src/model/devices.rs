//! GPU offload: which accelerators llama.cpp sees, and how a model is placed on them.
//!
//! The CPU build (the default) has no GPU backend compiled in: llama.cpp then lists only the
//! CPU and nothing is offloaded whatever the settings say. A build with the `cuda` feature
//! offloads every layer to the GPU by default (llama.cpp's `n_gpu_layers = -1`), the KV cache
//! with them, so continuous batching and the prefix cache run on the GPU unchanged.

use llama_cpp_2::model::params::{LlamaModelParams, LlamaSplitMode};
use llama_cpp_2::{list_llama_ggml_backend_devices, LlamaBackendDeviceType};

/// Where a model's layers go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload {
    /// Layers offloaded to the GPU; `None` = all of them when a GPU is present.
    pub gpu_layers: Option<u32>,
    /// The one GPU to use when several are present; `None` = llama.cpp splits layers across all.
    pub main_gpu: Option<u32>,
}

impl Offload {
    pub(crate) fn model_params(&self) -> LlamaModelParams {
        // llama.cpp's default (-1) offloads every layer that a GPU backend can take.
        let mut params = LlamaModelParams::default();
        if let Some(n) = self.gpu_layers {
            params = params.with_n_gpu_layers(n);
        }
        if let Some(gpu) = self.main_gpu {
            params = params.with_split_mode(LlamaSplitMode::None).with_main_gpu(gpu as i32);
        }
        params
    }
}

/// A GPU (or other accelerator) llama.cpp can offload to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accelerator {
    /// ggml's device name, e.g. `CUDA0`.
    pub name: String,
    /// What the driver calls it, e.g. `NVIDIA H100 80GB HBM3`.
    pub description: String,
    /// The ggml backend, e.g. `CUDA`.
    pub backend: String,
    pub memory_total: u64,
    pub memory_free: u64,
}

/// Whether this binary was built with a GPU backend (the `cuda` feature).
pub fn gpu_backend_compiled() -> bool {
    cfg!(feature = "cuda")
}

/// Whether layers may go to a GPU: this binary has a GPU backend, or the llama.cpp libraries
/// it loaded have one (a CPU build run on libraries built with CUDA, as the GPU bench's light
/// bundle does).
pub fn gpu_backend_present() -> bool {
    gpu_backend_compiled() || !accelerators().is_empty()
}

/// The accelerators llama.cpp found (none in a CPU build, or without a usable driver).
pub fn accelerators() -> Vec<Accelerator> {
    crate::model::backend::llama_backend();
    list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| !matches!(d.device_type, LlamaBackendDeviceType::Cpu))
        .map(|d| Accelerator {
            name: d.name,
            description: d.description,
            backend: d.backend,
            memory_total: d.memory_total as u64,
            memory_free: d.memory_free as u64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_settings_reach_llama_cpp() {
        let all = Offload::default().model_params();
        assert_eq!(all.n_gpu_layers(), -1, "every layer, where a GPU can take it");
        let some = Offload { gpu_layers: Some(12), main_gpu: Some(1) }.model_params();
        assert_eq!((some.n_gpu_layers(), some.main_gpu()), (12, 1));
        assert_eq!(Offload { gpu_layers: Some(0), main_gpu: None }.model_params().n_gpu_layers(), 0);
    }

    #[test]
    fn a_cpu_build_sees_no_accelerator() {
        if !gpu_backend_compiled() {
            assert_eq!(accelerators(), Vec::new());
        } else {
            // A GPU build on a machine without a driver also lists none; with one, each is named.
            assert!(accelerators().iter().all(|a| !a.name.is_empty() && a.memory_total > 0));
        }
    }
}
