//! Which models a server serves, and with which settings: `--model` flags, every GGUF in
//! `--models-dir`, and a models file (`--models-config`, TOML), in that order. The flags'
//! engine settings (`--ctx-size`, `--parallel`, …) apply to every model; the file may set a
//! model's own.
//!
//! ```toml
//! [[model]]
//! model = "qwen2.5-coder-0.5b"   # a catalogue name, or a .gguf path (relative to this file)
//! id = "coder"                   # what clients send; default: the file stem
//! aliases = ["gpt-4o-mini"]      # other names clients may send for it
//! ctx_size = 8192
//! parallel = 2
//! kv_type = "q8_0"               # the KV cache's type (f16, q8_0, q4_0)
//! mmproj = "mmproj.gguf"         # its multimodal projector
//! pin = true                     # loaded at start, never unloaded to make room
//! idle_unload_s = 600            # unloaded after this long without requests
//! price = { default = "0.15,0.60,0.075", batch = "0.05,0.20" }  # USD per million tokens
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gantry_engine::{EngineConfig, KvLayout};
use serde::Deserialize;

use crate::cli::{ServeArgs, TwinArg};
use crate::models;
use crate::pool::{ModelSpec, Shrinkable};

/// `--parallel` when not given.
pub(crate) const DEFAULT_PARALLEL: u32 = 4;
/// `--batch-size` when not given.
pub(crate) const DEFAULT_BATCH_SIZE: u32 = 512;

/// A models file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsFile {
    #[serde(default)]
    model: Vec<FileEntry>,
}

/// One `[[model]]` of a models file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    model: String,
    id: Option<String>,
    #[serde(default)]
    aliases: Vec<String>,
    ctx_size: Option<u32>,
    parallel: Option<u32>,
    kv_type: Option<String>,
    mmproj: Option<PathBuf>,
    #[serde(default)]
    pin: bool,
    idle_unload_s: Option<u64>,
    /// Billing tier → `INPUT,OUTPUT[,CACHED]`, as `--price` takes them.
    #[serde(default)]
    price: std::collections::BTreeMap<String, String>,
}

/// Every model the flags, the models directory and the models file name, resolved to files.
pub(crate) fn model_specs(args: &ServeArgs) -> anyhow::Result<Vec<ModelSpec>> {
    let cache = models::default_cache_dir();
    let mut specs: Vec<ModelSpec> = Vec::new();
    let mut flags = args.models.clone();
    if flags.is_empty() && args.models_dir.is_none() && args.models_config.is_none() {
        flags.push(models::DEFAULT_MODEL.to_string());
    }
    for (i, arg) in flags.iter().enumerate() {
        let (id, name) = split_model_arg(arg);
        let path = models::resolve_model(name, &cache)?;
        let id = match (i, &args.model_name) {
            (0, Some(first)) => first.clone(),
            _ => id.map_or_else(|| model_id_from_path(&path), str::to_string),
        };
        let mmproj = match (&args.mmproj, i) {
            (Some(path), 0) => Some(path.clone()),
            _ => models::resolve_projector(name, &cache)?,
        };
        specs.push(spec(args, id, path, mmproj));
    }
    if let Some(dir) = &args.models_dir {
        for (path, mmproj) in scan_dir(dir)? {
            specs.push(spec(args, model_id_from_path(&path), path, mmproj));
        }
    }
    if let Some(file) = &args.models_config {
        specs.extend(read_models_file(args, file, &cache)?);
    }
    for spec in &mut specs {
        spec.pin |= args.pins.contains(&spec.id);
    }
    check_names(&specs)?;
    if let Some(unknown) = args.pins.iter().find(|p| !specs.iter().any(|s| &s.id == *p)) {
        anyhow::bail!("--pin {unknown}: no model is served under that id");
    }
    share_cores(&mut specs, args.threads, gantry_engine::default_threads());
    let (q8_twins, bf16_twins) = (q8_twin_dir(args, &cache), bf16_twin_dir(args, &cache));
    for spec in &mut specs {
        spec.config.q8_twin_dir = q8_twins.clone();
        spec.config.bf16_twin_dir = bf16_twins.clone();
    }
    Ok(specs)
}

/// Where Q5_0 models get their Q8_0 twins (`gantry_engine`'s `q5_as_q8`).
fn q8_twin_dir(args: &ServeArgs, models_cache: &Path) -> Option<PathBuf> {
    twin_dir(args.q5_as_q8, args.n_gpu_layers, models_cache, "q8-twins")
}

/// Where embedding models get their BF16 twins (`gantry_engine`'s `f32_as_bf16`).
fn bf16_twin_dir(args: &ServeArgs, models_cache: &Path) -> Option<PathBuf> {
    bf16_twins(args.f32_as_bf16, args.n_gpu_layers, models_cache)
}

