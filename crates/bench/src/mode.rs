//! What differs between the CPU benchmark (`make bench`, issue #13) and the GPU one (`make bench
//! BENCH_GPU=1`, issue #18): default levels, targets, report files, and how the GPU is named.
//! Everything else (workloads, A-B-B-A alternation, tables) is the same code for both.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::targets::{Target, CPU_TARGETS, GPU_TARGETS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Both servers built native for this CPU (and optionally both portable AVX2).
    Cpu,
    /// Both servers built with llama.cpp's CUDA backend, every layer offloaded to the GPU.
    Gpu,
}

impl Mode {
    pub(crate) fn new(gpu: bool) -> Mode {
        if gpu {
            Mode::Gpu
        } else {
            Mode::Cpu
        }
    }

    /// Chat concurrency levels when `--concurrency` is not given. A GPU decodes a batch of 64
    /// sequences in little more time than one, so its levels go past the CPU's 16, where
    /// batching and scheduling are what tell the servers apart.
    pub(crate) fn default_concurrency(self) -> Vec<usize> {
        match self {
            Mode::Cpu => vec![1, 4, 8, 16],
            Mode::Gpu => vec![1, 4, 8, 16, 32, 64],
        }
    }

    /// Chat requests per level when `--requests` is not given (each level sends at least one per
    /// stream). On a GPU a level of 16 requests lasts a second or two: 64 makes the low levels
    /// long enough to measure and gives c=32 two requests per stream.
    pub(crate) fn default_requests(self) -> usize {
        match self {
            Mode::Cpu => 16,
            Mode::Gpu => 64,
        }
    }

    /// Levels of `chat-sampled` (issue #34): one stream, and the level where batching counts.
    pub(crate) fn default_sampled_concurrency(self) -> Vec<usize> {
        match self {
            Mode::Cpu => vec![1, 8],
            Mode::Gpu => vec![1, 64],
        }
    }

    /// Levels of `chat-top-p`: the batched one of `chat-sampled`.
    pub(crate) fn default_top_p_concurrency(self) -> Vec<usize> {
        match self {
            Mode::Cpu => vec![8],
            Mode::Gpu => vec![64],
        }
    }

    pub(crate) fn targets(self) -> &'static [Target] {
        match self {
            Mode::Cpu => &CPU_TARGETS,
            Mode::Gpu => &GPU_TARGETS,
        }
    }

    /// The issue whose targets the report checks.
    pub(crate) fn issue(self) -> &'static str {
        match self {
            Mode::Cpu => "issue #13",
            Mode::Gpu => "issue #18",
        }
    }

    /// The report's title.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Mode::Cpu => "Benchmarks: Gantry vs llama.cpp `llama-server`",
            Mode::Gpu => "GPU benchmarks: Gantry vs llama.cpp `llama-server`, both on CUDA",
        }
    }

    /// The command that regenerates the report, for its first line.
    pub(crate) fn make_command(self) -> &'static str {
        match self {
            Mode::Cpu => "make bench",
            Mode::Gpu => "make bench BENCH_GPU=1",
        }
    }

    /// Report and chart paths when `--out` / `--chart` are not given: the GPU report sits
    /// beside the CPU one and never overwrites it.
    pub(crate) fn default_outputs(self) -> (PathBuf, PathBuf) {
        match self {
            Mode::Cpu => ("docs/benchmarks.md".into(), "docs/bench-chart.svg".into()),
            Mode::Gpu => ("docs/benchmarks-gpu.md".into(), "docs/bench-chart-gpu.svg".into()),
        }
    }

    /// Rejects flags that make no sense in this mode, rather than silently measuring something
    /// else than asked.
    pub(crate) fn check(self, avx2_bins_given: bool) -> Result<()> {
        if self == Mode::Gpu && avx2_bins_given {
            bail!("--gantry-avx2-bin / --reference-avx2-bin compare CPU builds; leave them out with --gpu");
        }
        Ok(())
    }
}

