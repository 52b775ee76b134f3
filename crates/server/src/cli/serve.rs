//! `gantry serve`: load the model, open the accounts database, bind, serve until a signal.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gantry_accounts::{Accounts, Meter, MeterConfig};

use crate::cli::ServeArgs;
use crate::pool::{self, EngineLoader, ModelPool, PoolOptions};
use crate::router::{router, routes, RouterOptions, Routes};
use crate::state::AppState;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let admin_token = args.admin_token.as_deref().filter(|t| !t.is_empty());
    if let Some(token) = admin_token {
        crate::admin::guard::check_token_strength(token).map_err(anyhow::Error::msg)?;
    }
    warn_about_fault_injection();
    // Before anything slow: a trace export asked for but impossible stops the start at once.
    let trace_export = crate::telemetry::traces::start_from_env()?;
    let mut specs = crate::cli::model_config::model_specs(&args)?;
    let first_id = specs[0].id.clone();
    // A models file's prices, then the flags', which win where both price a model's tier.
    let file_prices = specs.iter().flat_map(|s| s.prices.iter().map(|(tier, price)| (s.id.clone(), *tier, *price)));
    let prices: Vec<crate::prices::PriceEntry> = file_prices.chain(args.prices.iter().cloned()).collect();
    // Bound before anything slow (the model load): a port already taken stops the server at
    // once. Clients that connect meanwhile wait in the backlog until it serves.
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let admin_listener = bind_if_asked(args.admin_listen.as_deref(), "--admin-listen").await?;
    let metrics_listener = bind_if_asked(args.metrics_listen.as_deref(), "--metrics-listen").await?;
    if args.metrics_compat == Some(crate::cli::serve_args::MetricsCompat::Vllm) {
        crate::telemetry::export_vllm_aliases(&first_id);
    }

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
    let kernels = match args.cpu_kernels {
        crate::cli::CpuKernelsArg::Gantry => gantry_engine::CpuKernels::Gantry,
        crate::cli::CpuKernelsArg::GantryAvx2 => gantry_engine::CpuKernels::GantryAvx2,
        crate::cli::CpuKernelsArg::GantryAvxVnni => gantry_engine::CpuKernels::GantryAvxVnni,
        crate::cli::CpuKernelsArg::Ggml => gantry_engine::CpuKernels::Ggml,
    };
    // Every model the server may load: whether ggml's repacked weight copies are needed depends
    // on their types, and ggml asks once per process.
    let model_paths: Vec<&std::path::Path> = specs.iter().map(|s| s.config.model_path.as_path()).collect();
    gantry_engine::serve_k_quant_copies(
        args.k_quant_copies == crate::cli::TwinArg::Auto && args.n_gpu_layers.is_none_or(|n| n == 0),
    );
    crate::telemetry::report_cpu_backend(kernels, &model_paths)?;
    crate::telemetry::report_accelerators(args.n_gpu_layers.is_some_and(|n| n > 0));
    if let Some(endpoint) = &args.kv_events_endpoint {
        let pod = args.kv_events_pod.clone().unwrap_or_else(hostname);
        let publisher = crate::kv_events::start(endpoint, &pod).await?;
        for spec in &mut specs {
            spec.config.kv_events = Some(publisher.sink(&spec.id));
        }
    }
    let budget = args.max_memory.unwrap_or_else(pool::default_budget);
    serve_k_quant_copies_where_they_fit(&specs, budget)?;
    for spec in &mut specs {
        if let Some(refit) = pool::fit_to_budget(&mut spec.config, spec.shrinkable, budget)? {
            tracing::warn!(
                model = %spec.id,
                parallel = refit.after.0,
                batch_size = refit.after.1,
                estimated = refit.need,
                budget,
                "fewer slots or a smaller batch than asked for ({} and {}), so the model fits the memory budget; raise --max-memory to keep them",
                refit.before.0,
                refit.before.1
            );
        }
    }
    let models =
        ModelPool::new(specs, Box::new(EngineLoader), PoolOptions { budget, wait_for_room: Duration::from_secs(30) });
    let estimates =
        models.check_budget().map_err(|e| anyhow::anyhow!("{e}; raise --max-memory or serve a smaller model"))?;
    tracing::info!(budget, models = models.specs().len(), estimated = ?estimates, "memory budget for loaded models");
    // The first model and the pinned ones load now, so a model that cannot load stops the
    // server at start rather than failing its first request.
    let at_start: Vec<String> =
        models.specs().iter().enumerate().filter(|(i, s)| *i == 0 || s.pin).map(|(_, s)| s.id.clone()).collect();
    for id in at_start {
        drop(models.acquire(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    models.start_idle_unloader();

    let state = AppState {
        models: models.clone(),
        accounts: accounts.clone(),
        images: crate::openai::images::ImageFetcher {
            max_images: args.max_images,
            max_total_bytes: args.max_image_bytes,
            allowed_private_hosts: args.allow_image_hosts.clone(),
            max_pixels: args.max_image_pixels,
            ..Default::default()
        },
        meter: meter.clone(),
        prices: Arc::new(crate::prices::PriceList::new(&prices)),
        admin_token: admin_token.map(Arc::from),
        draining: Default::default(),
        stats: Default::default(),
        prepare_gate: {
            let total = args.prepare_concurrency.unwrap_or_else(crate::openai::prepare_gate::default_total);
            let per_key =
                args.prepare_concurrency_per_key.unwrap_or_else(|| crate::openai::prepare_gate::default_per_key(total));
            crate::openai::prepare_gate::PrepareGate::new(total, per_key)
        },
        response_retention: Duration::from_secs(u64::from(args.responses_retention_days) * 86_400),
        response_storage: crate::response_storage::ResponseStorage {
            quota: gantry_accounts::StoredQuota {
                rows: args.stored_responses_per_key,
                bytes: args.stored_response_bytes_per_key,
            },
            max_response_bytes: args.max_stored_response_bytes,
            watched_dir: Some(data_dir.clone()),
            min_free_bytes: args.min_free_disk,
        },
        batches: crate::batches::BatchSettings {
            quota: gantry_accounts::FileQuota { files: args.files_per_key, bytes: args.file_bytes_per_key },
            max_file_bytes: args.max_file_bytes,
            concurrency: args.batch_concurrency,
            claim_timeout: Duration::from_secs_f64(args.heartbeat_timeout),
            wake: Default::default(),
        },
    };
    state.stats.start_sampling();
    crate::batches::start_runner(state.clone());
    let draining = state.draining.clone();
    let database_state = crate::health::DatabaseState::default();
    let options = || RouterOptions {
        body_limit: args.body_limit,
        body_read_timeout: Duration::from_secs_f64(args.body_read_timeout),
        auth_failures_per_minute: args.auth_failures_per_minute,
        public_metrics: args.public_metrics,
        database_state: database_state.clone(),
    };
    let metrics_app = metrics_listener.map(|listener| (listener, routes(state.clone(), options(), Routes::Metrics)));
    // With --admin-listen the operator's routes leave the public listener for their own.
    let (app, admin) = match admin_listener {
        None => (router(state, options()), None),
        Some(listener) => {
            let admin_app = routes(state.clone(), options(), Routes::Admin);
            (routes(state, options(), Routes::Public), Some((listener, admin_app)))
        }
    };
    let limits = crate::connections::ConnectionLimits {
        max_connections: args.max_connections,
        max_per_address: args.max_connections_per_address,
        trusted_proxies: args.trusted_proxy.clone().unwrap_or_default(),
        header_read_timeout: Duration::from_secs_f64(args.header_read_timeout),
        write_timeout: Duration::from_secs_f64(args.write_timeout),
        max_age: Duration::from_secs_f64(args.max_connection_age),
    };

    let addr = listener.local_addr()?;
    let store_flag = match &args.data.database_url {
        Some(_) => "--database-url \"$GANTRY_DATABASE_URL\"".to_string(),
        None => format!("--data-dir {}", data_dir.display()),
    };
    let admin_stop = tokio_util::sync::CancellationToken::new();
    let admin_server = match admin {
        Some((listener, admin_app)) => {
            let addr = listener.local_addr()?;
            println!("Admin API, console and /metrics at http://{addr} (not on the public listener)");
            let stop = admin_stop.clone();
            Some(tokio::spawn(crate::connections::serve(listener, admin_app, limits.clone(), stop.cancelled_owned())))
        }
        None => None,
    };
    let metrics_server = match metrics_app {
        Some((listener, metrics_app)) => {
            println!(
                "/metrics also at http://{}/metrics (open: only the picker and Prometheus should reach it)",
                listener.local_addr()?
            );
            let stop = admin_stop.clone();
            Some(tokio::spawn(crate::connections::serve(listener, metrics_app, limits.clone(), stop.cancelled_owned())))
        }
        None => None,
    };
    print_banner(&addr.to_string(), &first_id, new_key.as_deref(), &store_flag);
    if models.specs().len() > 1 {
        let others: Vec<String> = models.specs()[1..].iter().map(|s| format!("`{}`", s.id)).collect();
        println!(
            "Also serving {} (each loads when a request first names it; memory budget {budget} bytes)",
            others.join(", ")
        );
    }

    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let failed_models = models.clone();
    let engine_failed = async move { failed_models.failed().await };
    let stop_admin = admin_stop.clone();
    let server = crate::connections::serve(listener, app, limits, async move {
        tokio::select! {
            _ = shutdown_signal() => {
                // Readiness turns 503 and admission stops at once; the listener stays open for
                // the drain delay, so probes and load balancers see the 503 and move traffic.
                draining.start();
                if args.drain_delay > 0 {
                    tracing::info!(drain_delay_seconds = args.drain_delay, "draining: not ready, refusing new requests");
                    tokio::time::sleep(Duration::from_secs(args.drain_delay)).await;
                }
                tracing::info!(
                    grace_seconds = args.shutdown_grace,
                    "shutting down: no new connections, finishing requests"
                )
            }
            // Its requests were already answered with errors; stop, and exit non-zero below.
            _ = engine_failed => tracing::error!("the inference engine failed: stopping so a supervisor restarts the server"),
        }
        stop_admin.cancel();
        let _ = signalled_tx.send(());
    });
    let mut server = std::pin::pin!(server);
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
    // Also when the public listener failed on its own: the admin listener must not outlive it.
    admin_stop.cancel();
    for (name, side) in [("admin", admin_server), ("metrics", metrics_server)] {
        let Some(side) = side else { continue };
        // Their requests are short; one still running after this is cut with the process.
        match tokio::time::timeout(Duration::from_secs(5), side).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, listener = name, "a listener failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, listener = name, "a listener's task failed"),
            Ok(Ok(Ok(()))) | Err(_) => {}
        }
    }
    let stopping = models.clone();
    tokio::task::spawn_blocking(move || stopping.shutdown()).await?;
    // Every request that reached the engine has its usage record journalled before exit, and
    // stored in the database unless it is down (then the next start replays the outbox).
    meter.shutdown(Duration::from_secs(10)).await;
    // The last requests' spans, settlement included, leave before the process does.
    if let Some(export) = trace_export {
        tokio::task::spawn_blocking(move || export.shutdown()).await?;
    }
    accounts.close().await;
    if let Some(why) = models.failure() {
        anyhow::bail!("the inference engine failed ({why}); exiting so a supervisor restarts the server");
    }
    tracing::info!("stopped");
    Ok(())
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

/// A test build (`fault-injection`) armed by `GANTRY_FAULTS` panics requests on purpose: said
/// loudly at start, so no one mistakes it for a server to share. Set where the hook is not
/// compiled in, the variable is said to do nothing.
fn warn_about_fault_injection() {
    let Ok(value) = std::env::var(gantry_engine::FAULTS_ENV) else { return };
    if gantry_engine::fault_injection_armed() {
        tracing::warn!("FAULT INJECTION ARMED ({}={value}): prompts with `gantry-fault:<point>@<tokens>` make their request panic; a test build, never to be shared", gantry_engine::FAULTS_ENV);
    } else if !gantry_engine::fault_injection_compiled() {
        tracing::warn!(
            "{} is set, but this build has no fault injection (only test builds do): ignored",
            gantry_engine::FAULTS_ENV
        );
    } else {
        tracing::warn!(
            "{}={value:?} is not `{}`: fault injection stays off",
            gantry_engine::FAULTS_ENV,
            gantry_engine::FAULTS_ARMED
        );
    }
}

/// The listener `flag` asks for at `addr`, if it does.
async fn bind_if_asked(addr: Option<&str>, flag: &str) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {flag} {addr}"))?;
    Ok(Some(listener))
}

/// Keeps the K-quant copies (`--k-quant-copies auto`, served process-wide) only where every model
/// fits the memory budget with its copies at the settings asked for: where one would otherwise
/// get fewer slots or a smaller batch, or not fit at all, nothing is copied, as before the copies.
fn serve_k_quant_copies_where_they_fit(specs: &[pool::ModelSpec], budget: u64) -> anyhow::Result<()> {
    if !gantry_engine::k_quant_copies_served() {
        return Ok(());
    }
    for spec in specs {
        let need = spec.config.estimate_memory()?.total();
        if need > budget {
            gantry_engine::serve_k_quant_copies(false);
            tracing::info!(
                model = %spec.id,
                estimated = need,
                budget,
                "K-quant matrices are not copied: this model would not fit the memory budget with its copies"
            );
            return Ok(());
        }
    }
    tracing::info!(
        types = gantry_engine::k_quant_copied_types().join(" "),
        "K-quant products (1 to 512 activation rows) are served from 16-row copies made at load"
    );
    Ok(())
}
