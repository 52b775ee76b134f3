//! The embeddings comparison (issue #55): Gantry's `/v1/embeddings` against llama-server
//! `--embeddings` on the same embedding GGUF (`--embedding-model`, all-MiniLM-L6-v2 in `make
//! bench`), as inputs per second at 1 and 16 concurrent requests of 32 inputs each. The inputs
//! are what a RAG application embeds: short queries and paragraph-long passages, mixed.
//!
//! The three servers stay up for the whole comparison and are measured in turn level by level,
//! the order reversing each pass, as the chat comparison is. llama-server runs twice: as its
//! docs start it for embeddings (`--embeddings`, 64 slots of the model's 512 tokens, batches of
//! its default 512 tokens), and with a logical and physical batch of 8192 tokens
//! (`BATCH_TOKENS`: many slots' inputs in one decode, as batching guides advise). Gantry is
//! judged against the faster of the two at each level (on 2 cores the default one: attention
//! over a batch costs its square).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::json;

use crate::runs::{GANTRY, REFERENCE, TUNED};
use crate::servers::{self, Kind, Running, ServerSettings};

/// Concurrent requests at each level.
pub(crate) const LEVELS: [usize; 2] = [1, 16];
/// Inputs per request.
pub(crate) const INPUTS_PER_REQUEST: usize = 32;
/// The logical and physical batch the second llama-server gets.
pub(crate) const BATCH_TOKENS: u32 = 8192;
/// The issue's target: Gantry's inputs per second over llama-server's, at every level.
pub(crate) const TARGET: f64 = 1.2;

/// Queries and passages as a retrieval application embeds them (about 10 to 90 tokens each).
const TEXTS: [&str; 10] = [
    "How do plants make food from sunlight?",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in the chloroplasts of plant cells. The oxygen it releases as a by-product is what most life on Earth breathes, and the sugar feeds the plant and, through it, almost every food chain.",
    "Why did share prices drop on Tuesday?",
    "The stock market fell sharply after the central bank raised interest rates by half a point, the largest increase in two decades, citing inflation that has stayed above its target for eighteen months. Bank shares led the fall, while bond yields rose to their highest level since 2007.",
    "Can I change a tuple after creating it in Python?",
    "Python lists are mutable sequences: items can be appended, removed or replaced in place. Tuples are immutable; to change one, build a new tuple from the old one's items.",
    "def moving_average(xs, n):\n    return [sum(xs[i - n + 1 : i + 1]) / n for i in range(n - 1, len(xs))]",
    "Which landmark stands in the French capital?",
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889 as the centrepiece of the World's Fair.",
    "golden retriever grooming tips",
];

/// One level's measurement on one server.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub server: &'static str,
    pub concurrency: usize,
    pub inputs_per_s: f64,
}

/// The settings both servers get: the model, the threads, slots for llama-server.
pub(crate) fn settings(model: &Path, threads: u32, ready_timeout: Duration) -> ServerSettings {
    ServerSettings {
        model: model.to_path_buf(),
        threads,
        parallel: 64,
        ctx_per_seq: 512,
        ready_timeout,
        gpu: false,
        embeddings: true,
    }
}

/// Runs the comparison and returns its markdown section (also printed).
pub(crate) async fn compare(
    gantry_bin: &Path,
    reference_bin: &Path,
    settings: &ServerSettings,
    passes: usize,
    requests: usize,
) -> Result<String> {
    let mut running = Vec::new();
    for kind in [Kind::Gantry, Kind::Reference, Kind::TunedReference] {
        let bin = if kind == Kind::Gantry { gantry_bin } else { reference_bin };
        let server = servers::start(kind, bin, settings).await.with_context(|| format!("starting {}", kind.label()))?;
        running.push(server);
    }
    let client = Arc::new(reqwest::Client::new());
    for server in &running {
        // One request each first: the model is loaded and its buffers allocated.
        one_request(&client, server, 0).await?;
    }
    let mut measured = Vec::new();
    for pass in 0..passes {
        for &c in &LEVELS {
            let mut order: Vec<&Running> = running.iter().collect();
            if pass % 2 == 1 {
                order.reverse();
            }
            for server in order {
                let rate = level(&client, server, c, requests.max(c)).await?;
                eprintln!("[bench] embeddings {} c={c} pass {pass}: {rate:.1} inputs/s", server.kind.label());
                measured.push(Measured { server: server.kind.label(), concurrency: c, inputs_per_s: rate });
            }
        }
    }
    let commands: Vec<(&str, &str)> = running.iter().map(|r| (r.kind.label(), r.command.as_str())).collect();
    let section = section(&measured, &commands);
    for server in running {
        server.stop().await?;
    }
    Ok(section)
}

