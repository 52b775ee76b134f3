//! `gantry keys …`, `gantry usage`, `gantry models …`.

use anyhow::Context;
use gantry_accounts::Accounts;

use crate::admin::keyspec::{format_time, key_view, nanos_to_usd};
use crate::admin::{csv_field, requests_csv, usage_csv, UsageParams};
use crate::cli::{DataDirArg, KeysCommand, ModelsCommand, OutputFormat, TenantsCommand, UsageArgs};
use crate::clock::now_ms;
use crate::models;

async fn open(data: &DataDirArg) -> anyhow::Result<Accounts> {
    data.open().await
}

/// For commands that read or change what exists: no database is an error, not a new one.
async fn open_existing(data: &DataDirArg) -> anyhow::Result<Accounts> {
    data.open_existing().await
}

pub async fn tenants(cmd: TenantsCommand) -> anyhow::Result<()> {
    match cmd {
        TenantsCommand::List { format, data } => {
            let tenants = open_existing(&data).await?.list_tenants().await?;
            match format {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&tenants)?),
                OutputFormat::Csv => {
                    println!("tenant,weight,active_keys");
                    for t in &tenants {
                        println!("{},{},{}", csv_field(&t.name), t.weight, t.active_keys);
                    }
                }
                OutputFormat::Table => {
                    println!("{:<24} {:>6} {:>11}", "TENANT", "WEIGHT", "ACTIVE_KEYS");
                    for t in &tenants {
                        println!("{:<24} {:>6} {:>11}", t.name, t.weight, t.active_keys);
                    }
                }
            }
        }
        TenantsCommand::Set { tenant, weight, data } => {
            let t = open(&data).await?.set_tenant_weight(&tenant, weight).await?;
            println!("Tenant {} weighs {} ({} active keys).", t.name, t.weight, t.active_keys);
        }
    }
    Ok(())
}

pub async fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    match cmd {
        KeysCommand::Create { name, settings, data } => {
            let spec = settings.to_fields(Some(name)).to_new_key().map_err(anyhow::Error::msg)?;
            let created = open(&data).await?.create_key_from(&spec).await?;
            eprintln!("Created key {} ({}). The secret is shown only once:", created.key.id, created.key.name);
            println!("{}", created.secret);
        }
        KeysCommand::List { data } => {
            let keys = open_existing(&data).await?.list_keys().await?;
            println!(
                "{:<6} {:<20} {:<12} {:<16} {:<8} {:>7} {:>9} {:>12} {:>10} {:<7} {:<20} {:<6} {:>6}",
                "ID",
                "NAME",
                "TENANT",
                "PREFIX",
                "STATUS",
                "RPM",
                "TPM",
                "BUDGET_TOK",
                "BUDGET_USD",
                "PERIOD",
                "EXPIRES",
                "CACHE",
                "WEIGHT"
            );
            let limit = |l: Option<i64>| l.map_or("-".to_string(), |n| n.to_string());
            for k in keys {
                let v = key_view(&k, None);
                println!(
                    "{:<6} {:<20} {:<12} {:<16} {:<8} {:>7} {:>9} {:>12} {:>10} {:<7} {:<20} {:<6} {:>6}",
                    k.id,
                    k.name,
                    k.tenant,
                    k.prefix,
                    v["status"].as_str().unwrap_or(""),
                    limit(k.rpm_limit),
                    limit(k.tpm_limit),
                    limit(k.budget.tokens),
                    k.budget.nanos.map_or("-".to_string(), |n| format!("{:.2}", nanos_to_usd(n))),
                    k.budget.period.as_str(),
                    k.expires_at.map_or("-".to_string(), format_time),
                    k.cache_scope.as_str(),
                    k.weight,
                );
            }
        }
        KeysCommand::Show { key, format, data } => {
            let accounts = open_existing(&data).await?;
            let k = accounts.find_key(&key).await?;
            let spend = accounts.spend(&k, now_ms()).await?;
            let v = key_view(&k, Some(&spend));
            match format {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&v)?),
                OutputFormat::Table | OutputFormat::Csv => {
                    for (field, value) in v.as_object().into_iter().flatten() {
                        let shown = match value {
                            serde_json::Value::String(s) => s.clone(),
                            serde_json::Value::Null => "-".into(),
                            other => other.to_string(),
                        };
                        println!("{field:<14} {shown}");
                    }
                }
            }
        }
        KeysCommand::Update { key, name, settings, data } => {
            let update = settings.to_fields(name).to_update().map_err(anyhow::Error::msg)?;
            let k = open_existing(&data).await?.update_key(&key, &update).await?;
            println!("{}", serde_json::to_string_pretty(&key_view(&k, None))?);
        }
        KeysCommand::Rotate { key, data } => {
            let created = open_existing(&data).await?.rotate_key(&key).await?;
            eprintln!(
                "Rotated key {} ({}); the old secret no longer works. The new one is shown only once:",
                created.key.id, created.key.name
            );
            println!("{}", created.secret);
        }
        KeysCommand::Revoke { key, data } => {
            let k = open_existing(&data).await?.revoke_key(&key).await?;
            println!("Revoked key {} ({}, {}…)", k.id, k.name, k.prefix);
        }
    }
    Ok(())
}

