//! The host the benchmark runs on: what it is (CPU, memory, GPUs) and whether other work keeps
//! it busy while measuring.

use std::time::Duration;

use crate::mode::gpu_summary;

/// CPU, memory, kernel, and with `gpus` what nvidia-smi says of the GPUs.
pub(crate) fn machine(gpus: bool) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find(|l| l.starts_with(name)).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string())
    };
    let processors = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let wanted = [
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx_vnni",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vbmi",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "neon",
        "asimd",
    ];
    let all = field("flags").or_else(|| field("Features")).unwrap_or_default();
    let flags: Vec<&str> = all.split_whitespace().filter(|x| wanted.contains(x)).collect();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let gpu = if gpus { format!("\n{}", gpu_summary()) } else { String::new() };
    format!(
        "CPU: {} (family {}, model {}; {processors} processors in /proc/cpuinfo, nproc = {nproc})\nCPU flags: {}\nMemory: {mem}\nKernel: Linux {}\nArch: {}{gpu}",
        field("model name").unwrap_or_else(|| "unknown".into()),
        field("cpu family").unwrap_or_else(|| "?".into()),
        cpuinfo.lines().find(|l| l.split(':').next().map(str::trim) == Some("model")).and_then(|l| l.split(':').nth(1)).map_or("?", str::trim),
        flags.join(" "),
        kernel.trim(),
        std::env::consts::ARCH
    )
}

pub(crate) fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// (busy, total) jiffies of all CPUs from /proc/stat.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Share of the machine's CPU time that was busy over `window` while both servers sit idle:
/// anything above a few percent is other work competing with the measurement.
pub(crate) async fn busy_share(window: Duration) -> Option<f64> {
    let (b0, t0) = cpu_jiffies()?;
    tokio::time::sleep(window).await;
    let (b1, t1) = cpu_jiffies()?;
    (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
}
