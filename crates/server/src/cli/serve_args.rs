//! `gantry serve`'s flags, with their defaults and parsers.

use clap::{Args, ValueEnum};

use crate::cli::data_dir::DataDirArg;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// A GGUF file path, or the name of a pulled model (see `gantry models list`); `ID=MODEL`
    /// sets the id clients send (default: the file stem). Repeat to serve several models: the
    /// first loads at start, the others when a request first names them.
    /// Without any of `--model`, `--models-dir` and `--models-config`: the default model.
    #[arg(long = "model", value_name = "[ID=]MODEL", env = "GANTRY_MODEL", action = clap::ArgAction::Append)]
    pub models: Vec<String>,
    /// Serve every `.gguf` model in this directory too (projectors paired by name).
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<std::path::PathBuf>,
    /// A TOML file of models with their own settings (`[[model]]` tables: model, id, aliases,
    /// ctx_size, parallel, mmproj, pin, idle_unload_s).
    #[arg(long, value_name = "FILE")]
    pub models_config: Option<std::path::PathBuf>,
    /// The id clients send for the first `--model`; defaults to the file stem.
    #[arg(long)]
    pub model_name: Option<String>,
    /// The first model's multimodal projector GGUF (`mmproj-*.gguf`): with it, `image_url`
    /// parts are read by the model (vision-language models such as SmolVLM or Gemma 3).
    /// Catalogue vision models get their own projector without it.
    #[arg(long, env = "GANTRY_MMPROJ", value_name = "PROJECTOR.gguf")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Memory all loaded models may take together (weights, KV cache, compute buffers), e.g.
    /// `700MB` or `4GiB`; loading one that does not fit unloads idle models, least recently
    /// used first. Default: 80% of the memory available at start.
    #[arg(long, value_name = "BYTES", env = "GANTRY_MAX_MEMORY", value_parser = crate::pool::parse_bytes)]
    pub max_memory: Option<u64>,
    /// A model id never unloaded to make room (loaded at start). Repeatable.
    #[arg(long = "pin", value_name = "ID")]
    pub pins: Vec<String>,
    #[arg(long, default_value = "127.0.0.1", env = "GANTRY_HOST")]
    pub host: String,
    #[arg(long, default_value_t = 8080, env = "GANTRY_PORT")]
    pub port: u16,
    #[command(flatten)]
    pub data: DataDirArg,
    /// Max tokens per sequence (prompt + completion).
    #[arg(long, default_value_t = 4096)]
    pub ctx_size: u32,
    /// Sequences decoded together in one batch [default: 4, or fewer where a model would not
    /// fit --max-memory otherwise; a value given here is kept or the model refused].
    #[arg(long)]
    pub parallel: Option<u32>,
    /// llama.cpp threads per model (default: the physical cores, shared out between models
    /// when several are served).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Layers offloaded to the GPU in a GPU build (`make build-gpu`) [default: all, when a GPU is
    /// present]; 0 keeps the model on the CPU. A CPU build offloads nothing.
    #[arg(long, env = "GANTRY_N_GPU_LAYERS")]
    pub n_gpu_layers: Option<u32>,
    /// The one GPU to use (by index) where several are present [default: layers split across
    /// all of them].
    #[arg(long, env = "GANTRY_MAIN_GPU")]
    pub main_gpu: Option<u32>,
    /// Where requests that sample by a temperature alone draw their tokens: `auto` on the GPU
    /// that computed their logits when every layer is offloaded and at most 4 sequences are busy
    /// as the request starts, so only the token comes back; `on` always, also on the CPU backend (llama.cpp's graph instead of Gantry's sampler; for tests);
    /// `off` always by Gantry's sampler on the host. Top-p, logit bias, penalties, grammars,
    /// logprobs, seeds, n > 1, tools and images always sample on the host.
    #[arg(long, value_enum, env = "GANTRY_DEVICE_SAMPLING", default_value_t = DeviceSamplingArg::Auto)]
    pub device_sampling: DeviceSamplingArg,
    /// How KV entries are copied between sequences (one KV stream per sequence: a running
    /// sequence moved down into a gap, a cached prefix shared with a new request, a prompt spread
    /// to its other choices): `auto` on the device where every layer is on a GPU (llama.cpp copies
    /// the stream's buffer there), through host memory elsewhere; `host` or `device` always.
    #[arg(long, value_enum, env = "GANTRY_KV_COPIES", default_value_t = KvCopiesArg::Auto)]
    pub kv_copies: KvCopiesArg,
    /// Max tokens per decode step [default: 512, or fewer where a model would not fit
    /// --max-memory otherwise; a value given here is kept or the model refused].
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// Speculative decoding by prompt lookup and grammar jump-forward: `auto` drafts tokens copied
    /// from the prompt and output as far as verifying them is measured to pay on this machine,
    /// and not while the server is busy; `always` feeds every proposal in full (for hardware where
    /// verifying is cheap); `off` never drafts.
    #[arg(long, value_enum, default_value_t = SpeculateArg::Auto)]
    pub speculate: SpeculateArg,
    /// Q5_0 matrices served as Q8_0: the same values in a layout ggml's CPU kernels multiply
    /// faster (docs/scheduling-and-speculation.md has the figures), read from a copy written once into
    /// the cache's `q8-twins` folder (a fifth larger than the model). `auto` does so where nothing
    /// is offloaded to a GPU; `off` serves the file as it is.
    #[arg(long, value_enum, default_value_t = TwinArg::Auto)]
    pub q5_as_q8: TwinArg,
    /// An embedding or rerank model's F32 matrices served as BF16 where the CPU multiplies BF16
    /// natively (AVX512_BF16): half the bytes and about 1.5× the inputs per second, vectors within
    /// cosine 0.99998 of F32's (docs/api.md, embeddings), read from a copy written once into the
    /// cache's `bf16-twins` folder. `auto` does so where nothing is offloaded to a GPU; `off`
    /// serves the file as it is. Chat models are never converted.
    #[arg(long, value_enum, default_value_t = TwinArg::Auto)]
    pub f32_as_bf16: TwinArg,
    /// Whose CPU kernels multiply Q8_0, Q5_0 and Q4_0 weights (with AVX-512 also Q4_K, Q5_K, Q6_K and IQ4_XS, and
    /// ggml then makes no repacked copies of Q4_K weights) by one row of activations (a decoding
    /// stream's step) and by a few rows (a few streams' step, drafts, short prompts): `gantry`'s
    /// (x86 with AVX2; the same integer products as ggml's, fetched ahead: faster decoding),
    /// `gantry-avx2` (Gantry's AVX2 level even where the CPU has AVX-512 or AVX-VNNI, to compare
    /// with a CPU without them on one machine), `gantry-avxvnni` (its AVX2 level with AVX-VNNI, as
    /// Intel's client cores run it), or `ggml`'s own and llamafile's.
    #[arg(long, value_enum, default_value_t = CpuKernelsArg::Gantry)]
    pub cpu_kernels: CpuKernelsArg,
    /// Q4_K, Q5_K, Q6_K and IQ4_XS matrices multiplied by 1 to 512 rows of activations (a stream's
    /// or a few streams' decode step, drafts, a prompt's ubatch) from a second copy in Gantry's
    /// memory, laid out 16 rows at a time (about 1.5× the tokens per second at four streams on a
    /// Q4_K_M model, a tenth at one, prompts in 0.5–0.9 of the time; 1–3% more bytes than the
    /// file's matrices, counted in the model's memory). Made at start. With AVX2 alone too (1.4×
    /// one stream's and 1.8× four streams' tokens per second on a Q4_K_M model, prompts in 0.6 of
    /// the time; ggml then makes no repacked copy of Q4_K).
    /// `auto` does so with Gantry's kernels where nothing is offloaded to a GPU and every model
    /// fits --max-memory with its copies at the settings asked for; `off` multiplies the file's
    /// own bytes.
    #[arg(long, value_enum, default_value_t = TwinArg::Auto)]
    pub k_quant_copies: TwinArg,
    /// One KV buffer shared by all sequences instead of one stream per sequence (llama.cpp's
    /// `--kv-unified`): a shared prefix is then tagged instead of copied, but every token's
    /// attention walks every sequence's cells (slower prompt steps with several streams).
    #[arg(long)]
    pub kv_unified: bool,
    /// The type KV entries are stored in: f16, or q8_0 (about half the memory: twice the
    /// sequences or context in the same budget) or q4_0 (about a quarter, and a measurable loss);
    /// llama.cpp's `-ctk`/`-ctv` for both. `gantry models kv-quality` measures what a type costs a model
    /// (docs/configuration.md#kv-cache-type). A models file may set a model's own (`kv_type`).
    #[arg(long, value_name = "TYPE", default_value = "f16")]
    pub kv_type: gantry_engine::KvType,
    /// Temperature-0 and seeded requests return the same text (and logprobs) for the same
    /// request, whatever the prefix cache, drafts or other streams did: each such sequence is
    /// computed apart, in fixed prompt chunks, without cache reuse or drafts
    /// (docs/determinism.md). Costs their throughput under concurrency and prefix-cache hits.
    #[arg(long, conflicts_with = "kv_unified")]
    pub deterministic_greedy: bool,
    /// Text in messages, tool calls and tool definitions that spells a control token
    /// (`<|im_end|>`, `<|im_start|>`, `<tool_call>`) becomes that token, as in llama.cpp's server;
    /// by default only the chat template's own markup does, so a client cannot forge a turn. For
    /// trusted single-user deployments only.
    #[arg(long)]
    pub special_tokens_in_content: bool,
    /// Most draft tokens one sequence verifies per step.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_max: u32,
    /// MiB of host memory for idle sequences' KV entries: a finished conversation or document
    /// leaves the KV cache (where it would slow every running stream) for host memory, and a
    /// prompt that starts with it gets it back instead of recomputing it; 0 keeps it in its slot
    /// until a request takes the slot, or a running sequence moves into it.
    #[arg(long, value_name = "MIB", env = "GANTRY_CACHE_RAM", default_value_t = gantry_engine::DEFAULT_HOST_CACHE_MIB)]
    pub cache_ram: usize,
    /// Publish KV-cache events (blocks stored and removed, with their prompt tokens) for llm-d's
    /// precise prefix-cache routing on a ZMQ PUB socket bound here, e.g. `tcp://*:5557`; off
    /// unless given (see docs/replicas.md).
    #[arg(long, value_name = "tcp://HOST:PORT", env = "GANTRY_KV_EVENTS_ENDPOINT")]
    pub kv_events_endpoint: Option<crate::kv_events::KvEventsEndpoint>,
    /// This pod's name in the KV-cache events' topic, `kv@<pod>@<model>`: the address the router
    /// knows the pod by (default: the host name).
    #[arg(long, value_name = "ID", env = "POD_IP")]
    pub kv_events_pod: Option<String>,
    /// Register this key at start (for scripted set-ups).
    #[arg(long, env = "GANTRY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Requests that may wait for a free sequence; beyond that, 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Most sequences one API key's requests may run at once per model (a request with `n`
    /// choices runs `n`), so one key cannot take every slot; a request of more choices is a 400
    /// [default: no limit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running_per_key: Option<u32>,
    /// Seconds running requests get to finish after SIGTERM/SIGINT before they are cut.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
    /// Seconds between a SIGTERM and closing the listener: /health/ready answers 503 and new
    /// chat requests get 503 with Retry-After, so a load balancer takes this replica out before
    /// its connections close (Kubernetes: a few seconds more than the readiness probe period).
    #[arg(long, default_value_t = 0)]
    pub drain_delay: u64,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub body_limit: usize,
    /// Seconds a request body may take to arrive in full, counted from its head; beyond that,
    /// 408 and the connection is closed.
    #[arg(long, default_value_t = crate::connections::DEFAULT_BODY_READ_TIMEOUT_SECS as f64, value_parser = parse_positive_seconds)]
    pub body_read_timeout: f64,
    /// Seconds a client may take to send a request's head (also how long an idle keep-alive
    /// connection stays open); beyond that the connection is closed.
    #[arg(long, default_value_t = crate::connections::DEFAULT_HEADER_READ_TIMEOUT_SECS as f64, value_parser = parse_positive_seconds)]
    pub header_read_timeout: f64,
    /// Most connections open at once; further clients wait in the listen backlog until one
    /// closes.
    #[arg(long, default_value_t = crate::connections::DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Most connections one client address (an IPv6 /64 counts as one) may hold open; a
    /// connection beyond it gets 429 and is closed. `--trusted-proxy` addresses are exempt.
    /// 0 disables the limit.
    #[arg(long, env = "GANTRY_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = crate::connections::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    pub max_connections_per_address: usize,
    /// Addresses or CIDR networks of reverse proxies you run, comma-separated (e.g.
    /// `10.0.0.0/8,192.168.1.5`): their connections are not capped per address, and the client
    /// address they append to `X-Forwarded-For` is the one the per-address limits count.
    #[arg(long, env = "GANTRY_TRUSTED_PROXY", value_name = "CIDR,...", value_parser = crate::client_addr::TrustedProxies::parse)]
    pub trusted_proxy: Option<crate::client_addr::TrustedProxies>,
    /// Seconds a write to a client may make no progress (the client reads nothing) before its
    /// connection is closed: a client that pipelines requests and never reads the answers, or
    /// stops reading a stream.
    #[arg(long, default_value_t = crate::connections::DEFAULT_WRITE_TIMEOUT_SECS as f64, value_parser = parse_positive_seconds)]
    pub write_timeout: f64,
    /// Seconds after which a connection takes no new request: the request it is serving (a
    /// stream included) finishes, then the connection closes and the client opens another.
    #[arg(long, default_value_t = crate::connections::DEFAULT_MAX_CONNECTION_AGE_SECS as f64, value_parser = parse_positive_seconds)]
    pub max_connection_age: f64,
    /// Serve `/metrics` to anyone on every listener. By default it is served on the
    /// `--admin-listen` listener, and on the one listener without it only to the admin token
    /// (as a bearer token).
    #[arg(long, env = "GANTRY_PUBLIC_METRICS")]
    pub public_metrics: bool,
    /// Also serves `/metrics` (and `/health`) on this address, to anyone and with nothing else:
    /// for the inference gateway's endpoint picker and Prometheus, which a NetworkPolicy lets
    /// reach it (docs/replicas.md).
    #[arg(long, env = "GANTRY_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Also exports the whole-server gauges under vLLM's names (`vllm:num_requests_waiting`,
    /// `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`, labelled
    /// with the first model's id as `model_name`), for pickers and autoscaling recipes written
    /// for vLLM.
    #[arg(long, value_enum, env = "GANTRY_METRICS_COMPAT")]
    pub metrics_compat: Option<MetricsCompat>,
    /// Requests with unknown API keys one client address (an IPv6 /64) may make per minute;
    /// beyond that, 429 without a key lookup. 0 disables the limit (behind a proxy every client
    /// shares its address).
    #[arg(long, default_value_t = crate::openai::auth_failures::DEFAULT_AUTH_FAILURES_PER_MINUTE)]
    pub auth_failures_per_minute: u32,
    /// Largest image (width × height, read from its header before decoding) a request may
    /// carry; beyond that, 400.
    #[arg(long, default_value_t = crate::openai::images::DEFAULT_MAX_IMAGE_PIXELS)]
    pub max_image_pixels: u64,
    /// Most requests prepared at once (chat template, tokenization, grammar compile) across
    /// all keys; more wait their turn. Default: one per CPU core.
    #[arg(long)]
    pub prepare_concurrency: Option<usize>,
    /// Most requests of one API key prepared at once; more wait their turn. Default: half of
    /// --prepare-concurrency (at least 1).
    #[arg(long)]
    pub prepare_concurrency_per_key: Option<usize>,
    /// Days a response made with the Responses API's `store: true` (its default) is kept for
    /// `GET /v1/responses/{id}` and `previous_response_id`; 0 stores nothing.
    #[arg(long, env = "GANTRY_RESPONSES_RETENTION_DAYS", default_value_t = 30)]
    pub responses_retention_days: u32,
    /// Most bytes one stored response (its input items and Response object) may take; a larger
    /// one is answered but not stored (`store: false` in its answer).
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = crate::pool::parse_size)]
    pub max_stored_response_bytes: u64,
    /// Most stored responses one API key keeps; a new one past it deletes the key's oldest.
    #[arg(long, default_value_t = crate::response_storage::DEFAULT_STORED_RESPONSES_PER_KEY)]
    pub stored_responses_per_key: u64,
    /// Most bytes of stored responses one API key keeps; a new one past it deletes the key's
    /// oldest.
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = crate::pool::parse_size)]
    pub stored_response_bytes_per_key: u64,
    /// Free space the data directory must keep: below it, requests that would store a response
    /// get 507 (`store: false` is served), so the usage ledger and outbox keep room. 0 turns
    /// the check off.
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = crate::pool::parse_size)]
    pub min_free_disk: u64,
    /// The largest file one upload to /v1/files may be (a batch's input).
    #[arg(long, value_name = "BYTES", default_value = "100MiB", value_parser = crate::pool::parse_size)]
    pub max_file_bytes: u64,
    /// Files one key may hold at once (its batches' output files not counted).
    #[arg(long, default_value_t = crate::batches::DEFAULT_FILES_PER_KEY)]
    pub files_per_key: u64,
    /// Bytes of files one key may hold at once.
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = crate::pool::parse_size)]
    pub file_bytes_per_key: u64,
    /// Batch lines this server runs at once, after every interactive request; 0 runs none
    /// (other replicas sharing the database do).
    #[arg(long, default_value_t = crate::batches::DEFAULT_BATCH_CONCURRENCY)]
    pub batch_concurrency: usize,
    /// Most images (`image_url` parts) one request may carry; beyond that, 400.
    #[arg(long, default_value_t = crate::openai::images::DEFAULT_MAX_IMAGES)]
    pub max_images: usize,
    /// Most image bytes one request may carry, inline and fetched together; beyond that, 400.
    #[arg(long, default_value_t = crate::openai::images::DEFAULT_MAX_IMAGE_BYTES)]
    pub max_image_bytes: usize,
    /// A host `image_url` URLs may name even though it resolves to a loopback, private or
    /// link-local address (an intranet image store); repeat for several. Every other host must
    /// be public.
    #[arg(long = "allow-image-host", value_name = "HOST")]
    pub allow_image_hosts: Vec<String>,
    /// Price of a model for money budgets and the ledger's cost: `MODEL[@TIER]=INPUT,OUTPUT[,CACHED]`
    /// in USD per million prompt, completion and cached prompt tokens (prompt tokens read from
    /// the prefix cache; the input price when not given). `@flex` or `@priority` prices that
    /// service tier, `@batch` a batch's lines; without one, flex and batch cost half the model's
    /// price and priority the same.
    /// Repeatable.
    #[arg(long = "price", value_name = "MODEL[@TIER]=IN,OUT[,CACHED]", value_parser = parse_price)]
    pub prices: Vec<crate::prices::PriceEntry>,
    /// Enables the admin API under /admin/v1, guarded by this bearer token (at least 32 random
    /// characters; a shorter or placeholder token stops the server at start).
    #[arg(long, env = "GANTRY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Serves the admin API, the console and /metrics on this address (e.g. 127.0.0.1:9090)
    /// and no longer on the public listener, which answers 404 there; /health and the API (for
    /// the console's playground) answer on both.
    #[arg(long, env = "GANTRY_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Readable name of this server in the reservations it holds and its heartbeat row; a random
    /// per-process suffix is added, so replicas sharing a name still tell themselves apart
    /// (default: hostname).
    #[arg(long, env = "GANTRY_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Seconds without a heartbeat (refreshed every quarter of this, at most every 15 s) after
    /// which a server counts as dead and any other releases its budget reservations.
    #[arg(long, env = "GANTRY_HEARTBEAT_TIMEOUT", default_value_t = 60.0, value_parser = parse_heartbeat_timeout)]
    pub heartbeat_timeout: f64,
    /// Seconds after which any server releases a reservation nobody settled, whoever holds it:
    /// a last resort behind the heartbeat; longer than the longest request you serve.
    #[arg(long, default_value_t = 6 * 3600, value_parser = clap::value_parser!(u64).range(60..))]
    pub reservation_ttl: u64,
    /// Requests per minute for keys without an RPM limit of their own (default: unlimited,
    /// reported in `x-ratelimit-*` headers as 1,000,000).
    #[arg(long, env = "GANTRY_DEFAULT_RPM", value_parser = clap::value_parser!(u64).range(1..=gantry_accounts::UNLIMITED_RPM))]
    pub default_rpm: Option<u64>,
    /// Tokens per minute for keys without a TPM limit of their own (default: unlimited,
    /// reported in `x-ratelimit-*` headers as 1,000,000,000).
    #[arg(long, env = "GANTRY_DEFAULT_TPM", value_parser = clap::value_parser!(u64).range(1..=gantry_accounts::UNLIMITED_TPM))]
    pub default_tpm: Option<u64>,
}

