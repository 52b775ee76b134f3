//! One comparison: every server of a pair started once and kept up, then measured level by
//! level in A-B-B-A order (the order flips each pass), so drift on the host weighs on all alike.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::json;

use crate::host::{busy_share, loadavg};
use crate::load::{run_level, run_open_level, stream_request, Target};
use crate::pairs::Pair;
use crate::plan::Plan;
use crate::report::Comparison;
use crate::runs::ServerRun;
use crate::scopes;
use crate::servers::{self, Kind, Running, ServerSettings};
use crate::workloads::{self, Request};
use crate::Cli;

struct Up {
    running: Running,
    target: Target,
    run: ServerRun,
    /// cache-scopes (Gantry only): the keys of each combination's tenants.
    scope_keys: Vec<(scopes::Tenancy, Vec<String>)>,
}

async fn start_server(kind: Kind, bin: &Path, cli: &Cli, settings: &ServerSettings) -> Result<Up> {
    if !bin.is_file() {
        bail!("{} binary {} not found", kind.label(), bin.display());
    }
    let load_before = loadavg();
    let running = servers::start(kind, bin, settings).await?;
    // No connection reuse: llama-server (cpp-httplib) closes idle keep-alive connections, and a
    // request racing that close fails. A fresh localhost connection per request costs both the same.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(900)).pool_max_idle_per_host(0).build()?;
    let target = Target {
        client,
        base_url: running.base_url.clone(),
        api_keys: running.api_key.iter().cloned().collect(),
        model: running.model_id.clone(),
        completions: cli.completions,
    };
    let hello =
        Request { temperature: cli.temperature, ..Request::greedy(json!([{"role": "user", "content": "Say hello."}])) };
    let warm = stream_request(&target, hello, 8).await;
    if let Some(e) = warm.error {
        let tail = running.log_tail();
        running.stop().await.ok();
        bail!("{} warm-up failed: {e}\n{tail}", kind.label());
    }
    let cpu_features = running.cpu_features().await;
    eprintln!("[bench] {} runs CPU kernels: {}", kind.label(), cpu_features.as_deref().unwrap_or("unknown"));
    let gpu_offload = if settings.gpu { Some(check_gpu_offload(&running, &settings.model).await?) } else { None };
    let run = ServerRun {
        name: kind.label().to_string(),
        version: running.version.clone(),
        command: running.command.clone(),
        cpu_features: cpu_features.unwrap_or_else(|| "unknown".into()),
        gpu_offload,
        load_before,
        levels: Vec::new(),
    };
    Ok(Up { running, target, run, scope_keys: Vec::new() })
}

/// GPU mode: what the server says of its offload. A Gantry that found no GPU (a CPU build, or
/// no usable driver) would make the comparison meaningless, so it stops the run; llama-server's
/// log is not ours to rely on, so a missing or partial offload there is written into the report
/// and warned about instead.
async fn check_gpu_offload(running: &Running, model: &Path) -> Result<String> {
    let offload = running.gpu_offload().await;
    let label = running.kind.label();
    let model_bytes = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
    if offload.complete(model_bytes) {
        return Ok(offload.describe());
    }
    if running.kind == Kind::Gantry {
        bail!(
            "Gantry reports no GPU ({}): is --gantry-bin the CUDA build (`make build-gpu`), and does it find the \
             driver, libcudart and libcublas (LD_LIBRARY_PATH)?\n{}",
            offload.describe(),
            running.log_tail()
        );
    }
    eprintln!(
        "[bench] warning: {label} may not run wholly on the GPU: {} (built with REFERENCE_CUDA=1?)",
        offload.describe()
    );
    Ok(format!("{}; NOT CONFIRMED on the GPU", offload.describe()))
}

