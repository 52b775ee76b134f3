//! `gantry-bench`: streams chat completions against Gantry and a reference llama.cpp
//! `llama-server` on the same GGUF and reports both with Gantry/reference ratios (console,
//! docs/benchmarks.md, docs/bench-chart.svg; with `--gpu`, CUDA builds of both on the GPU,
//! docs/benchmarks-gpu.md and docs/bench-chart-gpu.svg).
//!
//! One comparison per pair of binaries: both built native for this CPU (the main table), and
//! optionally both portable AVX2 builds. Both servers of a pair stay up for the whole comparison
//! and are measured alternately level by level, the order flipping each pass (A-B-B-A), so drift on
//! the host (thermal, other work) weighs on both alike. Keeping them up rather than restarting them
//! per pass measures what a long-running server does, with the caches earlier levels left behind;
//! an idle server costs the other nothing but memory.

mod chart;
mod host;
mod load;
mod mode;
mod pairs;
mod plan;
mod report;
mod runs;
mod scopes;
mod servers;
mod stats;
mod step_profile;
mod targets;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use serde_json::json;

use host::{busy_share, loadavg, machine};
use load::{run_level, stream_request, Target};
use mode::Mode;
use pairs::{pairs, Bins, BuildNotes, Pair};
use plan::Plan;
use report::Comparison;
use runs::ServerRun;
use servers::{Kind, Running, ServerSettings};
use workloads::Request;

#[derive(Parser, Debug)]
#[command(name = "gantry-bench", about = "Gantry vs llama-server streaming benchmark")]
struct Cli {
    /// The GGUF both servers load.
    #[arg(long)]
    model: PathBuf,
    /// Compare CUDA builds on the GPU (`make bench BENCH_GPU=1`): --gantry-bin from `make
    /// build-gpu`, --reference-bin from `REFERENCE_CUDA=1 scripts/build-reference-llama-server.sh`;
    /// every layer offloaded, chat up to 64 streams, issue #18's targets, docs/benchmarks-gpu.md.
    #[arg(long)]
    gpu: bool,
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
    /// Workloads to run: chat, shared-prefix, code-edit, prose, extract, chat-sampled, chat-top-p,
    /// cache-scopes (Gantry only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "chat,shared-prefix,code-edit,prose,extract,chat-sampled,chat-top-p,cache-scopes"
    )]
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
    /// Concurrency levels of the chat workload [default: 1,4,8,16; with --gpu 1,4,8,16,32,64].
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Requests per chat concurrency level, at least the concurrency [default: 16; with --gpu 64].
    #[arg(long)]
    requests: Option<usize>,
    /// Approximate prompt length of the chat workload, in tokens.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Completion tokens asked for per chat and shared-prefix request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Temperature of the greedy workloads (the sampled ones and cache-scopes use 0.8).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Concurrency levels of chat-sampled (temperature 0.8) [default: 1,8; with --gpu 1,64].
    #[arg(long, value_delimiter = ',')]
    sampled_concurrency: Vec<usize>,
    /// Concurrency levels of chat-top-p (temperature 0.8, top_p 0.95) [default: 8; with --gpu 64].
    #[arg(long, value_delimiter = ',')]
    top_p_concurrency: Vec<usize>,
    /// Completion tokens asked for per chat-sampled and chat-top-p request.
    #[arg(long, default_value_t = 128)]
    sampled_max_tokens: u32,
    /// cache-scopes: approximate length of the system prompt every request shares.
    #[arg(long, default_value_t = 1000)]
    cache_scope_prefix_tokens: usize,
    #[arg(long, default_value_t = 2)]
    cache_scope_concurrency: usize,
    /// cache-scopes: requests per combination (tenants × scope) and pass.
    #[arg(long, default_value_t = 16)]
    cache_scope_requests: usize,
    #[arg(long, default_value_t = 32)]
    cache_scope_max_tokens: u32,
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
    /// The report [default: docs/benchmarks.md; with --gpu docs/benchmarks-gpu.md].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The chart [default: docs/bench-chart.svg; with --gpu docs/bench-chart-gpu.svg].
    #[arg(long)]
    chart: Option<PathBuf>,
    /// Also write the raw results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print the tables only; write no files.
    #[arg(long)]
    no_write: bool,
}

impl Cli {
    fn mode(&self) -> Mode {
        Mode::new(self.gpu)
    }

    fn concurrency(&self) -> Vec<usize> {
        if self.concurrency.is_empty() {
            self.mode().default_concurrency()
        } else {
            self.concurrency.clone()
        }
    }

    fn requests(&self) -> usize {
        self.requests.unwrap_or_else(|| self.mode().default_requests())
    }

    /// Report and chart paths.
    fn outputs(&self) -> (PathBuf, PathBuf) {
        let (out, chart) = self.mode().default_outputs();
        (self.out.clone().unwrap_or(out), self.chart.clone().unwrap_or(chart))
    }
}

