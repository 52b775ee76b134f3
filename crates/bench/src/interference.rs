//! Batches beside interactive traffic (issue #56), Gantry only: what a big batch costs the
//! interactive requests running beside it, and what a batch gets of an idle server.
//!
//! - **Interference**: the same interactive load (streamed chat, half the sequences in a closed
//!   loop) alone, then while a batch of long lines fills every sequence; the ratio of their
//!   TTFT p50 (target: at most `TTFT_TARGET`). The batch's lines are preempted for the
//!   interactive requests (`gantry_requests_total{outcome="preempted"}`, reported).
//! - **Idle throughput**: a batch of `4 × parallel` lines on an idle server, from creation to
//!   `completed`, against the same requests sent directly, `parallel` at a time; the ratio of
//!   their completion tokens per second (target: at least `THROUGHPUT_TARGET`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::load::{stream_request, Target};
use crate::servers::Running;
use crate::stats::percentile;
use crate::workloads::Request;

/// Interactive TTFT p50 beside a batch over its value alone, at most.
pub(crate) const TTFT_TARGET: f64 = 1.10;
/// A batch's completion tokens per second on an idle server over the same requests sent
/// directly, at least.
pub(crate) const THROUGHPUT_TARGET: f64 = 0.90;
/// Completion tokens of each interactive request.
const INTERACTIVE_TOKENS: u32 = 32;
/// Completion tokens of each line of the idle batch (and of the direct requests it is held to).
const LINE_TOKENS: u32 = 64;

const QUESTIONS: [&str; 8] = [
    "Explain what a hash map is and when to use one.",
    "Write a Python function that reverses a linked list.",
    "What is the difference between a process and a thread?",
    "Summarise the causes of the French Revolution in a few sentences.",
    "How does HTTPS keep a connection private?",
    "Write a SQL query that finds the second highest salary in a table.",
    "Why is the sky blue?",
    "Give three tips for writing readable code.",
];

fn messages(i: usize) -> Value {
    json!([{"role": "user", "content": QUESTIONS[i % QUESTIONS.len()]}])
}

/// What the section reports.
#[derive(Debug, Clone)]
pub(crate) struct Interference {
    pub ttft_alone_ms: f64,
    pub ttft_beside_ms: f64,
    pub preempted: u64,
    pub batch_tokens_per_s: f64,
    pub direct_tokens_per_s: f64,
}

/// Runs both measurements on a Gantry server started for them and returns the section.
pub(crate) async fn measure(server: &Running, parallel: usize, requests: usize) -> Result<String> {
    let key = server.api_key.clone().context("Gantry runs with a key")?;
    let target = Target {
        client: reqwest::Client::new(),
        base_url: server.base_url.clone(),
        api_keys: vec![key.clone()],
        model: server.model_id.clone(),
        completions: false,
    };
    let concurrency = (parallel / 2).max(1);
    // Warm: the model loaded, its buffers allocated, and the prompts cached, as they are for
    // the measurement beside the batch.
    interactive(&target, concurrency, requests).await?;
    let ttft_alone = interactive(&target, concurrency, requests).await?;
    let big = lines(&server.model_id, parallel * 16, 512);
    let batch = create_batch(&target, &big).await?;
    wait(&target, &batch, |b| {
        b["request_counts"]["completed"].as_u64().unwrap_or(0) >= 1 || b["status"] != "in_progress"
    })
    .await?;
    let preempted_before = preempted(&target).await;
    let ttft_beside = interactive(&target, concurrency, requests).await?;
    let preempted = preempted(&target).await.saturating_sub(preempted_before);
    cancel(&target, &batch).await?;
    wait(&target, &batch, |b| b["status"] != "in_progress" && b["status"] != "cancelling").await?;

    let n = parallel * 4;
    let idle = lines(&server.model_id, n, LINE_TOKENS);
    let started = Instant::now();
    let batch = create_batch(&target, &idle).await?;
    let done = wait(&target, &batch, |b| b["status"] != "in_progress").await?;
    if done["status"] != "completed" {
        bail!("the idle batch ended {}: {done}", done["status"]);
    }
    let batch_tokens_per_s = done["usage"]["output_tokens"].as_f64().unwrap_or(0.0) / started.elapsed().as_secs_f64();
    let direct_tokens_per_s = direct(&target, parallel, n).await?;
    let m = Interference {
        ttft_alone_ms: ttft_alone,
        ttft_beside_ms: ttft_beside,
        preempted,
        batch_tokens_per_s,
        direct_tokens_per_s,
    };
    Ok(section(&m, concurrency, parallel, requests))
}

/// TTFT p50 (ms) of `requests` streamed chat requests, `concurrency` at a time.
async fn interactive(target: &Target, concurrency: usize, requests: usize) -> Result<f64> {
    let mut ttfts = Vec::new();
    let mut next = 0;
    while next < requests {
        let wave: Vec<_> = (next..(next + concurrency).min(requests))
            .map(|i| {
                let target = target.clone();
                tokio::spawn(
                    async move { stream_request(&target, Request::greedy(messages(i)), INTERACTIVE_TOKENS).await },
                )
            })
            .collect();
        next += wave.len();
        for sample in wave {
            let sample = sample.await?;
            if let Some(e) = sample.error {
                bail!("an interactive request failed: {e}");
            }
            ttfts.extend(sample.ttft.map(|s| s * 1000.0));
        }
    }
    percentile(&ttfts, 50.0).context("no interactive request streamed a token")
}

