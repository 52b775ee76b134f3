//! `gantry-bench`: streams chat completions against Gantry and a reference llama.cpp
//! `llama-server` on the same GGUF, started twice: as `make bench` always started it, and tuned
//! as an expert would run it (n-gram speculation, flash attention; `--no-tuned-reference` leaves
//! that one out). It reports all with Gantry's ratio against each reference (console,
//! docs/benchmarks.md, docs/bench-chart.svg; with `--gpu`, CUDA builds of both on the GPU,
//! docs/benchmarks-gpu.md and docs/bench-chart-gpu.svg).
//!
//! One comparison per pair of binaries: both built native for this CPU (the main table), and
//! optionally both portable AVX2 builds. Every server of a pair stays up for the whole comparison
//! and are measured alternately level by level, the order flipping each pass (A-B-B-A), so drift on
//! the host (thermal, other work) weighs on both alike. Keeping them up rather than restarting them
//! per pass measures what a long-running server does, with the caches earlier levels left behind;
//! an idle server costs the other nothing but memory.

mod bandwidth;
mod chart;
mod cli;
mod compare;
mod embeddings;
mod gguf_weights;
mod host;
mod interference;
mod load;
mod matrix;
mod mode;
mod pairs;
mod plan;
mod references;
mod report;
mod runs;
mod scopes;
mod server_args;
mod servers;
mod sharing;
mod stats;
mod step_profile;
mod targets;
mod traffic;
mod traffic_report;
mod workloads;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;

use cli::Cli;
use compare::compare;
use host::machine;
use mode::Mode;
use pairs::{pairs, Bins, BuildNotes};
use plan::Plan;
use servers::ServerSettings;

/// On the CPU, the memory read bandwidth (before any server starts, so none competes for it) and
/// the weights one token reads. On the GPU the weights are read from the GPU's memory, which this
/// does not measure: `None`.
async fn measure_cap(
    mode: Mode,
    settings: &ServerSettings,
) -> Result<Option<(bandwidth::Bandwidth, gguf_weights::WeightsPerToken)>> {
    if mode == Mode::Gpu {
        return Ok(None);
    }
    let threads = settings.threads as usize;
    eprintln!("[bench] measuring the memory read bandwidth ({} MiB, {threads} threads)", bandwidth::BUFFER_BYTES >> 20);
    let bw =
        tokio::task::spawn_blocking(move || bandwidth::measure(threads, bandwidth::BUFFER_BYTES, bandwidth::REPEATS))
            .await?;
    eprintln!("[bench] {}", bw.describe());
    Ok(Some((bw, gguf_weights::weights_per_token(&settings.model))))
}

/// The `traffic` workload's sample, when it was asked for and its dataset is there; says so
/// when it is not, and the workload is skipped.
fn load_traffic(cli: &Cli, kinds: &[workloads::Kind]) -> Result<Option<traffic::Traffic>> {
    if !kinds.contains(&workloads::Kind::Traffic) {
        return Ok(None);
    }
    let Some(path) = traffic::locate(cli.traffic_dataset.as_deref()).filter(|p| p.is_file()) else {
        println!(
            "[bench] skipping workload traffic: no dataset (run scripts/fetch-traffic-dataset.sh or pass --traffic-dataset)"
        );
        return Ok(None);
    };
    let limits = traffic::Limits { max_prompt: cli.traffic_max_prompt, max_answer: cli.traffic_max_tokens };
    let t = traffic::load(&path, cli.seed, plan::traffic_sample_size(cli), limits)?;
    eprintln!(
        "[bench] traffic: {} conversations drawn from {} complete records of {}{}",
        t.conversations.len(),
        t.records,
        path.display(),
        if t.truncated { " (cut short; its complete records read)" } else { "" }
    );
    Ok(Some(t))
}