pub(crate) async fn compare(
    pair: &Pair,
    cli: &Cli,
    settings: &ServerSettings,
    workloads: &Plan,
    warnings: &mut Vec<String>,
) -> Result<Comparison> {
    eprintln!("[bench] == {} ==", pair.title);
    let mut up: Vec<Up> = Vec::new();
    for name in cli.servers() {
        let (kind, bin) = match name.as_str() {
            "gantry" => (Kind::Gantry, pair.gantry.as_ref()),
            "reference" | "llama-server" => (Kind::Reference, pair.reference.as_ref()),
            "reference-tuned" | "tuned" => (Kind::TunedReference, pair.reference.as_ref()),
            other => bail!("unknown server {other:?} (gantry, reference, reference-tuned)"),
        };
        let Some(bin) = bin else {
            eprintln!("[bench] no {} binary for {}; skipping it", kind.label(), pair.title);
            continue;
        };
        match start_server(kind, bin, cli, settings).await {
            Ok(mut u) => {
                let tenancies = workloads.iter().filter_map(|(w, _)| w.tenancy.filter(|_| kind == Kind::Gantry));
                for tenancy in tenancies.collect::<Vec<_>>() {
                    match scopes::create_keys(&u.running, tenancy).await {
                        Ok(keys) => u.scope_keys.push((tenancy, keys)),
                        Err(e) => {
                            u.running.stop().await.ok();
                            for u in up {
                                u.running.stop().await.ok();
                            }
                            return Err(e.context("creating the cache-scopes keys"));
                        }
                    }
                }
                up.push(u)
            }
            Err(e) => {
                for u in up {
                    u.running.stop().await.ok();
                }
                return Err(e.context(format!("starting {}", kind.label())));
            }
        }
    }
    for pass in 0..cli.passes {
        for (workload, plan) in workloads {
            for &(concurrency, requests) in plan {
                // A-B-B-A: the first server first on even passes, last on odd ones.
                let order: Vec<usize> =
                    if pass % 2 == 0 { (0..up.len()).collect() } else { (0..up.len()).rev().collect() };
                for i in order {
                    if workload.kind.gantry_only() && up[i].running.kind != Kind::Gantry {
                        continue;
                    }
                    // traffic: a full sweep takes minutes per server, so it runs in the first
                    // --traffic-passes passes only.
                    let traffic = workload.kind == workloads::Kind::Traffic;
                    if traffic && pass >= cli.traffic_passes {
                        continue;
                    }
                    let mut target = up[i].target.clone();
                    if let Some(tenancy) = workload.tenancy {
                        let keys = up[i].scope_keys.iter().find(|(t, _)| *t == tenancy).map(|(_, k)| k.clone());
                        target.api_keys = keys.unwrap_or_default();
                    }
                    let label = up[i].run.name.clone();
                    if let Some(busy) = busy_share(Duration::from_secs(1)).await {
                        if busy > 0.15 {
                            let w = format!(
                                "{label} {} c={concurrency} pass {pass}: {:.0}% of the CPU busy with other work just before",
                                workload.label(),
                                busy * 100.0
                            );
                            eprintln!("[bench] warning: {w}");
                            warnings.push(w);
                        }
                    }
                    eprintln!("[bench] pass {pass} {label} {} c={concurrency} n={requests} ...", workload.label());
                    let steps_before = up[i].running.step_profile().await;
                    let r = match workload.traffic.as_ref().and_then(|t| t.rate) {
                        Some(rate) => run_open_level(&target, workload, pass, requests, rate).await,
                        None => run_level(&target, workload, pass, concurrency, requests).await,
                    };
                    if let (Some(before), Some(after)) = (steps_before, up[i].running.step_profile().await) {
                        eprintln!("[bench]   Gantry's steps: {}", after.since(&before).describe());
                    }
                    eprintln!(
                        "[bench]   {:.1} tok/s ({} tokens; {} of {} prompt tokens cached), TTFT p50 {} ms, ITL p50 {} ms, {} failed{}",
                        r.tokens_per_s,
                        r.completion_tokens,
                        r.cached_tokens,
                        r.prompt_tokens,
                        r.ttft_p50_ms.map(|v| format!("{v:.0}")).unwrap_or("n/a".into()),
                        r.itl_p50_ms.map(|v| format!("{v:.1}")).unwrap_or("n/a".into()),
                        r.failed,
                        r.first_error.as_ref().map(|e| format!(" (first: {e})")).unwrap_or_default()
                    );
                    up[i].run.levels.push(r);
                }
            }
        }
    }
    let mut runs = Vec::new();
    for u in up {
        u.running.stop().await?;
        runs.push(u.run);
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // let the servers' memory go
    Ok(Comparison { title: pair.title.clone(), kernels: pair.kernels.clone(), runs })
}
