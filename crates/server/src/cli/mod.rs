//! The `gantry` command line. Flags are a contract scripts depend on (see docs/configuration.md).
//! This module parses the subcommands; [`serve`] and [`commands`] run them.

/// `gantry keys …`, `gantry usage`, `gantry models …`.
pub mod commands;
/// `--data-dir` / `--database-url`: where the accounts live.
mod data_dir;
/// Which models `gantry serve` serves, and with which settings.
mod model_config;
/// `gantry serve`: load the models, open the accounts database, bind, serve.
pub mod serve;
/// `gantry serve`'s flags.
mod serve_args;

pub use data_dir::DataDirArg;
pub use serve_args::{CpuKernelsArg, DeviceSamplingArg, KvCopiesArg, ServeArgs, SpeculateArg, TwinArg};

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "gantry",
    version,
    args_override_self = true,
    about = "OpenAI-compatible chat completions on llama.cpp, metered per API key"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI API.
    Serve(Box<ServeArgs>),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Show tenants and set their weights.
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// Report token usage per key and model.
    Usage(UsageArgs),
    /// Fetch and list models.
    #[command(subcommand)]
    Models(ModelsCommand),
}

/// Settings of `keys create` and `keys update`; the same fields the admin API takes.
#[derive(Args, Debug, Clone, Default)]
pub struct KeyFlags {
    /// Project or customer the key belongs to (default `default`).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Requests per minute (`none` = unlimited).
    #[arg(long, value_parser = parse_limit)]
    pub rpm: Option<Setting<i64>>,
    /// Tokens per minute, counted as prompt plus max_tokens (`none` = unlimited).
    #[arg(long, value_parser = parse_limit)]
    pub tpm: Option<Setting<i64>>,
    /// Token budget: prompt plus completion tokens (`none` = unlimited).
    #[arg(long, value_parser = parse_limit)]
    pub budget_tokens: Option<Setting<i64>>,
    /// Money budget in USD at the prices given to `serve --price` (`none` = unlimited).
    #[arg(long, value_parser = parse_usd)]
    pub budget_usd: Option<Setting<f64>>,
    /// Whether budgets cover the key's lifetime or each calendar month (UTC).
    #[arg(long, value_enum)]
    pub budget_period: Option<BudgetPeriodArg>,
    /// Comma-separated model ids the key may use (`all` = every model).
    #[arg(long, value_parser = parse_models)]
    pub models: Option<Setting<Vec<String>>>,
    /// When the key stops working: RFC 3339 time or a date (`never` = no expiry).
    #[arg(long)]
    pub expires: Option<String>,
    /// Whose cached prompt prefixes the key's requests reuse: `tenant` (every key of its tenant,
    /// the default), `key` (this key alone) or `shared` (every `shared` key).
    #[arg(long, value_parser = str::parse::<gantry_accounts::CacheScopeSetting>)]
    pub cache_scope: Option<gantry_accounts::CacheScopeSetting>,
    /// The key's share of the engine among its tenant's keys, 1..=1000 (default 1); tenants
    /// share by their own weights (`gantry tenants set`).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=gantry_accounts::MAX_WEIGHT))]
    pub weight: Option<i64>,
    /// Whether the key's requests may run in `service_tier: "priority"` (`true`/`false`; off by
    /// default: others asking for it run in `default`).
    #[arg(long)]
    pub priority_tier: Option<bool>,
}

