//! `gantry-bench`: streams chat completions against Gantry and a reference llama.cpp
//! `llama-server` on the same GGUF and reports both with Gantry/reference ratios (console,
//! docs/benchmarks.md, docs/bench-chart.svg).
//!
//! One comparison per pair of binaries: both built native for this CPU (the main table), and
//! optionally both portable AVX2 builds. Both servers of a pair stay up for the whole comparison
//! and are measured alternately level by level, the order flipping each pass (A-B-B-A), so drift on
//! the host (thermal, other work) weighs on both alike. Keeping them up rather than restarting them
//! per pass measures what a long-running server does, with the caches earlier levels left behind;
//! an idle server costs the other nothing but memory.

mod load;
mod report;
mod servers;
mod stats;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use serde_json::json;

use load::{run_level, stream_request, Target};
use report::{Comparison, ServerRun};
use servers::{Kind, Running, ServerSettings};
use workloads::{Request, Workload};

#[derive(Parser, Debug)]
#[command(name = "gantry-bench", about = "Gantry vs llama-server streaming benchmark")]
struct Cli {
    /// The GGUF both servers load.
    #[arg(long)]
    model: PathBuf,
    /// Gantry built native for this CPU (`make build`).
    #[arg(long, default_value = "target/release/gantry")]
    gantry_bin: PathBuf,
    /// llama-server built native for this CPU (scripts/build-reference-llama-server.sh prints one).
    #[arg(long)]
    reference_bin: Option<PathBuf>,
    /// Gantry built for portable AVX2 (no target-cpu): the second, AVX2-vs-AVX2 comparison.
    #[arg(long)]
    gantry_avx2_bin: Option<PathBuf>,
    /// llama-server built for portable AVX2 (REFERENCE_NATIVE=0).
    #[arg(long)]
    reference_avx2_bin: Option<PathBuf>,
    /// Which servers to run.
    #[arg(long, value_delimiter = ',', default_value = "gantry,reference")]
    servers: Vec<String>,
    /// Workloads to run: chat, shared-prefix, code-edit, prose, extract.
    #[arg(long, value_delimiter = ',', default_value = "chat,shared-prefix,code-edit,prose,extract")]
    workloads: Vec<String>,
    /// Passes over all workloads; the server order flips every pass (2 passes = A-B-B-A).
    #[arg(long, default_value_t = 2)]
    passes: usize,
    /// Threads for both servers (default: nproc).
    #[arg(long)]
    threads: Option<u32>,
    /// Parallel sequences/slots for both servers (default: the highest concurrency).
    #[arg(long)]
    parallel: Option<u32>,
    /// Context per sequence (llama-server gets this × parallel in total): code-edit needs its
    /// ~950-token file plus 1200 completion tokens.
    #[arg(long, default_value_t = 4096)]
    ctx_size: u32,
    /// Concurrency levels of the chat workload.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    concurrency: Vec<usize>,
    /// Requests per chat concurrency level (at least the concurrency).
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Approximate prompt length of the chat workload, in tokens.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Completion tokens asked for per chat and shared-prefix request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Approximate length of the shared system prompt.
    #[arg(long, default_value_t = 1500)]
    shared_prefix_tokens: usize,
    #[arg(long, default_value_t = 8)]
    shared_prefix_concurrency: usize,
    /// Requests of the shared-prefix workload. The default, one per stream, measures a cold
    /// burst: every request arrives before the shared system prompt has been computed once.
    #[arg(long, default_value_t = 8)]
    shared_prefix_requests: usize,
    /// Requests of the single-stream code-edit workload (each answers a whole file).
    #[arg(long, default_value_t = 4)]
    code_edit_requests: usize,
    /// Enough for the longest file of the code-edit workload and its change.
    #[arg(long, default_value_t = 1200)]
    code_edit_max_tokens: u32,
    #[arg(long, default_value_t = 4)]
    prose_requests: usize,
    #[arg(long, default_value_t = 256)]
    prose_max_tokens: u32,
    #[arg(long, default_value_t = 8)]
    extract_requests: usize,
    #[arg(long, default_value_t = 256)]
    extract_max_tokens: u32,
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
    let wanted = [
        "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vbmi", "avx512_vnni",
        "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd",
    ];
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
        "CPU: {} (family {}, model {}; {processors} processors in /proc/cpuinfo, nproc = {nproc})\nCPU flags: {}\nMemory: {mem}\nKernel: Linux {}\nArch: {}",
        field("model name").unwrap_or_else(|| "unknown".into()),
        field("cpu family").unwrap_or_else(|| "?".into()),
        cpuinfo.lines().find(|l| l.split(':').next().map(str::trim) == Some("model")).and_then(|l| l.split(':').nth(1)).map_or("?", str::trim),
        flags.join(" "),
        kernel.trim(),
        std::env::consts::ARCH
    )
}

