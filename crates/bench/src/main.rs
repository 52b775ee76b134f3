//! `gantry-bench`: streams chat completions at several concurrency levels against Gantry and a
//! reference llama.cpp `llama-server` on the same GGUF, one server at a time, and reports both
//! with Gantry/reference ratios (console, docs/benchmarks.md, docs/bench-chart.svg).

mod load;
mod report;
mod servers;
mod stats;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use serde_json::json;

use load::{run_level, stream_request, Target, Workload};
use report::{ServerRun, GANTRY, REFERENCE};
use servers::{Kind, ServerSettings};

#[derive(Parser, Debug)]
#[command(name = "gantry-bench", about = "Gantry vs llama-server streaming benchmark")]
struct Cli {
    /// The GGUF both servers load.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "target/release/gantry")]
    gantry_bin: PathBuf,
    /// A llama-server built from source (scripts/build-reference-llama-server.sh prints one).
    #[arg(long)]
    reference_bin: Option<PathBuf>,
    /// Which servers to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "gantry,reference")]
    servers: Vec<String>,
    /// Threads for both servers (default: nproc).
    #[arg(long)]
    threads: Option<u32>,
    /// Parallel sequences/slots for both servers (default: the highest concurrency).
    #[arg(long)]
    parallel: Option<u32>,
    /// Context per sequence (llama-server gets this × parallel in total).
    #[arg(long, default_value_t = 2048)]
    ctx_size: u32,
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    concurrency: Vec<usize>,
    /// Requests per concurrency level (at least the concurrency).
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Approximate prompt length of the plain workload, in tokens.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Completion tokens asked for per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Approximate length of the shared system prompt; 0 skips the shared-prefix workload.
    #[arg(long, default_value_t = 1500)]
    shared_prefix_tokens: usize,
    #[arg(long, default_value_t = 8)]
    shared_prefix_concurrency: usize,
    /// Requests of the shared-prefix workload. The default, one per stream, measures a cold
    /// burst: every request arrives before the shared system prompt has been computed once.
    #[arg(long, default_value_t = 8)]
    shared_prefix_requests: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Seconds to wait for a server to load the model and accept requests.
    #[arg(long, default_value_t = 300)]
    ready_timeout: u64,
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    #[arg(long, default_value = "docs/bench-chart.svg")]
    chart: PathBuf,
    /// Also write the raw results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print the tables only; write no files.
    #[arg(long)]
    no_write: bool,
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find(|l| l.starts_with(name)).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string())
    };
    let processors = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let wanted = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd"];
    let all = field("flags").or_else(|| field("Features")).unwrap_or_default();
    let flags: Vec<&str> = all.split_whitespace().filter(|x| wanted.contains(x)).collect();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal")).map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string()))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "CPU: {} ({processors} processors in /proc/cpuinfo, nproc = {nproc})\nCPU flags: {}\nMemory: {mem}\nKernel: Linux {}\nArch: {}",
        field("model name").unwrap_or_else(|| "unknown".into()),
        flags.join(" "),
        kernel.trim(),
        std::env::consts::ARCH
    )
}

fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