pub async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let params = UsageParams {
        key_name: args.key_name.clone(),
        tenant: args.tenant.clone(),
        model: args.model.clone(),
        since: args.since.clone(),
        until: args.until.clone(),
        batch_id: args.batch_id.clone(),
        group_by: args.by_day.then(|| "day".to_string()),
        format: None,
    };
    let query = params.to_query().map_err(anyhow::Error::msg)?;
    if args.requests {
        return usage_requests(&args, &query).await;
    }
    let rows = open_existing(&args.data).await?.usage_report(&query).await?;
    match args.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        OutputFormat::Csv => print!("{}", usage_csv(&rows)),
        OutputFormat::Table => {
            println!(
                "{:<20} {:>6} {:<12} {:<36} {:<10} {:<8} {:<38} {:>9} {:>13} {:>13} {:>17} {:>16} {:>12}",
                "KEY",
                "KEY_ID",
                "TENANT",
                "MODEL",
                "DAY",
                "TIER",
                "BATCH",
                "REQUESTS",
                "PROMPT_TOKENS",
                "CACHED_TOKENS",
                "COMPLETION_TOKENS",
                "REASONING_TOKENS",
                "COST_USD"
            );
            for r in rows {
                println!(
                    "{:<20} {:>6} {:<12} {:<36} {:<10} {:<8} {:<38} {:>9} {:>13} {:>13} {:>17} {:>16} {:>12.6}",
                    r.key_name,
                    r.key_id,
                    r.tenant,
                    r.model,
                    r.day.as_deref().unwrap_or("-"),
                    r.service_tier,
                    r.batch_id.as_deref().unwrap_or("-"),
                    r.requests,
                    r.prompt_tokens,
                    r.cached_tokens,
                    r.completion_tokens,
                    r.reasoning_tokens,
                    r.cost
                );
            }
        }
    }
    Ok(())
}

/// `gantry usage --requests`: one row per request, oldest first.
async fn usage_requests(args: &UsageArgs, query: &gantry_accounts::UsageQuery) -> anyhow::Result<()> {
    let rows = open_existing(&args.data).await?.usage_requests(query).await?;
    match args.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        OutputFormat::Csv => print!("{}", requests_csv(&rows)),
        OutputFormat::Table => {
            println!(
                "{:<42} {:<24} {:<16} {:<28} {:>7} {:>7} {:>10} {:>9} {:<9} {:<20} {:>9} {:<8} BATCH",
                "REQUEST_ID",
                "CLIENT_REQUEST_ID",
                "KEY",
                "MODEL",
                "PROMPT",
                "CACHED",
                "COMPLETION",
                "REASONING",
                "OUTCOME",
                "STARTED",
                "MS",
                "TIER"
            );
            for r in rows {
                println!(
                    "{:<42} {:<24} {:<16} {:<28} {:>7} {:>7} {:>10} {:>9} {:<9} {:<20} {:>9} {:<8} {}",
                    r.request_id,
                    r.client_request_id.as_deref().unwrap_or("-"),
                    r.key_name,
                    r.model,
                    r.prompt_tokens,
                    r.cached_tokens,
                    r.completion_tokens,
                    r.reasoning_tokens,
                    r.outcome,
                    format_time(r.started_at_ms.div_euclid(1000)),
                    r.finished_at_ms - r.started_at_ms,
                    r.service_tier,
                    r.batch_id.as_deref().unwrap_or("-")
                );
            }
        }
    }
    Ok(())
}