/// Completion tokens per second of `n` requests sent directly, `parallel` at a time.
async fn direct(target: &Target, parallel: usize, n: usize) -> Result<f64> {
    let started = Instant::now();
    let mut tokens = 0;
    for wave in (0..n).collect::<Vec<_>>().chunks(parallel) {
        let handles: Vec<_> = wave
            .iter()
            .map(|&i| {
                let target = target.clone();
                tokio::spawn(async move { stream_request(&target, Request::greedy(messages(i)), LINE_TOKENS).await })
            })
            .collect();
        for h in handles {
            let sample = h.await?;
            if let Some(e) = sample.error {
                bail!("a direct request failed: {e}");
            }
            tokens += sample.completion_tokens;
        }
    }
    Ok(tokens as f64 / started.elapsed().as_secs_f64())
}

/// A batch's input: `n` greedy chat lines of `max_tokens`.
fn lines(model: &str, n: usize, max_tokens: u32) -> String {
    (0..n)
        .map(|i| {
            let body = json!({"model": model, "messages": messages(i), "max_tokens": max_tokens, "temperature": 0});
            json!({"custom_id": format!("l{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body})
                .to_string()
                + "\n"
        })
        .collect()
}

async fn create_batch(target: &Target, input: &str) -> Result<String> {
    let boundary = "gantry-bench-boundary";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"bench.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{input}\r\n--{boundary}--\r\n"
    );
    let file: Value = send(
        target
            .client
            .post(format!("{}/v1/files", target.base_url))
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(form),
        target,
    )
    .await?;
    let body = json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let request = target
        .client
        .post(format!("{}/v1/batches", target.base_url))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string());
    let batch = send(request, target).await?;
    Ok(batch["id"].as_str().context("a batch id")?.to_string())
}

async fn cancel(target: &Target, id: &str) -> Result<()> {
    send(target.client.post(format!("{}/v1/batches/{id}/cancel", target.base_url)), target).await.map(drop)
}

/// Polls the batch until `done` holds of it (within 30 minutes).
async fn wait(target: &Target, id: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let batch = send(target.client.get(format!("{}/v1/batches/{id}", target.base_url)), target).await?;
        if done(&batch) {
            return Ok(batch);
        }
        if Instant::now() > deadline {
            bail!("the batch took too long: {batch}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn send(request: reqwest::RequestBuilder, target: &Target) -> Result<Value> {
    let resp = request.bearer_auth(&target.api_keys[0]).send().await?;
    let status = resp.status();
    let body: Value = serde_json::from_str(&resp.text().await.unwrap_or_default()).unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("HTTP {status}: {body}");
    }
    Ok(body)
}

/// Batch lines preempted so far, from `/metrics` (`--public-metrics`).
async fn preempted(target: &Target) -> u64 {
    let Ok(resp) = target.client.get(format!("{}/metrics", target.base_url)).send().await else { return 0 };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("gantry_requests_total{") && l.contains("outcome=\"preempted\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The markdown section, with both targets judged.
pub(crate) fn section(m: &Interference, concurrency: usize, parallel: usize, requests: usize) -> String {
    let ttft_ratio = m.ttft_beside_ms / m.ttft_alone_ms;
    let throughput_ratio = m.batch_tokens_per_s / m.direct_tokens_per_s;
    let verdict = |ok: bool| if ok { "met" } else { "not met" };
    let mut s = String::from("## Batches beside interactive traffic (Gantry only)\n\n");
    let _ = writeln!(
        s,
        "{requests} streamed chat requests of {INTERACTIVE_TOKENS} tokens, {concurrency} at a time, alone and \
         beside a batch filling the other sequences ({} batch lines preempted for them); then a batch of \
         {} lines of {LINE_TOKENS} tokens on the idle server against the same requests sent {parallel} at a time.\n",
        m.preempted,
        parallel * 4
    );
    let _ = writeln!(s, "| measure | value | target | |\n| --- | --- | --- | --- |");
    let _ = writeln!(
        s,
        "| interactive TTFT p50 beside a batch / alone | {:.0} / {:.0} ms = {ttft_ratio:.2} | ≤ {TTFT_TARGET:.2} | {} |",
        m.ttft_beside_ms,
        m.ttft_alone_ms,
        verdict(ttft_ratio <= TTFT_TARGET)
    );
    let _ = writeln!(
        s,
        "| idle batch / direct, completion tok/s | {:.1} / {:.1} = {throughput_ratio:.2} | ≥ {THROUGHPUT_TARGET:.2} | {} |",
        m.batch_tokens_per_s,
        m.direct_tokens_per_s,
        verdict(throughput_ratio >= THROUGHPUT_TARGET)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_judges_both_targets() {
        let m = Interference {
            ttft_alone_ms: 100.0,
            ttft_beside_ms: 150.0,
            preempted: 3,
            batch_tokens_per_s: 95.0,
            direct_tokens_per_s: 100.0,
        };
        let s = section(&m, 2, 4, 16);
        assert!(s.contains("= 1.50 | ≤ 1.10 | not met"), "{s}");
        assert!(s.contains("= 0.95 | ≥ 0.90 | met"), "{s}");
        assert!(s.contains("3 batch lines preempted"), "{s}");
        let input = lines("m", 3, 8);
        let parsed: Vec<Value> = input.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[2]["custom_id"], "l2");
        assert_eq!(parsed[0]["body"]["max_tokens"], 8);
    }
}