fn build_info(bin: Option<&PathBuf>) -> Option<String> {
    std::fs::read_to_string(bin?.with_file_name("BUILD_INFO")).ok()
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(dir) = &cli.matrix_summary {
        return matrix::summarize(dir);
    }
    let model = cli.model.clone().context("--model is required")?;
    if !model.is_file() {
        bail!("model {} not found (try `gantry models pull`)", model.display());
    }
    if cli.passes == 0 {
        bail!("--passes must be at least 1");
    }
    if cli.embeddings_only {
        return embeddings_only(&cli).await;
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
    let traffic = load_traffic(&cli, &kinds)?;
    let plan = plan::build(&cli, &kinds, traffic.as_ref());
    let max_c = plan::max_concurrency(&plan);
    let nproc = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let settings = ServerSettings {
        model: model.canonicalize()?,
        threads: cli.threads.unwrap_or(nproc),
        parallel: cli.parallel.unwrap_or(max_c as u32),
        ctx_per_seq: cli.ctx_size,
        ready_timeout: Duration::from_secs(cli.ready_timeout),
        gpu: mode == Mode::Gpu,
        embeddings: false,
    };
    let bins = Bins {
        gantry: cli.gantry_bin.clone(),
        reference: cli.reference_bin.clone(),
        gantry_avx2: cli.gantry_avx2_bin.clone(),
        reference_avx2: cli.reference_avx2_bin.clone(),
    };
    let pairs = pairs(mode, &bins, &BuildNotes::from_env());
    let one_stream_cap = measure_cap(mode, &settings).await?;
    let mut comparisons = Vec::new();
    let mut warnings = Vec::new();
    for (n, pair) in pairs.iter().enumerate() {
        // Gantry-only workloads describe Gantry, not a pair of builds: the first pair measures them.
        let pair_plan: Plan = plan.iter().filter(|(w, _)| n == 0 || !w.kind.first_pair_only()).cloned().collect();
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
            "Gantry / each llama-server (tok/s: higher is better; TTFT, ITL: lower is better)\n\n{}",
            report::ratio_table(&c.runs)
        );
        if let Some(t) = scopes::cache_scope_table(&c.runs) {
            println!("Cost of per-tenant cache scopes (Gantry only)\n\n{t}");
        }
        if let Some(t) = traffic_report::traffic_section(&c.runs) {
            println!("Real traffic (ShareGPT conversations)\n\n{t}");
        }
        if let Some((bw, weights)) = &one_stream_cap {
            println!("One stream against the memory-bandwidth cap\n\n{}", bandwidth::section(&c.runs, bw, weights));
        }
        comparisons.push(c);
    }
    let embeddings = match (&cli.embedding_model, &cli.reference_bin) {
        (Some(model), Some(reference)) if mode == Mode::Cpu => {
            let settings = embeddings::settings(model, settings.threads, settings.ready_timeout);
            let section =
                embeddings::compare(&cli.gantry_bin, reference, &settings, cli.passes, cli.embedding_requests)
                    .await
                    .context("the embeddings comparison")?;
            Some(section)
        }
        _ => None,
    };
    let interference = if cli.interference_requests > 0 && !cli.completions {
        let server = servers::start(servers::Kind::Gantry, &cli.gantry_bin, &settings).await?;
        let measured = interference::measure(&server, settings.parallel as usize, cli.interference_requests).await;
        server.stop().await?;
        let section = measured.context("the batch interference measurement")?;
        println!("{section}");
        Some(section)
    } else {
        None
    };
    let sharing = if cli.sharing_seconds > 0 && !cli.completions {
        let server = servers::start(servers::Kind::Gantry, &cli.gantry_bin, &settings).await?;
        let measured = sharing::measure(&server, settings.parallel as usize, cli.sharing_seconds).await;
        server.stop().await?;
        let section = measured.context("the weighted sharing measurement")?;
        println!("{section}");
        Some(section)
    } else {
        None
    };
    let machine = machine(mode == Mode::Gpu);
    println!("{machine}\n");
    if let Some(first) = comparisons.first() {
        println!(
            "Targets ({}, {})\n\n{}",
            mode.issue(),
            first.title,
            targets::targets_table(&first.runs, mode.targets())
        );
        if let Some(m) = targets::model_targets(&settings.model) {
            println!("Targets for {} (issue #53)\n\n{}", m.model, targets::targets_table(&first.runs, m.targets));
        }
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
        one_stream_cap,
        model_targets: targets::model_targets(&settings.model),
        embeddings,
        interference,
        sharing,
        traffic: traffic.as_ref().map(|t| plan::describe_traffic(&cli, t)),
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

/// `--embeddings-only`: the embeddings comparison on its own, printed.
async fn embeddings_only(cli: &Cli) -> Result<()> {
    let (Some(model), Some(reference)) = (&cli.embedding_model, &cli.reference_bin) else {
        bail!("--embeddings-only needs --embedding-model and --reference-bin");
    };
    let nproc = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let threads = cli.threads.unwrap_or(nproc);
    let settings = embeddings::settings(model, threads, Duration::from_secs(cli.ready_timeout));
    embeddings::compare(&cli.gantry_bin, reference, &settings, cli.passes, cli.embedding_requests).await?;
    Ok(())
}