/// Where embedding models get their BF16 twins, for `serve` and `models embed` alike.
pub(crate) fn bf16_twins(choice: TwinArg, n_gpu_layers: Option<u32>, models_cache: &Path) -> Option<PathBuf> {
    twin_dir(choice, n_gpu_layers, models_cache, "bf16-twins")
}

/// The folder `name` beside the models cache, where twins are written: unless `choice` turned
/// them off or layers may go to a GPU (whose kernels trade differently).
fn twin_dir(choice: TwinArg, n_gpu_layers: Option<u32>, models_cache: &Path, name: &str) -> Option<PathBuf> {
    let cpu_only = !gantry_engine::gpu_backend_present() || n_gpu_layers == Some(0);
    (choice == TwinArg::Auto && cpu_only).then(|| models_cache.with_file_name(name))
}

/// A model with the flags' engine settings.
fn spec(args: &ServeArgs, id: String, path: PathBuf, mmproj: Option<PathBuf>) -> ModelSpec {
    let mut config = EngineConfig::new(&path);
    config.mmproj_path = mmproj;
    config.ctx_size = args.ctx_size;
    config.parallel = args.parallel.unwrap_or(DEFAULT_PARALLEL);
    config.threads = args.threads;
    config.batch_size = args.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
    config.max_queue = args.max_queue;
    config.max_running_per_key = args.max_running_per_key;
    config.host_cache_bytes = args.cache_ram.saturating_mul(1 << 20);
    config.kv_layout = if args.kv_unified { KvLayout::Unified } else { KvLayout::PerSequence };
    config.kv_type = args.kv_type;
    config.special_tokens_in_content = args.special_tokens_in_content;
    config.deterministic_greedy = args.deterministic_greedy;
    config.device_sampling = match args.device_sampling {
        crate::cli::DeviceSamplingArg::Auto => gantry_engine::DeviceSampling::Auto,
        crate::cli::DeviceSamplingArg::On => gantry_engine::DeviceSampling::On,
        crate::cli::DeviceSamplingArg::Off => gantry_engine::DeviceSampling::Off,
    };
    config.kv_copies = match args.kv_copies {
        crate::cli::KvCopiesArg::Auto => None,
        crate::cli::KvCopiesArg::Host => Some(gantry_engine::StreamCopies::ThroughHost),
        crate::cli::KvCopiesArg::Device => Some(gantry_engine::StreamCopies::OnDevice),
    };
    config.offload = gantry_engine::Offload { gpu_layers: args.n_gpu_layers, main_gpu: args.main_gpu };
    config.speculation = gantry_engine::SpeculationConfig {
        mode: match args.speculate {
            crate::cli::SpeculateArg::Auto => gantry_engine::Speculate::Auto,
            crate::cli::SpeculateArg::Always => gantry_engine::Speculate::Always,
            crate::cli::SpeculateArg::Off => gantry_engine::Speculate::Off,
        },
        draft_max: args.draft_max,
    };
    let created = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    config.metrics_label = id.clone();
    // Settings left at their defaults may be lowered to fit the memory budget; given ones not.
    let shrinkable = Shrinkable { parallel: args.parallel.is_none(), batch: args.batch_size.is_none() };
    // An unreadable file is served as a chat model: its load then says what is wrong with it.
    let capabilities = gantry_engine::Capabilities::read(&path).unwrap_or_else(|e| {
        tracing::warn!(model = %path.display(), "could not read what the model can do: {e}");
        gantry_engine::Capabilities::default()
    });
    ModelSpec {
        id,
        aliases: Vec::new(),
        config,
        pin: false,
        idle_unload: None,
        created,
        shrinkable,
        capabilities,
        prices: Vec::new(),
    }
}

