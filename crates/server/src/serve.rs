//! `gantry serve`: load the model, open the accounts database, bind, serve until a signal.

use std::path::Path;
use std::sync::Arc;

use std::future::IntoFuture;
use std::time::Duration;

use anyhow::Context;
use gantry_accounts::{Accounts, Meter, MeterConfig};
use gantry_engine::EngineConfig;

use crate::app::{router, AppState, RouterOptions};
use crate::cli::ServeArgs;
use crate::models;
use crate::pool::{self, EngineLoader, ModelPool, ModelSpec, PoolOptions};

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let specs = model_specs(&args)?;
    let first_id = specs[0].id.clone();

    let data_dir = args.data.resolve();
    let accounts = args.data.open().await?;
    let new_key = initial_key(&accounts, args.api_key.as_deref()).await?;
    // Registers this process's heartbeat and replays what a previous run left in the outbox;
    // reservations of servers whose heartbeat stopped (a crash) are released from here on.
    let meter = Meter::start(
        accounts.clone(),
        MeterConfig {
            instance_name: args.instance_id.clone().unwrap_or_else(hostname),
            outbox_dir: data_dir.join("outbox"),
            heartbeat_timeout: Duration::from_secs_f64(args.heartbeat_timeout),
            reservation_ttl: Duration::from_secs(args.reservation_ttl),
            default_limits: gantry_accounts::DefaultLimits {
                rpm: args.default_rpm.unwrap_or(gantry_accounts::UNLIMITED_RPM),
                tpm: args.default_tpm.unwrap_or(gantry_accounts::UNLIMITED_TPM),
            },
        },
    )
    .await
    .context("starting the usage meter")?;
    tracing::info!(instance = meter.owner(), "metering as this instance");

    crate::telemetry::install();
    crate::telemetry::report_cpu_backend();
    let budget = args.max_memory.unwrap_or_else(pool::default_budget);
    let models = ModelPool::new(specs, Box::new(EngineLoader), PoolOptions { budget, wait_for_room: Duration::from_secs(30) });
    let estimates = models.check_budget().map_err(|e| anyhow::anyhow!("{e}; raise --max-memory or serve a smaller model"))?;
    tracing::info!(budget, models = models.specs().len(), estimated = ?estimates, "memory budget for loaded models");
    // The first model and the pinned ones load now, so a model that cannot load stops the
    // server at start rather than failing its first request.
    let at_start: Vec<String> =
        models.specs().iter().enumerate().filter(|(i, s)| *i == 0 || s.pin).map(|(_, s)| s.id.clone()).collect();
    for id in at_start {
        drop(models.acquire(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?);
    }

    let state = AppState {
        models: models.clone(),
        accounts: accounts.clone(),
        images: crate::images::ImageFetcher {
            max_images: args.max_images,
            max_total_bytes: args.max_image_bytes,
            allowed_private_hosts: args.allow_image_hosts.clone(),
            ..Default::default()
        },
        meter: meter.clone(),
        prices: Arc::new(args.prices.iter().cloned().collect()),
        admin_token: args.admin_token.as_deref().filter(|t| !t.is_empty()).map(Arc::from),
    };
    let app = router(state, RouterOptions { body_limit: args.body_limit });

    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    let store_flag = match &args.data.database_url {
        Some(_) => "--database-url \"$GANTRY_DATABASE_URL\"".to_string(),
        None => format!("--data-dir {}", data_dir.display()),
    };
    print_banner(&addr.to_string(), &first_id, new_key.as_deref(), &store_flag);
    if models.specs().len() > 1 {
        let others: Vec<String> = models.specs()[1..].iter().map(|s| format!("`{}`", s.id)).collect();
        println!("Also serving {} (each loads when a request first names it; memory budget {budget} bytes)", others.join(", "));
    }

    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let failed_models = models.clone();
    let engine_failed = async move { failed_models.failed().await };
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        tokio::select! {
            _ = shutdown_signal() => tracing::info!(
                grace_seconds = args.shutdown_grace,
                "shutting down: no new connections, finishing requests"
            ),
            // Its requests were already answered with errors; stop, and exit non-zero below.
            _ = engine_failed => tracing::error!("the inference engine failed: stopping so a supervisor restarts the server"),
        }
        let _ = signalled_tx.send(());
    });
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        result = &mut server => result?,
        _ = async {
            let _ = signalled_rx.await;
            tokio::time::sleep(Duration::from_secs(args.shutdown_grace)).await;
        } => {
            tracing::warn!("grace period over: cutting running requests");
            models.abort_all();
            // Cut streams end with an error event; give them a moment to flush.
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut server).await;
        }
    }
    let stopping = models.clone();
    tokio::task::spawn_blocking(move || stopping.shutdown()).await?;
    // Every request that reached the engine has its usage record journalled before exit, and
    // stored in the database unless it is down (then the next start replays the outbox).
    meter.shutdown(Duration::from_secs(10)).await;
    accounts.close().await;
    if let Some(why) = models.failure() {
        anyhow::bail!("the inference engine failed ({why}); exiting so a supervisor restarts the server");
    }
    tracing::info!("stopped");
    Ok(())
}