async fn bench_server(kind: Kind, bin: &Path, cli: &Cli, settings: &ServerSettings, workloads: &[(Workload, Vec<(usize, usize)>)]) -> Result<ServerRun> {
    let load_before = loadavg();
    let busy = load_before.split(' ').next().and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    if busy > 0.5 * settings.threads as f64 {
        eprintln!("[bench] warning: load average {load_before} before starting {}; other work skews the results", kind.label());
    }
    let running = servers::start(kind, bin, settings).await?;
    // No connection reuse: llama-server (cpp-httplib) closes idle keep-alive connections, and a
    // request racing that close fails. A fresh localhost connection per request costs both the same.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(900)).pool_max_idle_per_host(0).build()?;
    let target = Target {
        client,
        base_url: running.base_url.clone(),
        api_key: running.api_key.clone(),
        model: running.model_id.clone(),
        temperature: cli.temperature,
    };
    let warm = stream_request(&target, json!([{"role": "user", "content": "Say hello."}]), 8).await;
    if let Some(e) = warm.error {
        let tail = running.log_tail();
        running.stop().await.ok();
        bail!("{} warm-up failed: {e}\n{tail}", kind.label());
    }
    let mut levels = Vec::new();
    for (workload, plan) in workloads {
        for &(concurrency, requests) in plan {
            eprintln!("[bench] {} {} c={concurrency} n={requests} ...", kind.label(), workload.name);
            let r = run_level(&target, workload, concurrency, requests).await;
            eprintln!(
                "[bench]   {:.1} tok/s, {:.2} req/s, TTFT p50 {} ms, ITL p50 {} ms, {} failed{}",
                r.tokens_per_s,
                r.requests_per_s,
                r.ttft_p50_ms.map(|v| format!("{v:.0}")).unwrap_or("n/a".into()),
                r.itl_p50_ms.map(|v| format!("{v:.1}")).unwrap_or("n/a".into()),
                r.failed,
                r.first_error.as_ref().map(|e| format!(" (first: {e})")).unwrap_or_default()
            );
            levels.push(r);
        }
    }
    let run = ServerRun {
        name: kind.label().to_string(),
        version: running.version.clone(),
        command: running.command.clone(),
        load_before,
        levels,
    };
    running.stop().await?;
    Ok(run)
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    if !cli.model.is_file() {
        bail!("model {} not found (try `gantry models pull`)", cli.model.display());
    }
    let max_c = cli.concurrency.iter().copied().chain([cli.shared_prefix_concurrency]).max().unwrap_or(1);
    let nproc = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let settings = ServerSettings {
        model: cli.model.canonicalize()?,
        threads: cli.threads.unwrap_or(nproc),
        parallel: cli.parallel.unwrap_or(max_c as u32),
        ctx_per_seq: cli.ctx_size,
        ready_timeout: Duration::from_secs(cli.ready_timeout),
    };
    let chat = Workload { name: "chat".into(), prompt_tokens: cli.prompt_tokens, shared_prefix_tokens: 0, max_tokens: cli.max_tokens, seed: cli.seed };
    let mut workloads = vec![(chat, cli.concurrency.iter().map(|&c| (c, cli.requests.max(c))).collect::<Vec<_>>())];
    if cli.shared_prefix_tokens > 0 {
        let w = Workload { name: "shared-prefix".into(), shared_prefix_tokens: cli.shared_prefix_tokens, ..workloads[0].0.clone() };
        let c = cli.shared_prefix_concurrency;
        workloads.push((w, vec![(c, cli.shared_prefix_requests.max(c))]));
    }

    let mut runs = Vec::new();
    for (i, name) in cli.servers.iter().enumerate() {
        let (kind, bin) = match name.as_str() {
            "gantry" => (Kind::Gantry, cli.gantry_bin.clone()),
            "reference" | "llama-server" => {
                let Some(bin) = cli.reference_bin.clone() else {
                    eprintln!("[bench] no --reference-bin; skipping llama-server (scripts/build-reference-llama-server.sh builds one)");
                    continue;
                };
                (Kind::Reference, bin)
            }
            other => bail!("unknown server {other:?} (gantry, reference)"),
        };
        if !bin.is_file() {
            bail!("{} binary {} not found", kind.label(), bin.display());
        }
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(3)).await; // let the previous server's memory go
        }
        runs.push(bench_server(kind, &bin, &cli, &settings, &workloads).await.with_context(|| format!("benchmarking {}", kind.label()))?);
    }
    debug_assert!(runs.iter().all(|r| r.name == GANTRY || r.name == REFERENCE));

    println!("\nResults\n\n{}", report::results_table(&runs));
    println!("Gantry / llama-server (tok/s, req/s: higher is better; TTFT, ITL: lower is better)\n\n{}", report::ratio_table(&runs));
    if cli.no_write {
        return Ok(());
    }
    let model_size = std::fs::metadata(&settings.model).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
    let chart_ref = match (cli.chart.parent(), cli.out.parent()) {
        (Some(a), Some(b)) if a == b => cli.chart.file_name().unwrap().to_string_lossy().into_owned(),
        _ => cli.chart.display().to_string(),
    };
    let ctx = report::Context {
        date: report::utc_now(),
        machine: machine(),
        bench_command: std::env::args().map(|a| if a.contains(' ') { format!("'{a}'") } else { a }).collect::<Vec<_>>().join(" "),
        settings: format!(
            "- Model: `{}` ({model_size:.0} MB)\n- Threads: {}, parallel sequences/slots: {}, context per sequence: {} (llama-server `-c {}`)\n\
             - Workload `chat`: ~{} prompt tokens (distinct per request), max_tokens {}, temperature {}, concurrency {:?}, {} requests per level (closed loop)\n\
             - Workload `shared-prefix`: one shared ~{}-token system prompt + a short distinct user turn, concurrency {}, {} requests\n\
             - Each server is warmed up with one short request before measuring; servers run one at a time.\n\
             - Kernels: Gantry links llama.cpp through the `llama-cpp-sys-2` crate, built with `GGML_NATIVE=OFF` \
             (AVX/AVX2/FMA/F16C, no AVX-512); the reference is built from source with the same CPU flags by default \
             (`REFERENCE_NATIVE=1` builds it with `-march=native`). The two llama.cpp revisions differ.",
            settings.model.display(), settings.threads, settings.parallel, settings.ctx_per_seq, settings.ctx_per_seq * settings.parallel,
            cli.prompt_tokens, cli.max_tokens, cli.temperature, cli.concurrency, cli.requests,
            cli.shared_prefix_tokens, cli.shared_prefix_concurrency, cli.shared_prefix_requests,
        ),
        chart_file: chart_ref,
        reference_build: cli
            .reference_bin
            .as_ref()
            .filter(|_| runs.iter().any(|r| r.name == REFERENCE))
            .and_then(|b| std::fs::read_to_string(b.with_file_name("BUILD_INFO")).ok()),
    };
    for p in [&cli.out, &cli.chart] {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
    }
    std::fs::write(&cli.out, report::markdown(&runs, &ctx))?;
    std::fs::write(&cli.chart, report::svg(&runs, "chat"))?;
    if let Some(j) = &cli.json {
        std::fs::write(j, serde_json::to_string_pretty(&runs)?)?;
    }
    eprintln!("[bench] wrote {} and {}", cli.out.display(), cli.chart.display());
    Ok(())
}
