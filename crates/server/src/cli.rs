//! The `gantry` command line. Flags are a contract scripts depend on (see README).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(name = "gantry", version, args_override_self = true, about = "OpenAI-compatible chat completions on llama.cpp, metered per API key")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI API.
    Serve(ServeArgs),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Report token usage per key and model.
    Usage(UsageArgs),
    /// Fetch and list models.
    #[command(subcommand)]
    Models(ModelsCommand),
}

#[derive(Args, Debug, Clone)]
pub struct DataDirArg {
    /// Where keys and the usage ledger live (SQLite).
    #[arg(long, env = "GANTRY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl DataDirArg {
    pub fn resolve(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| {
            let base = std::env::var_os("XDG_DATA_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
                .unwrap_or_else(|| PathBuf::from("."));
            base.join("gantry")
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// A GGUF file path, or the name of a pulled model (see `gantry models list`).
    #[arg(long, env = "GANTRY_MODEL", default_value = crate::models::DEFAULT_MODEL)]
    pub model: String,
    /// The id clients send as `model`; defaults to the file stem.
    #[arg(long)]
    pub model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1", env = "GANTRY_HOST")]
    pub host: String,
    #[arg(long, default_value_t = 8080, env = "GANTRY_PORT")]
    pub port: u16,
    #[command(flatten)]
    pub data: DataDirArg,
    /// Max tokens per sequence (prompt + completion).
    #[arg(long, default_value_t = 4096)]
    pub ctx_size: u32,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = 4)]
    pub parallel: u32,
    /// llama.cpp threads (default: physical cores).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Max tokens per decode step.
    #[arg(long, default_value_t = 512)]
    pub batch_size: u32,
    /// Register this key at start (for scripted set-ups).
    #[arg(long, env = "GANTRY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Requests that may wait for a free sequence; beyond that, 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Seconds running requests get to finish after SIGTERM/SIGINT before they are cut.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub body_limit: usize,
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key; the secret is printed once, as the last line.
    Create {
        #[arg(long)]
        name: String,
        /// Requests per minute (default unlimited).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        rpm: Option<i64>,
        /// Tokens per minute, counted as prompt plus max_tokens (default unlimited).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        tpm: Option<i64>,
        #[command(flatten)]
        data: DataDirArg,
    },
    /// List keys (never their secrets).
    List {
        #[command(flatten)]
        data: DataDirArg,
    },
    /// Revoke a key by id, name or displayed prefix.
    Revoke {
        key: String,
        #[command(flatten)]
        data: DataDirArg,
    },
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    #[command(flatten)]
    pub data: DataDirArg,
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum OutputFormat {
    Table,
    Json,
    Csv,
}

#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// Download a catalogue model into the cache, verified by sha256.
    Pull {
        #[arg(default_value = crate::models::DEFAULT_MODEL)]
        name: String,
        /// Download from this URL instead of the catalogue's sources.
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        quiet: bool,
    },
    /// Show the catalogue and what is cached.
    List,
}