/// The models `--model` names (each `[ID=]MODEL`), resolved to files, with the engine settings
/// the flags give them all.
fn model_specs(args: &ServeArgs) -> anyhow::Result<Vec<ModelSpec>> {
    let cache = models::default_cache_dir();
    let mut specs: Vec<ModelSpec> = Vec::new();
    for (i, arg) in args.models.iter().enumerate() {
        let (id, name) = split_model_arg(arg);
        let path = models::resolve_model(name, &cache)?;
        let id = match (i, &args.model_name) {
            (0, Some(first)) => first.clone(),
            _ => id.map_or_else(|| model_id_from_path(&path), str::to_string),
        };
        if specs.iter().any(|s| s.id == id) {
            anyhow::bail!("two --model flags serve the id `{id}`: give one of them another with ID=MODEL");
        }
        let mut config = EngineConfig::new(&path);
        config.mmproj_path = match (&args.mmproj, i) {
            (Some(path), 0) => Some(path.clone()),
            _ => models::resolve_projector(name, &cache)?,
        };
        config.ctx_size = args.ctx_size;
        config.parallel = args.parallel;
        config.threads = args.threads;
        config.batch_size = args.batch_size;
        config.max_queue = args.max_queue;
        config.host_cache_bytes = args.cache_ram.saturating_mul(1 << 20);
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
        let pin = args.pins.contains(&id);
        specs.push(ModelSpec { id, config, pin, created });
    }
    if let Some(unknown) = args.pins.iter().find(|p| !specs.iter().any(|s| &s.id == *p)) {
        anyhow::bail!("--pin {unknown}: no --model serves that id");
    }
    share_cores(&mut specs, args.threads, gantry_engine::default_threads());
    Ok(specs)
}

/// Loaded models share the cores. Unless `--threads` says otherwise each gets its share of
/// them, so two busy models run side by side; where their threads still outnumber the cores,
/// their decode steps take turns. Measured on 2 cores with one stream on the 0.5B coder and one
/// on SmolLM2-135M at once: a core each 110 tokens/s together; both cores each, taking turns 61;
/// both cores each at once 34 (spinning OpenMP threads collapse). Alone on one core instead of
/// two, the coder decodes 3% slower and SmolLM2 10%.
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
        Some((id, model)) if !id.is_empty() && !id.contains('/') && !model.is_empty() => (Some(id.trim()), model.trim()),
        _ => (None, arg),
    }
}

/// `--api-key` registers that key; otherwise a first start with no key creates one, so a new
/// user always has a key to try. Returns a secret to print, if one was just created.
async fn initial_key(accounts: &Accounts, api_key: Option<&str>) -> anyhow::Result<Option<String>> {
    if let Some(secret) = api_key {
        accounts.ensure_key(secret, "serve --api-key").await.context("registering --api-key")?;
        return Ok(None);
    }
    if accounts.count_active_keys().await? == 0 {
        let created = accounts.create_key("default").await?;
        return Ok(Some(created.secret));
    }
    Ok(None)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` → `qwen2.5-coder-0.5b-instruct-q4_k_m`.
pub fn model_id_from_path(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

fn print_banner(addr: &str, model_id: &str, new_key: Option<&str>, store_flag: &str) {
    let base = format!("http://{addr}/v1");
    println!("Gantry is serving `{model_id}` at {base}");
    match new_key {
        Some(key) => {
            println!("Created your first API key (shown only once, keep it):");
            println!("  {key}");
            println!("Try it:");
            println!(
                "  curl {base}/chat/completions -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' -d '{{\"model\":\"{model_id}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
            );
        }
        None => {
            println!("Use a key from `gantry keys create --name NAME {store_flag}`:");
            println!(
                "  curl {base}/chat/completions -H \"Authorization: Bearer $KEY\" -H 'Content-Type: application/json' -d '{{\"model\":\"{model_id}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
            );
        }
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_flags_may_name_their_id() {
        assert_eq!(super::split_model_arg("coder=qwen2.5-coder-0.5b"), (Some("coder"), "qwen2.5-coder-0.5b"));
        assert_eq!(super::split_model_arg("/m/a.gguf"), (None, "/m/a.gguf"));
        assert_eq!(super::split_model_arg("small=/m/a=b.gguf"), (Some("small"), "/m/a=b.gguf"));
        assert_eq!(super::split_model_arg("/m/a=b.gguf"), (None, "/m/a=b.gguf"));
        assert_eq!(super::split_model_arg("=x"), (None, "=x"));
    }

    #[test]
    fn several_models_split_the_cores_and_take_turns_only_when_they_must() {
        let specs = |n: usize| -> Vec<super::ModelSpec> {
            (0..n)
                .map(|i| super::ModelSpec {
                    id: i.to_string(),
                    config: super::EngineConfig::new("m.gguf"),
                    pin: false,
                    created: 0,
                })
                .collect()
        };
        let shared = |threads: Option<u32>, cores: u32, n: usize| {
            let mut s = specs(n);
            super::share_cores(&mut s, threads, cores);
            (s[0].config.threads, s.iter().all(|m| m.config.decode_turns.is_some()))
        };
        assert_eq!(shared(None, 8, 1), (None, false), "one model keeps the default");
        assert_eq!(shared(None, 2, 2), (Some(1), false));
        assert_eq!(shared(None, 8, 3), (Some(2), false));
        assert_eq!(shared(None, 2, 3), (Some(1), true), "more models than cores take turns");
        assert_eq!(shared(Some(2), 2, 2), (Some(2), true), "--threads 2 twice on 2 cores take turns");
        assert_eq!(shared(Some(1), 4, 2), (Some(1), false));
    }

    #[test]
    fn model_id_is_the_file_stem() {
        let p = std::path::Path::new("/x/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
        assert_eq!(super::model_id_from_path(p), "qwen2.5-coder-0.5b-instruct-q4_k_m");
    }
}