/// `models kv-quality`'s text when none is given: real prose, shipped with the binary.
const DEFAULT_QUALITY_TEXT: &str = include_str!("../../../../docs/architecture.md");

pub async fn models_cmd(cmd: ModelsCommand) -> anyhow::Result<()> {
    let cache = models::default_cache_dir();
    match cmd {
        ModelsCommand::Pull { name, source, quiet } => {
            let entry = models::find(&name).with_context(|| {
                format!(
                    "unknown model `{name}`; known: {}",
                    models::catalog().iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
                )
            })?;
            let opts = models::PullOptions { source, quiet, ..Default::default() };
            let path = models::pull(entry, &cache, &opts).await?;
            println!("{}", path.display());
            // A vision-language model comes with its projector (`--source` names the model only).
            if let Some(projector) = entry.projector.and_then(models::find) {
                let opts = models::PullOptions { source: None, ..opts };
                println!("{}", models::pull(projector, &cache, &opts).await?.display());
            }
        }
        ModelsCommand::KvQuality { model, kv_type, text, tokens, threads } => {
            let path = models::resolve_model(&model, &cache)?;
            let text = match text {
                Some(file) => std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?,
                None => DEFAULT_QUALITY_TEXT.to_string(),
            };
            let threads = threads.unwrap_or_else(gantry_engine::default_threads);
            let q = tokio::task::spawn_blocking(move || {
                gantry_engine::measure_kv_quality(&path, kv_type, &text, tokens, threads)
            })
            .await??;
            println!("kv type         {}", q.kv_type);
            println!("tokens          {}", q.tokens);
            println!("mean KL         {:.6} nats (against f16)", q.mean_kl);
            println!("max KL          {:.6} nats", q.max_kl);
            println!("top-1 agreement {:.2}%", q.top1_agreement * 100.0);
        }
        ModelsCommand::Embed { model, texts, threads, f32_as_bf16 } => {
            let path = models::resolve_model(&model, &cache)?;
            let threads = threads.unwrap_or_else(gantry_engine::default_threads) as i32;
            let twins = crate::cli::model_config::bf16_twins(f32_as_bf16, None, &cache);
            let answer = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let offload = gantry_engine::Offload::default();
                let embedder = gantry_engine::Embedder::start(&path, threads, &offload, None, twins.as_deref())?;
                let tokens: Vec<Vec<i32>> = texts.iter().map(|t| embedder.tokenize(t)).collect();
                let vectors = embedder.embed_blocking(tokens.clone())?;
                Ok(serde_json::json!({ "tokens": tokens, "embeddings": vectors }))
            })
            .await??;
            println!("{answer}");
        }
        ModelsCommand::List => {
            println!("{:<22} {:<46} {:>10} {:<7}", "NAME", "FILE", "SIZE", "CACHED");
            for row in models::list_rows(&cache) {
                let size = row.size.map_or("?".to_string(), |s| format!("{:.0} MB", s as f64 / 1e6));
                let name = if row.default { format!("{} *", row.name) } else { row.name.to_string() };
                println!("{:<22} {:<46} {:>10} {:<7}", name, row.file, size, if row.cached { "yes" } else { "no" });
            }
        }
    }
    Ok(())
}