fn read_models_file(args: &ServeArgs, file: &Path, cache: &Path) -> anyhow::Result<Vec<ModelSpec>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading the models file {}", file.display()))?;
    let parsed: ModelsFile = toml::from_str(&text).with_context(|| format!("the models file {}", file.display()))?;
    let base = file.parent().unwrap_or(Path::new("."));
    // A relative path names a file beside the models file; anything else stays a catalogue name.
    let beside = |p: &str| -> String {
        let candidate = base.join(p);
        if Path::new(p).is_relative() && candidate.is_file() {
            candidate.to_string_lossy().into_owned()
        } else {
            p.to_string()
        }
    };
    let mut specs = Vec::new();
    for entry in parsed.model {
        let name = beside(&entry.model);
        let path = models::resolve_model(&name, cache)
            .with_context(|| format!("{}: model {:?}", file.display(), entry.model))?;
        let mmproj = match &entry.mmproj {
            Some(p) => Some(PathBuf::from(beside(&p.to_string_lossy()))),
            None => models::resolve_projector(&name, cache)?,
        };
        let id = entry.id.clone().unwrap_or_else(|| model_id_from_path(&path));
        let mut spec = spec(args, id, path, mmproj);
        spec.config.ctx_size = entry.ctx_size.unwrap_or(spec.config.ctx_size);
        spec.config.parallel = entry.parallel.unwrap_or(spec.config.parallel);
        if let Some(kv_type) = &entry.kv_type {
            spec.config.kv_type = kv_type
                .parse()
                .map_err(|e: String| anyhow::anyhow!(e))
                .with_context(|| format!("{}: model {:?}: kv_type", file.display(), entry.model))?;
        }
        spec.shrinkable.parallel &= entry.parallel.is_none();
        spec.aliases = entry.aliases;
        spec.pin = entry.pin;
        spec.idle_unload = entry.idle_unload_s.map(Duration::from_secs);
        for (tier, rates) in &entry.price {
            let context = || format!("{}: model {:?}: price.{tier}", file.display(), entry.model);
            let tier = crate::prices::parse_tier(tier).map_err(anyhow::Error::msg).with_context(context)?;
            let price = crate::prices::parse_rates(rates).map_err(anyhow::Error::msg).with_context(context)?;
            spec.prices.push((tier, price));
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// The GGUF models in `dir`, sorted by name, each with the projector whose name shares the
/// longest start with its own (`mmproj-NAME.gguf`, `NAME-mmproj-f16.gguf`, …).
fn scan_dir(dir: &Path) -> anyhow::Result<Vec<(PathBuf, Option<PathBuf>)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading --models-dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    files.sort();
    let is_projector =
        |p: &PathBuf| p.file_name().is_some_and(|n| n.to_string_lossy().to_ascii_lowercase().contains("mmproj"));
    let (projectors, models): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(is_projector);
    let mut paired: Vec<(PathBuf, Option<PathBuf>)> = models.into_iter().map(|m| (m, None)).collect();
    for projector in projectors {
        let name = model_id_from_path(&projector);
        let name = name.strip_prefix("mmproj-").or_else(|| name.strip_prefix("mmproj_")).unwrap_or(&name).to_string();
        let best = paired
            .iter_mut()
            .map(|(m, p)| (crate::pool::common_prefix_len(&model_id_from_path(m), &name), m, p))
            .filter(|(shared, _, _)| *shared >= 8)
            .max_by_key(|(shared, _, _)| *shared);
        match best {
            Some((_, _, slot)) if slot.is_none() => *slot = Some(projector),
            _ => {
                tracing::warn!(projector = %projector.display(), "no model in --models-dir to pair this projector with; ignored")
            }
        }
    }
    if paired.is_empty() {
        anyhow::bail!("--models-dir {} holds no .gguf model", dir.display());
    }
    Ok(paired)
}

/// Ids and aliases must each name one model.
fn check_names(specs: &[ModelSpec]) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    for name in specs.iter().flat_map(|s| std::iter::once(&s.id).chain(&s.aliases)) {
        if name.is_empty() {
            anyhow::bail!("a model id or alias is empty");
        }
        if !seen.insert(name.as_str()) {
            anyhow::bail!(
                "two models are served as `{name}`: give one of them another id (ID=MODEL, or id in the models file)"
            );
        }
    }
    Ok(())
}

/// Loaded models share the cores. Unless `--threads` says otherwise each gets its share of
/// them, so two busy models run side by side; where their threads still outnumber the cores,
/// their decode steps take turns: spinning OpenMP threads of two models on the same cores
/// collapse, and a model alone on its share loses little (docs/several-models.md has the figures).
fn share_cores(specs: &mut [ModelSpec], threads: Option<u32>, cores: u32) {
    let n = specs.len() as u32;
    if n < 2 {
        return;
    }
    let each = threads.unwrap_or((cores / n).max(1));
    let turns = (each * n > cores).then(|| Arc::new(std::sync::Mutex::new(())));
    for spec in specs {
        spec.config.threads = Some(each);
        spec.config.decode_turns = turns.clone();
    }
}

/// `ID=MODEL` → (`Some(ID)`, `MODEL`); a plain path or name → (`None`, it). A path holding `=`
/// stays whole when the part before it looks like a path.
fn split_model_arg(arg: &str) -> (Option<&str>, &str) {
    match arg.split_once('=') {
        Some((id, model)) if !id.is_empty() && !id.contains('/') && !model.is_empty() => {
            (Some(id.trim()), model.trim())
        }
        _ => (None, arg),
    }
}

/// A model's id when none is given: its file name without the extension.
pub(crate) fn model_id_from_path(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

#[cfg(test)]
mod tests;