impl KeyFlags {
    pub fn to_fields(&self, name: Option<String>) -> crate::admin::keyspec::KeyFields {
        crate::admin::keyspec::KeyFields {
            name,
            tenant: self.tenant.clone(),
            rpm_limit: self.rpm.clone().map(|s| s.0),
            tpm_limit: self.tpm.clone().map(|s| s.0),
            budget_tokens: self.budget_tokens.clone().map(|s| s.0),
            budget_usd: self.budget_usd.clone().map(|s| s.0),
            budget_period: self.budget_period.map(|p| match p {
                BudgetPeriodArg::Total => gantry_accounts::BudgetPeriod::Total,
                BudgetPeriodArg::Month => gantry_accounts::BudgetPeriod::Month,
            }),
            models: self.models.clone().map(|s| s.0),
            expires_at: self.expires.as_ref().map(|e| (e != "never").then(|| e.clone())),
            cache_scope: self.cache_scope,
            weight: self.weight,
            priority_tier: self.priority_tier,
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum BudgetPeriodArg {
    Total,
    Month,
}

/// A flag value that may also clear the setting (`none`, `all`, `never`).
#[derive(Debug, Clone, Default)]
pub struct Setting<T>(pub Option<T>);

fn parse_limit(s: &str) -> Result<Setting<i64>, String> {
    if matches!(s, "none" | "unlimited") {
        return Ok(Setting(None));
    }
    match s.parse::<i64>() {
        Ok(n) if n > 0 => Ok(Setting(Some(n))),
        _ => Err(format!("{s:?} is not a positive whole number (or `none`)")),
    }
}

fn parse_usd(s: &str) -> Result<Setting<f64>, String> {
    if matches!(s, "none" | "unlimited") {
        return Ok(Setting(None));
    }
    match s.trim_start_matches('$').parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(Setting(Some(x))),
        _ => Err(format!("{s:?} is not a positive amount of USD (or `none`)")),
    }
}

fn parse_models(s: &str) -> Result<Setting<Vec<String>>, String> {
    if s == "all" {
        return Ok(Setting(None));
    }
    let models: Vec<String> = s.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
    if models.is_empty() {
        return Err("give at least one model id (or `all`)".into());
    }
    Ok(Setting(Some(models)))
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key; the secret is printed once, as the last line.
    Create {
        #[arg(long)]
        name: String,
        #[command(flatten)]
        settings: KeyFlags,
        #[command(flatten)]
        data: DataDirArg,
    },
    /// Show one key (by id, name or prefix) with its current spend.
    Show {
        key: String,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        #[command(flatten)]
        data: DataDirArg,
    },
    /// Change a key's settings; flags not given stay as they are.
    Update {
        key: String,
        /// New name.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        settings: KeyFlags,
        #[command(flatten)]
        data: DataDirArg,
    },
    /// Give a key a new secret (printed once, as the last line); the old one stops working.
    Rotate {
        key: String,
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

#[derive(Subcommand, Debug)]
pub enum TenantsCommand {
    /// List tenants (named by a key or given a weight) with their weights and active keys.
    List {
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        #[command(flatten)]
        data: DataDirArg,
    },
    /// Set a tenant's weight: its keys together share the engine with other tenants by it.
    Set {
        tenant: String,
        /// 1..=1000; a tenant never given one weighs 1.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..=gantry_accounts::MAX_WEIGHT))]
        weight: i64,
        #[command(flatten)]
        data: DataDirArg,
    },
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    #[command(flatten)]
    pub data: DataDirArg,
    /// Only this key.
    #[arg(long)]
    pub key_name: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this model.
    #[arg(long)]
    pub model: Option<String>,
    /// Requests started at or after this RFC 3339 time or date.
    #[arg(long)]
    pub since: Option<String>,
    /// Requests started before this RFC 3339 time or date.
    #[arg(long)]
    pub until: Option<String>,
    /// Only the lines of this batch (`batch_…`).
    #[arg(long)]
    pub batch_id: Option<String>,
    /// One row per UTC day as well.
    #[arg(long, conflicts_with = "requests")]
    pub by_day: bool,
    /// One row per request (server and client request ids, tokens, outcome, times) instead of totals.
    #[arg(long)]
    pub requests: bool,
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
    /// Measure what a quantized KV cache (`serve --kv-type`) costs a model: the text is read with
    /// an f16 cache and with TYPE, and their next-token distributions compared at every position
    /// (mean KL divergence and top-1 agreement, as `llama-perplexity --kl-divergence` reports).
    KvQuality {
        /// A catalogue name (pulled) or a .gguf path.
        model: String,
        #[arg(long, value_name = "TYPE", default_value = "q8_0")]
        kv_type: gantry_engine::KvType,
        /// A UTF-8 text file; by default Gantry's architecture page (about 4,000 tokens).
        #[arg(long)]
        text: Option<std::path::PathBuf>,
        /// The most tokens of the text to read.
        #[arg(long, default_value_t = 4096)]
        tokens: usize,
        /// CPU threads (default: the physical cores).
        #[arg(long)]
        threads: Option<u32>,
    },
    /// Embed texts with an embedding model (`all-minilm-l6-v2`) and print, as one JSON object,
    /// each text's token ids and unit vector: what the model computes, without a server.
    Embed {
        /// A catalogue name (pulled) or a .gguf path.
        model: String,
        /// The texts, each embedded on its own.
        #[arg(required = true)]
        texts: Vec<String>,
        /// CPU threads (default: the physical cores).
        #[arg(long)]
        threads: Option<u32>,
        /// F32 matrices served as BF16 where the CPU multiplies BF16 natively, as `serve` does.
        #[arg(long, value_enum, default_value_t = TwinArg::Auto)]
        f32_as_bf16: TwinArg,
    },
}
