//! `gantry-bench`'s command line: every flag with its default, and the defaults that depend on
//! the mode (CPU or GPU).

use std::path::PathBuf;

use clap::Parser;

use crate::mode::Mode;

#[derive(Parser, Debug)]
#[command(name = "gantry-bench", about = "Gantry vs llama-server streaming benchmark")]
pub(crate) struct Cli {
    /// The GGUF both servers load.
    #[arg(long, required_unless_present = "matrix_summary")]
    pub(crate) model: Option<PathBuf>,
    /// Print the model matrix from the JSON reports `scripts/bench-matrix.sh` left in this
    /// directory (one per model, named by its GGUF's file stem) and write it to its README.md;
    /// starts no server.
    #[arg(long)]
    pub(crate) matrix_summary: Option<PathBuf>,
    /// Compare CUDA builds on the GPU (`make bench BENCH_GPU=1`): --gantry-bin from `make
    /// build-gpu`, --reference-bin from `REFERENCE_CUDA=1 scripts/build-reference-llama-server.sh`;
    /// every layer offloaded, chat up to 64 streams, issue #18's targets, docs/benchmarks-gpu.md.
    #[arg(long)]
    pub(crate) gpu: bool,
    /// Gantry built native for this CPU (`make build`).
    #[arg(long, default_value = "target/release/gantry")]
    pub(crate) gantry_bin: PathBuf,
    /// llama-server built native for this CPU (scripts/build-reference-llama-server.sh prints one).
    #[arg(long)]
    pub(crate) reference_bin: Option<PathBuf>,
    /// Gantry built for portable AVX2 (no target-cpu): the second, AVX2-vs-AVX2 comparison.
    #[arg(long)]
    pub(crate) gantry_avx2_bin: Option<PathBuf>,
    /// llama-server built for portable AVX2 (REFERENCE_NATIVE=0).
    #[arg(long)]
    pub(crate) reference_avx2_bin: Option<PathBuf>,
    /// Which servers to run: gantry, reference (llama-server as started so far), reference-tuned
    /// (the same binary with n-gram speculation and flash attention).
    #[arg(long, value_delimiter = ',', default_value = "gantry,reference,reference-tuned")]
    pub(crate) servers: Vec<String>,
    /// Leave the tuned reference out (a quicker run; targets are then judged against the plain one).
    #[arg(long)]
    pub(crate) no_tuned_reference: bool,
    /// Workloads to run: chat, shared-prefix, code-edit, prose, extract, chat-sampled, chat-top-p,
    /// cache-scopes (Gantry only), traffic (real conversations, when the dataset is there).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "chat,shared-prefix,code-edit,prose,extract,chat-sampled,chat-top-p,cache-scopes,traffic"
    )]
    pub(crate) workloads: Vec<String>,
    /// Passes over all workloads; the server order flips every pass (2 passes = A-B-B-A).
    #[arg(long, default_value_t = 2)]
    pub(crate) passes: usize,
    /// Threads for both servers (default: nproc).
    #[arg(long)]
    pub(crate) threads: Option<u32>,
    /// Parallel sequences/slots for both servers (default: the highest concurrency).
    #[arg(long)]
    pub(crate) parallel: Option<u32>,
    /// Context per sequence (llama-server gets this × parallel in total): code-edit needs its
    /// ~950-token file plus 1200 completion tokens.
    #[arg(long, default_value_t = 4096)]
    pub(crate) ctx_size: u32,
    /// Concurrency levels of the chat workload [default: 1,4,8,16; with --gpu 1,4,8,16,32,64].
    #[arg(long, value_delimiter = ',')]
    pub(crate) concurrency: Vec<usize>,
    /// Requests per chat concurrency level, at least the concurrency [default: 16; with --gpu 64].
    #[arg(long)]
    pub(crate) requests: Option<usize>,
    /// Approximate prompt length of the chat workload, in tokens.
    #[arg(long, default_value_t = 128)]
    pub(crate) prompt_tokens: usize,
    /// Completion tokens asked for per chat and shared-prefix request.
    #[arg(long, default_value_t = 64)]
    pub(crate) max_tokens: u32,
    /// Temperature of the greedy workloads (the sampled ones and cache-scopes use 0.8).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f64,
    /// Concurrency levels of chat-sampled (temperature 0.8) [default: 1,8; with --gpu 1,64].
    #[arg(long, value_delimiter = ',')]
    pub(crate) sampled_concurrency: Vec<usize>,
    /// Concurrency levels of chat-top-p (temperature 0.8, top_p 0.95) [default: 8; with --gpu 64].
    #[arg(long, value_delimiter = ',')]
    pub(crate) top_p_concurrency: Vec<usize>,
    /// Completion tokens asked for per chat-sampled and chat-top-p request.
    #[arg(long, default_value_t = 128)]
    pub(crate) sampled_max_tokens: u32,
    /// cache-scopes: approximate length of the system prompt every request shares.
    #[arg(long, default_value_t = 1000)]
    pub(crate) cache_scope_prefix_tokens: usize,
    #[arg(long, default_value_t = 2)]
    pub(crate) cache_scope_concurrency: usize,
    /// cache-scopes: requests per combination (tenants × scope) and pass.
    #[arg(long, default_value_t = 16)]
    pub(crate) cache_scope_requests: usize,
    #[arg(long, default_value_t = 32)]
    pub(crate) cache_scope_max_tokens: u32,
    /// Approximate length of the shared system prompt.
    #[arg(long, default_value_t = 1500)]
    pub(crate) shared_prefix_tokens: usize,
    #[arg(long, default_value_t = 8)]
    pub(crate) shared_prefix_concurrency: usize,
    /// Requests of the shared-prefix workload. The default, one per stream, measures a cold
    /// burst: every request arrives before the shared system prompt has been computed once.
    #[arg(long, default_value_t = 8)]
    pub(crate) shared_prefix_requests: usize,
    /// Requests of the single-stream code-edit workload (each answers a whole file).
    #[arg(long, default_value_t = 4)]
    pub(crate) code_edit_requests: usize,
    /// Enough for the longest file of the code-edit workload and its change.
    #[arg(long, default_value_t = 1200)]
    pub(crate) code_edit_max_tokens: u32,
    #[arg(long, default_value_t = 4)]
    pub(crate) prose_requests: usize,
    #[arg(long, default_value_t = 256)]
    pub(crate) prose_max_tokens: u32,
    #[arg(long, default_value_t = 8)]
    pub(crate) extract_requests: usize,
    #[arg(long, default_value_t = 256)]
    pub(crate) extract_max_tokens: u32,
    /// traffic: the ShareGPT JSON (scripts/fetch-traffic-dataset.sh) [default: the fetch script's
    /// file in ~/.cache/gantry/datasets when it is there; without one the workload is skipped].
    #[arg(long)]
    pub(crate) traffic_dataset: Option<PathBuf>,
    /// traffic: closed-loop levels (streams), on every server.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub(crate) traffic_concurrency: Vec<usize>,
    /// traffic: requests per closed-loop level, at least the concurrency.
    #[arg(long, default_value_t = 16)]
    pub(crate) traffic_requests: usize,
    /// traffic: the open-loop sweep, Poisson arrival rates in requests/s.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    pub(crate) traffic_rates: Vec<f64>,
    /// traffic: requests per open-loop rate (12 keeps the sweep within minutes on 2 cores; p99 of
    /// so few is close to their maximum).
    #[arg(long, default_value_t = 12)]
    pub(crate) traffic_rate_requests: usize,
    /// traffic: passes it runs in (the first ones of --passes); each is a full sweep.
    #[arg(long, default_value_t = 1)]
    pub(crate) traffic_passes: usize,
    /// traffic: longest prompt kept, in estimated tokens (chars/4), as vLLM's 1024.
    #[arg(long, default_value_t = 1024)]
    pub(crate) traffic_max_prompt: usize,
    /// traffic: cap on the recorded answers' lengths (estimated tokens) sent as max_tokens.
    #[arg(long, default_value_t = 256)]
    pub(crate) traffic_max_tokens: usize,
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Seconds to wait for a server to load the model and accept requests.
    #[arg(long, default_value_t = 300)]
    pub(crate) ready_timeout: u64,
    /// The report [default: docs/benchmarks.md; with --gpu docs/benchmarks-gpu.md].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// The chart [default: docs/bench-chart.svg; with --gpu docs/bench-chart-gpu.svg].
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
    /// Also write the raw results as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Print the tables only; write no files.
    #[arg(long)]
    pub(crate) no_write: bool,
    /// An embedding GGUF (`make bench`: all-MiniLM-L6-v2): also compare `/v1/embeddings` with
    /// llama-server `--embeddings` on it (issue #55), after the chat comparison.
    #[arg(long)]
    pub(crate) embedding_model: Option<PathBuf>,
    /// Requests of 32 inputs per embeddings level and pass.
    #[arg(long, default_value_t = 32)]
    pub(crate) embedding_requests: usize,
    /// Run the embeddings comparison alone (needs `--embedding-model` and `--reference-bin`): no
    /// chat workloads, bandwidth, interference or sharing measurement; prints, writes nothing.
    #[arg(long)]
    pub(crate) embeddings_only: bool,
    /// Interactive requests of each half of the batch interference measurement (issue #56,
    /// Gantry only, after the comparisons); 0 skips it.
    #[arg(long, default_value_t = 16)]
    pub(crate) interference_requests: usize,
    /// Seconds of the weighted-sharing measurement (issue #56, Gantry only, after the
    /// comparisons): two tenants weighing 3:1 flood the server; 0 skips it.
    #[arg(long, default_value_t = 60)]
    pub(crate) sharing_seconds: u64,
    /// Send every workload's request to `/v1/completions`, its messages' text as a raw prompt:
    /// for a base model, whose GGUF has no chat template (Gemma 3 270M), which both servers
    /// refuse chat requests on. The interference and sharing measurements (chat) are skipped.
    #[arg(long)]
    pub(crate) completions: bool,
}

impl Cli {
    pub(crate) fn mode(&self) -> Mode {
        Mode::new(self.gpu)
    }

    pub(crate) fn concurrency(&self) -> Vec<usize> {
        if self.concurrency.is_empty() {
            self.mode().default_concurrency()
        } else {
            self.concurrency.clone()
        }
    }

    /// The servers to run, in rotation order: `--servers` less the tuned reference under
    /// `--no-tuned-reference`.
    pub(crate) fn servers(&self) -> Vec<String> {
        let tuned = |s: &String| matches!(s.as_str(), "reference-tuned" | "tuned");
        self.servers.iter().filter(|s| !(self.no_tuned_reference && tuned(s))).cloned().collect()
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.unwrap_or_else(|| self.mode().default_requests())
    }

    /// Report and chart paths.
    pub(crate) fn outputs(&self) -> (PathBuf, PathBuf) {
        let (out, chart) = self.mode().default_outputs();
        (self.out.clone().unwrap_or(out), self.chart.clone().unwrap_or(chart))
    }
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