fn parse_heartbeat_timeout(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (0.5..=86_400.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?} is not a number of seconds between 0.5 and 86400")),
    }
}

/// Connection and body timeouts: a positive number of seconds, at most a day.
fn parse_positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 86_400.0 => Ok(x),
        _ => Err(format!("{s:?} is not a number of seconds above 0 and at most 86400")),
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSamplingArg {
    Auto,
    On,
    Off,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCopiesArg {
    Auto,
    Host,
    Device,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TwinArg {
    Auto,
    Off,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKernelsArg {
    Gantry,
    /// Gantry's AVX2 kernels even where the CPU has AVX-512 or AVX-VNNI (what a CPU without them runs).
    GantryAvx2,
    /// Gantry's AVX2 kernels with AVX-VNNI even where the CPU has AVX-512 (what Intel's client
    /// cores run).
    #[value(name = "gantry-avxvnni")]
    GantryAvxVnni,
    Ggml,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculateArg {
    Auto,
    Always,
    Off,
}

fn parse_price(s: &str) -> Result<crate::prices::PriceEntry, String> {
    const SHAPE: &str = "expected MODEL[@TIER]=INPUT,OUTPUT[,CACHED] (USD per million tokens)";
    let (model, rates) = s.split_once('=').ok_or(SHAPE)?;
    let (model, tier) = match model.trim().rsplit_once('@') {
        Some((model, tier)) => (model, crate::prices::parse_tier(tier)?),
        None => (model, crate::prices::BillingTier::Service(gantry_api::ServiceTier::Default)),
    };
    if model.trim().is_empty() {
        return Err("the model id is empty".into());
    }
    let price = crate::prices::parse_rates(rates)?;
    Ok((model.trim().to_string(), tier, price))
}

#[cfg(test)]
mod tests {
    use super::parse_price;
    use crate::prices::BillingTier;
    use gantry_api::ServiceTier;

    #[test]
    fn a_price_has_input_output_and_an_optional_cached_rate() {
        let (model, tier, p) = parse_price("m=1.5,3").unwrap();
        assert_eq!(
            (model.as_str(), tier, p.input_per_mtok, p.output_per_mtok, p.cached_input_per_mtok),
            ("m", BillingTier::Service(ServiceTier::Default), 1.5, 3.0, None)
        );
        let (_, _, p) = parse_price("m = 1,2,0.25").unwrap();
        assert_eq!(p.cached_input_per_mtok, Some(0.25));
        let (model, tier, _) = parse_price("org/m:q4@flex=0.5,1").unwrap();
        assert_eq!((model.as_str(), tier), ("org/m:q4", BillingTier::Service(ServiceTier::Flex)));
        assert_eq!(parse_price("m@priority=3,9").unwrap().1, BillingTier::Service(ServiceTier::Priority));
        assert_eq!(parse_price("m@batch=0.5,1").unwrap().1, BillingTier::Batch);
        for bad in ["m", "m=1", "m=1,2,3,4", "=1,2", "m=1,-2", "m=1,2,x", "m@turbo=1,2", "@flex=1,2"] {
            assert!(parse_price(bad).is_err(), "{bad}");
        }
    }
}

/// Another server's metric names that `/metrics` also speaks (`--metrics-compat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricsCompat {
    Vllm,
}
