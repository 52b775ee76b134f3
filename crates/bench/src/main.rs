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

use compare::compare;
use host::machine;
use mode::Mode;
use pairs::{pairs, Bins, BuildNotes};
use plan::Plan;
use servers::ServerSettings;

#[derive(Parser, Debug)]
#[command(name = "gantry-bench", about = "Gantry vs llama-server streaming benchmark")]
struct Cli {
    /// The GGUF both servers load.
    #[arg(long, required_unless_present = "matrix_summary")]
    model: Option<PathBuf>,
    /// Print the model matrix from the JSON reports `scripts/bench-matrix.sh` left in this
    /// directory (one per model, named by its GGUF's file stem) and write it to its README.md;
    /// starts no server.
    #[arg(long)]
    matrix_summary: Option<PathBuf>,
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
    /// Which servers to run: gantry, reference (llama-server as started so far), reference-tuned
    /// (the same binary with n-gram speculation and flash attention).
    #[arg(long, value_delimiter = ',', default_value = "gantry,reference,reference-tuned")]
    servers: Vec<String>,
    /// Leave the tuned reference out (a quicker run; targets are then judged against the plain one).
    #[arg(long)]
    no_tuned_reference: bool,
    /// Workloads to run: chat, shared-prefix, code-edit, prose, extract, chat-sampled, chat-top-p,
    /// cache-scopes (Gantry only), traffic (real conversations, when the dataset is there).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "chat,shared-prefix,code-edit,prose,extract,chat-sampled,chat-top-p,cache-scopes,traffic"
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
    /// traffic: the ShareGPT JSON (scripts/fetch-traffic-dataset.sh) [default: the fetch script's
    /// file in ~/.cache/gantry/datasets when it is there; without one the workload is skipped].
    #[arg(long)]
    traffic_dataset: Option<PathBuf>,
    /// traffic: closed-loop levels (streams), on every server.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    traffic_concurrency: Vec<usize>,
    /// traffic: requests per closed-loop level, at least the concurrency.
    #[arg(long, default_value_t = 16)]
    traffic_requests: usize,
    /// traffic: the open-loop sweep, Poisson arrival rates in requests/s.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    traffic_rates: Vec<f64>,
    /// traffic: requests per open-loop rate (12 keeps the sweep within minutes on 2 cores; p99 of
    /// so few is close to their maximum).
    #[arg(long, default_value_t = 12)]
    traffic_rate_requests: usize,
    /// traffic: passes it runs in (the first ones of --passes); each is a full sweep.
    #[arg(long, default_value_t = 1)]
    traffic_passes: usize,
    /// traffic: longest prompt kept, in estimated tokens (chars/4), as vLLM's 1024.
    #[arg(long, default_value_t = 1024)]
    traffic_max_prompt: usize,
    /// traffic: cap on the recorded answers' lengths (estimated tokens) sent as max_tokens.
    #[arg(long, default_value_t = 256)]
    traffic_max_tokens: usize,
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
    /// An embedding GGUF (`make bench`: all-MiniLM-L6-v2): also compare `/v1/embeddings` with
    /// llama-server `--embeddings` on it (issue #55), after the chat comparison.
    #[arg(long)]
    embedding_model: Option<PathBuf>,
    /// Requests of 32 inputs per embeddings level and pass.
    #[arg(long, default_value_t = 32)]
    embedding_requests: usize,
    /// Run the embeddings comparison alone (needs `--embedding-model` and `--reference-bin`): no
    /// chat workloads, bandwidth, interference or sharing measurement; prints, writes nothing.
    #[arg(long)]
    embeddings_only: bool,
    /// Interactive requests of each half of the batch interference measurement (issue #56,
    /// Gantry only, after the comparisons); 0 skips it.
    #[arg(long, default_value_t = 16)]
    interference_requests: usize,
    /// Seconds of the weighted-sharing measurement (issue #56, Gantry only, after the
    /// comparisons): two tenants weighing 3:1 flood the server; 0 skips it.
    #[arg(long, default_value_t = 60)]
    sharing_seconds: u64,
    /// Send every workload's request to `/v1/completions`, its messages' text as a raw prompt:
    /// for a base model, whose GGUF has no chat template (Gemma 3 270M), which both servers
    /// refuse chat requests on. The interference and sharing measurements (chat) are skipped.
    #[arg(long)]
    completions: bool,
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

    /// The servers to run, in rotation order: `--servers` less the tuned reference under
    /// `--no-tuned-reference`.
    fn servers(&self) -> Vec<String> {
        let tuned = |s: &String| matches!(s.as_str(), "reference-tuned" | "tuned");
        self.servers.iter().filter(|s| !(self.no_tuned_reference && tuned(s))).cloned().collect()
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

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