/// `requests` requests of `INPUTS_PER_REQUEST` inputs, `concurrency` at a time: inputs per second.
async fn level(client: &Arc<reqwest::Client>, server: &Running, concurrency: usize, requests: usize) -> Result<f64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next) = (client.clone(), next.clone());
        let (url, key, model) = (server.base_url.clone(), server.api_key.clone(), server.model_id.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= requests {
                    return Ok::<(), anyhow::Error>(());
                }
                post(&client, &url, key.as_deref(), &model, i).await?;
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok((requests * INPUTS_PER_REQUEST) as f64 / start.elapsed().as_secs_f64())
}

async fn one_request(client: &reqwest::Client, server: &Running, i: usize) -> Result<()> {
    post(client, &server.base_url, server.api_key.as_deref(), &server.model_id, i).await
}

/// One request of `INPUTS_PER_REQUEST` texts, starting at text `i`; its answer checked.
async fn post(client: &reqwest::Client, base: &str, key: Option<&str>, model: &str, i: usize) -> Result<()> {
    let input: Vec<&str> = (0..INPUTS_PER_REQUEST).map(|j| TEXTS[(i + j) % TEXTS.len()]).collect();
    let mut request = client
        .post(format!("{base}/v1/embeddings"))
        .header("content-type", "application/json")
        .body(json!({"model": model, "input": input, "encoding_format": "float"}).to_string());
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await?;
    let status = response.status();
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await?).unwrap_or_default();
    let got = body["data"].as_array().map_or(0, Vec::len);
    if !status.is_success() || got != INPUTS_PER_REQUEST {
        bail!("{base}/v1/embeddings answered {status} with {got} vectors: {body}");
    }
    Ok(())
}

/// Means per server and level, Gantry's ratio against the faster llama-server, and the target's
/// verdict.
pub(crate) fn section(measured: &[Measured], commands: &[(&str, &str)]) -> String {
    let mean = |server: &str, c: usize| {
        let v: Vec<f64> =
            measured.iter().filter(|m| m.server == server && m.concurrency == c).map(|m| m.inputs_per_s).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Embeddings (issue #55)\n\nInputs per second, {INPUTS_PER_REQUEST} inputs per request, means over passes; Gantry against the faster llama-server, target ≥ {TARGET}× at every level.\n"
    );
    let _ = writeln!(
        md,
        "| concurrent requests | {GANTRY} | {REFERENCE} | {TUNED} | ratio | target |\n| --- | --- | --- | --- | --- | --- |"
    );
    for &c in &LEVELS {
        let (g, r, t) = (mean(GANTRY, c), mean(REFERENCE, c), mean(TUNED, c));
        let best = r.into_iter().chain(t).fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
        let (ratio, verdict) = match (g, best) {
            (Some(g), Some(b)) if b > 0.0 => {
                let ratio = g / b;
                (format!("{ratio:.2}"), if ratio >= TARGET { "met" } else { "missed" })
            }
            _ => ("-".into(), "not measured"),
        };
        let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let _ = writeln!(md, "| {c} | {} | {} | {} | {ratio} | {verdict} |", show(g), show(r), show(t));
    }
    let _ = writeln!(md);
    for (name, command) in commands {
        let _ = writeln!(md, "{name}: `{command}`  ");
    }
    let _ = writeln!(md);
    println!("{md}");
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_averages_passes_and_judges_each_level() {
        let m = |server, concurrency, inputs_per_s| Measured { server, concurrency, inputs_per_s };
        let measured = [
            m(GANTRY, 1, 100.0),
            m(GANTRY, 1, 140.0),
            m(REFERENCE, 1, 100.0),
            m(TUNED, 1, 90.0),
            m(GANTRY, 16, 100.0),
            m(REFERENCE, 16, 80.0),
            m(TUNED, 16, 100.0),
        ];
        let md = section(&measured, &[(GANTRY, "g"), (REFERENCE, "r")]);
        assert!(md.contains("| 1 | 120.0 | 100.0 | 90.0 | 1.20 | met |"), "{md}");
        assert!(md.contains("| 16 | 100.0 | 80.0 | 100.0 | 1.00 | missed |"), "against the faster: {md}");
        assert!(md.contains("Gantry: `g`"), "{md}");
    }
}