/// One line per GPU from `nvidia-smi --query-gpu=name,memory.total,driver_version
/// --format=csv,noheader`, e.g. `GPU 0: NVIDIA H100 80GB HBM3, 81559 MiB, driver 580.159.04`.
pub(crate) fn describe_gpus(nvidia_smi_csv: &str) -> Vec<String> {
    nvidia_smi_csv
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(i, line)| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            match fields.as_slice() {
                [name, memory, driver] => format!("GPU {i}: {name}, {memory}, driver {driver}"),
                _ => format!("GPU {i}: {line}"),
            }
        })
        .collect()
}

/// The machine's GPUs as nvidia-smi names them, for the report; says so when it cannot.
pub(crate) fn gpu_summary() -> String {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let lines = describe_gpus(&String::from_utf8_lossy(&o.stdout));
            if lines.is_empty() {
                "GPU: none listed by nvidia-smi".into()
            } else {
                lines.join("\n")
            }
        }
        Ok(o) => format!("GPU: unknown (nvidia-smi failed: {})", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("GPU: unknown (no nvidia-smi: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_mode_goes_to_64_streams_and_its_own_report() {
        assert_eq!(Mode::new(false), Mode::Cpu);
        assert_eq!(Mode::new(true).default_concurrency(), vec![1, 4, 8, 16, 32, 64]);
        assert_eq!(Mode::Cpu.default_concurrency(), vec![1, 4, 8, 16]);
        assert_eq!(Mode::Gpu.default_requests(), 64);
        assert_eq!(Mode::Cpu.default_requests(), 16);
        assert_eq!(
            (Mode::Gpu.default_sampled_concurrency(), Mode::Gpu.default_top_p_concurrency()),
            (vec![1, 64], vec![64])
        );
        assert_eq!(
            (Mode::Cpu.default_sampled_concurrency(), Mode::Cpu.default_top_p_concurrency()),
            (vec![1, 8], vec![8])
        );
        let (md, svg) = Mode::Gpu.default_outputs();
        assert_eq!(md, PathBuf::from("docs/benchmarks-gpu.md"));
        assert_eq!(svg, PathBuf::from("docs/bench-chart-gpu.svg"));
        assert_eq!(Mode::Cpu.default_outputs().0, PathBuf::from("docs/benchmarks.md"));
        assert_eq!(Mode::Gpu.make_command(), "make bench BENCH_GPU=1");
    }

    #[test]
    fn gpu_mode_refuses_the_avx2_comparison() {
        assert!(Mode::Gpu.check(true).is_err());
        assert!(Mode::Gpu.check(false).is_ok());
        assert!(Mode::Cpu.check(true).is_ok());
    }

    #[test]
    fn each_mode_checks_its_own_issue_targets() {
        let names = |m: Mode| m.targets().iter().map(|t| (t.workload, t.concurrency, t.bound)).collect::<Vec<_>>();
        assert_eq!(
            names(Mode::Gpu),
            vec![("chat", 1, 1.0), ("chat", 32, 1.1), ("chat-sampled", 1, 1.2), ("chat-sampled", 64, 2.0)]
        );
        assert!(names(Mode::Cpu).contains(&("chat-sampled", 8, 1.1)));
        assert!(names(Mode::Cpu).contains(&("chat", 1, 1.05)));
        assert!(!names(Mode::Cpu).iter().any(|t| t.1 == 32));
    }

    #[test]
    fn nvidia_smi_lines_name_each_gpu() {
        let csv = "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n\nNVIDIA H200, 143771 MiB, 580.159.03\n";
        assert_eq!(
            describe_gpus(csv),
            vec![
                "GPU 0: NVIDIA H100 80GB HBM3, 81559 MiB, driver 580.159.04".to_string(),
                "GPU 1: NVIDIA H200, 143771 MiB, driver 580.159.03".to_string(),
            ]
        );
        assert_eq!(describe_gpus("odd output\n"), vec!["GPU 0: odd output".to_string()]);
        assert!(describe_gpus("  \n").is_empty());
    }
}