fn loadavg() -> String {
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
async fn busy_share(window: Duration) -> Option<f64> {
    let (b0, t0) = cpu_jiffies()?;
    tokio::time::sleep(window).await;
    let (b1, t1) = cpu_jiffies()?;
    (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
}

/// A pair of binaries to compare.
struct Pair {
    title: String,
    kernels: String,
    gantry: Option<PathBuf>,
    reference: Option<PathBuf>,
}

struct Up {
    running: Running,
    target: Target,
    run: ServerRun,
}

async fn start_server(kind: Kind, bin: &Path, cli: &Cli, settings: &ServerSettings) -> Result<Up> {
    if !bin.is_file() {
        bail!("{} binary {} not found", kind.label(), bin.display());
    }
    let load_before = loadavg();
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
    let hello = Request { messages: json!([{"role": "user", "content": "Say hello."}]), response_format: None };
    let warm = stream_request(&target, hello, 8).await;
    if let Some(e) = warm.error {
        let tail = running.log_tail();
        running.stop().await.ok();
        bail!("{} warm-up failed: {e}\n{tail}", kind.label());
    }
    let cpu_features = running.cpu_features().await;
    eprintln!("[bench] {} runs CPU kernels: {}", kind.label(), cpu_features.as_deref().unwrap_or("unknown"));
    let run = ServerRun {
        name: kind.label().to_string(),
        version: running.version.clone(),
        command: running.command.clone(),
        cpu_features: cpu_features.unwrap_or_else(|| "unknown".into()),
        load_before,
        levels: Vec::new(),
    };
    Ok(Up { running, target, run })
}

async fn compare(pair: &Pair, cli: &Cli, settings: &ServerSettings, workloads: &[(Workload, Vec<(usize, usize)>)], warnings: &mut Vec<String>) -> Result<Comparison> {
    eprintln!("[bench] == {} ==", pair.title);
    let mut up: Vec<Up> = Vec::new();
    for name in &cli.servers {
        let (kind, bin) = match name.as_str() {
            "gantry" => (Kind::Gantry, pair.gantry.as_ref()),
            "reference" | "llama-server" => (Kind::Reference, pair.reference.as_ref()),
            other => bail!("unknown server {other:?} (gantry, reference)"),
        };
        let Some(bin) = bin else {
            eprintln!("[bench] no {} binary for {}; skipping it", kind.label(), pair.title);
            continue;
        };
        match start_server(kind, bin, cli, settings).await {
            Ok(u) => up.push(u),
            Err(e) => {
                for u in up {
                    u.running.stop().await.ok();
                }
                return Err(e.context(format!("starting {}", kind.label())));
            }
        }
    }
    for pass in 0..cli.passes {
        for (workload, plan) in workloads {
            for &(concurrency, requests) in plan {
                // A-B-B-A: the first server first on even passes, last on odd ones.
                let order: Vec<usize> = if pass % 2 == 0 { (0..up.len()).collect() } else { (0..up.len()).rev().collect() };
                for i in order {
                    let label = up[i].run.name.clone();
                    if let Some(busy) = busy_share(Duration::from_secs(1)).await {
                        if busy > 0.15 {
                            let w = format!(
                                "{label} {} c={concurrency} pass {pass}: {:.0}% of the CPU busy with other work just before",
                                workload.kind.name(),
                                busy * 100.0
                            );
                            eprintln!("[bench] warning: {w}");
                            warnings.push(w);
                        }
                    }
                    eprintln!("[bench] pass {pass} {label} {} c={concurrency} n={requests} ...", workload.kind.name());
                    let r = run_level(&up[i].target, workload, pass, concurrency, requests).await;
                    eprintln!(
                        "[bench]   {:.1} tok/s, TTFT p50 {} ms, ITL p50 {} ms, {} failed{}",
                        r.tokens_per_s,
                        r.ttft_p50_ms.map(|v| format!("{v:.0}")).unwrap_or("n/a".into()),
                        r.itl_p50_ms.map(|v| format!("{v:.1}")).unwrap_or("n/a".into()),
                        r.failed,
                        r.first_error.as_ref().map(|e| format!(" (first: {e})")).unwrap_or_default()
                    );
                    up[i].run.levels.push(r);
                }
            }
        }
    }
    let mut runs = Vec::new();
    for u in up {
        u.running.stop().await?;
        runs.push(u.run);
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // let the servers' memory go
    Ok(Comparison { title: pair.title.clone(), kernels: pair.kernels.clone(), runs })
}

fn build_info(bin: Option<&PathBuf>) -> Option<String> {
    std::fs::read_to_string(bin?.with_file_name("BUILD_INFO")).ok()
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    if !cli.model.is_file() {
        bail!("model {} not found (try `gantry models pull`)", cli.model.display());
    }
    if cli.passes == 0 {
        bail!("--passes must be at least 1");
    }
    let mut kinds = Vec::new();
    for name in &cli.workloads {
        let Some(kind) = workloads::Kind::parse(name) else {
            bail!("unknown workload {name:?} (chat, shared-prefix, code-edit, prose, extract)");
        };
        kinds.push(kind);
    }
    let wants = |k: workloads::Kind| kinds.contains(&k);
    let max_c = cli
        .concurrency
        .iter()
        .copied()
        .filter(|_| wants(workloads::Kind::Chat))
        .chain(wants(workloads::Kind::SharedPrefix).then_some(cli.shared_prefix_concurrency))
        .max()
        .unwrap_or(1);
    let nproc = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let settings = ServerSettings {
        model: cli.model.canonicalize()?,
        threads: cli.threads.unwrap_or(nproc),
        parallel: cli.parallel.unwrap_or(max_c as u32),
        ctx_per_seq: cli.ctx_size,
        ready_timeout: Duration::from_secs(cli.ready_timeout),
    };
    let base = Workload {
        kind: workloads::Kind::Chat,
        prompt_tokens: cli.prompt_tokens,
        shared_prefix_tokens: cli.shared_prefix_tokens,
        max_tokens: cli.max_tokens,
        seed: cli.seed,
    };
    let mut plan: Vec<(Workload, Vec<(usize, usize)>)> = Vec::new();
    for &kind in &kinds {
        let w = Workload { kind, ..base.clone() };
        let levels = match kind {
            workloads::Kind::Chat => cli.concurrency.iter().map(|&c| (c, cli.requests.max(c))).collect(),
            workloads::Kind::SharedPrefix => {
                let c = cli.shared_prefix_concurrency;
                vec![(c, cli.shared_prefix_requests.max(c))]
            }
            workloads::Kind::CodeEdit => vec![(1, cli.code_edit_requests.max(1))],
            workloads::Kind::Prose => vec![(1, cli.prose_requests.max(1))],
            workloads::Kind::Extract => vec![(1, cli.extract_requests.max(1))],
        };
        let max_tokens = match kind {
            workloads::Kind::CodeEdit => cli.code_edit_max_tokens,
            workloads::Kind::Prose => cli.prose_max_tokens,
            workloads::Kind::Extract => cli.extract_max_tokens,
            _ => cli.max_tokens,
        };
        plan.push((Workload { max_tokens, ..w }, levels));
    }

    let native_flags = std::env::var("GANTRY_NATIVE_CFLAGS").unwrap_or_default();
    let mut pairs = vec![Pair {
        title: "Both native for this CPU".into(),
        kernels: format!(
            "Gantry: `make build` (`RUSTFLAGS=-C target-cpu=native`, so `llama-cpp-sys-2` builds ggml with \
             `GGML_NATIVE=ON`); llama-server: `GGML_NATIVE=ON`, as llama.cpp builds by default. Extra C/C++ flags for \
             both from `scripts/native-build-flags.sh`: {}.",
            if native_flags.trim().is_empty() { "none".to_string() } else { format!("`{}`", native_flags.trim()) }
        ),
        gantry: Some(cli.gantry_bin.clone()),
        reference: cli.reference_bin.clone(),
    }];
    if cli.gantry_avx2_bin.is_some() || cli.reference_avx2_bin.is_some() {
        pairs.push(Pair {
            title: "Both portable AVX2".into(),
            kernels: "Gantry: a release build without `target-cpu` (`llama-cpp-sys-2`'s default: `GGML_NATIVE=OFF`, \
                      AVX/AVX2/FMA/F16C/BMI2, no AVX-512); llama-server: `REFERENCE_NATIVE=0`, the same CPU flags."
                .into(),
            gantry: cli.gantry_avx2_bin.clone(),
            reference: cli.reference_avx2_bin.clone(),
        });
    }
    let mut comparisons = Vec::new();
    let mut warnings = Vec::new();
    for pair in &pairs {
        let c = compare(pair, &cli, &settings, &plan, &mut warnings).await.with_context(|| format!("comparison {:?}", pair.title))?;
        println!("\n## {}\n\n{}\n", c.title, c.kernels);
        for r in &c.runs {
            println!("{} CPU kernels: {}", r.name, r.cpu_features);
        }
        println!("\nResults (means over {} passes)\n\n{}", cli.passes, report::results_table(&c.runs));
        println!("Gantry / llama-server (tok/s: higher is better; TTFT, ITL: lower is better)\n\n{}", report::ratio_table(&c.runs));
        comparisons.push(c);
    }
    let machine = machine();
    println!("{machine}\n");
    if let Some(first) = comparisons.first() {
        println!("Targets (issue #13, {})\n\n{}", first.title, report::targets_table(&first.runs));
    }
    if cli.no_write {
        return Ok(());
    }
    let model_size = std::fs::metadata(&settings.model).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
    let chart_ref = match (cli.chart.parent(), cli.out.parent()) {
        (Some(a), Some(b)) if a == b => cli.chart.file_name().unwrap().to_string_lossy().into_owned(),
        _ => cli.chart.display().to_string(),
    };
    let mut reference_builds = Vec::new();
    for (pair, bin) in pairs.iter().map(|p| (p, p.reference.as_ref())) {
        if let Some(info) = build_info(bin) {
            reference_builds.push((pair.title.clone(), info));
        }
    }
    let ctx = report::Context {
        date: report::utc_now(),
        machine,
        bench_command: std::env::args().map(|a| if a.contains(' ') { format!("'{a}'") } else { a }).collect::<Vec<_>>().join(" "),
        settings: format!(
            "- Model: `{}` ({model_size:.0} MB)\n- Threads: {}, parallel sequences/slots: {}, context per sequence: {} (llama-server `-c {}`)\n\
             - Passes: {} (server order flipped every pass), temperature {}\n\
             - Workload `chat`: ~{} prompt tokens (distinct per request), max_tokens {}, concurrency {:?}, {} requests per level (closed loop)\n\
             - Workload `shared-prefix`: one shared ~{}-token system prompt + a short distinct user turn, concurrency {}, {} requests (a cold burst)\n\
             - Workload `code-edit`: a 95–100 line Python or Rust file and one small change (rename, new parameter), the whole file asked back; single stream, {} requests, max_tokens {}\n\
             - Workload `prose`: open-ended essay; single stream, {} requests, max_tokens {}\n\
             - Workload `extract`: a paragraph → `response_format` `json_schema` with 9 required keys (same schema for both); single stream, {} requests, max_tokens {}\n\
             - Each server is warmed up with one short request after it starts. The two llama.cpp revisions differ.",
            settings.model.display(), settings.threads, settings.parallel, settings.ctx_per_seq, settings.ctx_per_seq * settings.parallel,
            cli.passes, cli.temperature,
            cli.prompt_tokens, cli.max_tokens, cli.concurrency, cli.requests,
            cli.shared_prefix_tokens, cli.shared_prefix_concurrency, cli.shared_prefix_requests,
            cli.code_edit_requests, cli.code_edit_max_tokens, cli.prose_requests, cli.prose_max_tokens,
            cli.extract_requests, cli.extract_max_tokens,
        ),
        chart_file: chart_ref,
        reference_builds,
        quiet_warnings: warnings,
    };
    for p in [&cli.out, &cli.chart] {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
    }
    std::fs::write(&cli.out, report::markdown(&comparisons, &ctx))?;
    let chart_runs = comparisons.first().map(|c| report::merged_runs(&c.runs)).unwrap_or_default();
    std::fs::write(&cli.chart, report::svg(&chart_runs, "chat"))?;
    if let Some(j) = &cli.json {
        std::fs::write(j, serde_json::to_string_pretty(&comparisons)?)?;
    }
    eprintln!("[bench] wrote {} and {}", cli.out.display(), cli.chart.display());
    Ok(())
}