struct Up {
    running: Running,
    target: Target,
    run: ServerRun,
    /// cache-scopes (Gantry only): the keys of each combination's tenants.
    scope_keys: Vec<(scopes::Tenancy, Vec<String>)>,
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
        api_keys: running.api_key.iter().cloned().collect(),
        model: running.model_id.clone(),
    };
    let hello =
        Request { temperature: cli.temperature, ..Request::greedy(json!([{"role": "user", "content": "Say hello."}])) };
    let warm = stream_request(&target, hello, 8).await;
    if let Some(e) = warm.error {
        let tail = running.log_tail();
        running.stop().await.ok();
        bail!("{} warm-up failed: {e}\n{tail}", kind.label());
    }
    let cpu_features = running.cpu_features().await;
    eprintln!("[bench] {} runs CPU kernels: {}", kind.label(), cpu_features.as_deref().unwrap_or("unknown"));
    let gpu_offload = if settings.gpu { Some(check_gpu_offload(&running, &settings.model).await?) } else { None };
    let run = ServerRun {
        name: kind.label().to_string(),
        version: running.version.clone(),
        command: running.command.clone(),
        cpu_features: cpu_features.unwrap_or_else(|| "unknown".into()),
        gpu_offload,
        load_before,
        levels: Vec::new(),
    };
    Ok(Up { running, target, run, scope_keys: Vec::new() })
}

/// GPU mode: what the server says of its offload. A Gantry that found no GPU (a CPU build, or
/// no usable driver) would make the comparison meaningless, so it stops the run; llama-server's
/// log is not ours to rely on, so a missing or partial offload there is written into the report
/// and warned about instead.
async fn check_gpu_offload(running: &Running, model: &Path) -> Result<String> {
    let offload = running.gpu_offload().await;
    let label = running.kind.label();
    let model_bytes = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
    if offload.complete(model_bytes) {
        return Ok(offload.describe());
    }
    if running.kind == Kind::Gantry {
        bail!(
            "Gantry reports no GPU ({}): is --gantry-bin the CUDA build (`make build-gpu`), and does it find the \
             driver, libcudart and libcublas (LD_LIBRARY_PATH)?\n{}",
            offload.describe(),
            running.log_tail()
        );
    }
    eprintln!(
        "[bench] warning: {label} may not run wholly on the GPU: {} (built with REFERENCE_CUDA=1?)",
        offload.describe()
    );
    Ok(format!("{}; NOT CONFIRMED on the GPU", offload.describe()))
}

async fn compare(
    pair: &Pair,
    cli: &Cli,
    settings: &ServerSettings,
    workloads: &Plan,
    warnings: &mut Vec<String>,
) -> Result<Comparison> {
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
            Ok(mut u) => {
                let tenancies = workloads.iter().filter_map(|(w, _)| w.tenancy.filter(|_| kind == Kind::Gantry));
                for tenancy in tenancies.collect::<Vec<_>>() {
                    match scopes::create_keys(&u.running, tenancy).await {
                        Ok(keys) => u.scope_keys.push((tenancy, keys)),
                        Err(e) => {
                            u.running.stop().await.ok();
                            for u in up {
                                u.running.stop().await.ok();
                            }
                            return Err(e.context("creating the cache-scopes keys"));
                        }
                    }
                }
                up.push(u)
            }
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
                let order: Vec<usize> =
                    if pass % 2 == 0 { (0..up.len()).collect() } else { (0..up.len()).rev().collect() };
                for i in order {
                    if workload.kind.gantry_only() && up[i].running.kind != Kind::Gantry {
                        continue;
                    }
                    let mut target = up[i].target.clone();
                    if let Some(tenancy) = workload.tenancy {
                        let keys = up[i].scope_keys.iter().find(|(t, _)| *t == tenancy).map(|(_, k)| k.clone());
                        target.api_keys = keys.unwrap_or_default();
                    }
                    let label = up[i].run.name.clone();
                    if let Some(busy) = busy_share(Duration::from_secs(1)).await {
                        if busy > 0.15 {
                            let w = format!(
                                "{label} {} c={concurrency} pass {pass}: {:.0}% of the CPU busy with other work just before",
                                workload.label(),
                                busy * 100.0
                            );
                            eprintln!("[bench] warning: {w}");
                            warnings.push(w);
                        }
                    }
                    eprintln!("[bench] pass {pass} {label} {} c={concurrency} n={requests} ...", workload.label());
                    let steps_before = up[i].running.step_profile().await;
                    let r = run_level(&target, workload, pass, concurrency, requests).await;
                    if let (Some(before), Some(after)) = (steps_before, up[i].running.step_profile().await) {
                        eprintln!("[bench]   Gantry's steps: {}", after.since(&before).describe());
                    }
                    eprintln!(
                        "[bench]   {:.1} tok/s ({} tokens; {} of {} prompt tokens cached), TTFT p50 {} ms, ITL p50 {} ms, {} failed{}",
                        r.tokens_per_s,
                        r.completion_tokens,
                        r.cached_tokens,
                        r.prompt_tokens,
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
    let mode = cli.mode();
    mode.check(cli.gantry_avx2_bin.is_some() || cli.reference_avx2_bin.is_some())?;
    let (out, chart) = cli.outputs();
    let mut kinds = Vec::new();
    for name in &cli.workloads {
        let Some(kind) = workloads::Kind::parse(name) else {
            let known: Vec<&str> = workloads::Kind::ALL.iter().map(|k| k.name()).collect();
            bail!("unknown workload {name:?} ({})", known.join(", "));
        };
        kinds.push(kind);
    }
    let plan = plan::build(&cli, &kinds);
    let max_c = plan::max_concurrency(&plan);
    let nproc = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let settings = ServerSettings {
        model: cli.model.canonicalize()?,
        threads: cli.threads.unwrap_or(nproc),
        parallel: cli.parallel.unwrap_or(max_c as u32),
        ctx_per_seq: cli.ctx_size,
        ready_timeout: Duration::from_secs(cli.ready_timeout),
        gpu: mode == Mode::Gpu,
    };
    let bins = Bins {
        gantry: cli.gantry_bin.clone(),
        reference: cli.reference_bin.clone(),
        gantry_avx2: cli.gantry_avx2_bin.clone(),
        reference_avx2: cli.reference_avx2_bin.clone(),
    };
    let pairs = pairs(mode, &bins, &BuildNotes::from_env());
    let mut comparisons = Vec::new();
    let mut warnings = Vec::new();
    for (n, pair) in pairs.iter().enumerate() {
        // Gantry-only workloads describe Gantry, not a pair of builds: the first pair measures them.
        let pair_plan: Plan = plan.iter().filter(|(w, _)| n == 0 || !w.kind.gantry_only()).cloned().collect();
        let c = compare(pair, &cli, &settings, &pair_plan, &mut warnings)
            .await
            .with_context(|| format!("comparison {:?}", pair.title))?;
        println!("\n## {}\n\n{}\n", c.title, c.kernels);
        for r in &c.runs {
            println!("{} CPU kernels: {}", r.name, r.cpu_features);
            if let Some(gpu) = &r.gpu_offload {
                println!("{} GPU offload: {gpu}", r.name);
            }
        }
        println!("\nResults (means over {} passes)\n\n{}", cli.passes, report::results_table(&c.runs));
        println!(
            "Gantry / llama-server (tok/s: higher is better; TTFT, ITL: lower is better)\n\n{}",
            report::ratio_table(&c.runs)
        );
        if let Some(t) = scopes::cache_scope_table(&c.runs) {
            println!("Cost of per-tenant cache scopes (Gantry only)\n\n{t}");
        }
        comparisons.push(c);
    }
    let machine = machine(mode == Mode::Gpu);
    println!("{machine}\n");
    if let Some(first) = comparisons.first() {
        println!(
            "Targets ({}, {})\n\n{}",
            mode.issue(),
            first.title,
            targets::targets_table(&first.runs, mode.targets())
        );
    }
    if cli.no_write {
        return Ok(());
    }
    let model_size = std::fs::metadata(&settings.model).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
    let chart_ref = match (chart.parent(), out.parent()) {
        (Some(a), Some(b)) if a == b => chart.file_name().unwrap().to_string_lossy().into_owned(),
        _ => chart.display().to_string(),
    };
    let mut reference_builds = Vec::new();
    for (pair, bin) in pairs.iter().map(|p| (p, p.reference.as_ref())) {
        if let Some(info) = build_info(bin) {
            reference_builds.push((pair.title.clone(), info));
        }
    }
    let ctx = report::Context {
        mode,
        date: report::utc_now(),
        machine,
        bench_command: std::env::args()
            .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
            .collect::<Vec<_>>()
            .join(" "),
        settings: plan::describe(&cli, &settings, model_size),
        chart_file: chart_ref,
        reference_builds,
        quiet_warnings: warnings,
    };
    for p in [&out, &chart] {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
    }
    std::fs::write(&out, report::markdown(&comparisons, &ctx))?;
    let chart_runs = comparisons.first().map(|c| report::merged_runs(&c.runs)).unwrap_or_default();
    std::fs::write(&chart, chart::svg(&chart_runs, "chat"))?;
    if let Some(j) = &cli.json {
        std::fs::write(j, serde_json::to_string_pretty(&comparisons)?)?;
    }
    eprintln!("[bench] wrote {} and {}", out.display(), chart.display());
    Ok(())
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
