//! Backpressure, metrics and graceful shutdown, against the real binary and a tiny model.

mod common;

use std::time::Duration;

use common::{gantry, sse_data, TestServer};
use futures_util::StreamExt;
use serde_json::{json, Value};

fn long_stream(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "go on"}], "max_tokens": 3500,
           "stream": true, "temperature": 1.0})
}

#[tokio::test]
async fn a_full_queue_answers_503_with_retry_after_and_recovers() {
    // Without drafts a stream takes as long as its tokens (the random model loops, so drafts would
    // make a long stream short, and a later request could find room).
    let s = TestServer::start(&["--parallel", "1", "--max-queue", "1", "--ctx-size", "4096", "--speculate", "off"]);
    // Stream heads come back as soon as a request is accepted: one runs, one waits, the rest
    // find the queue full. End-of-text is banned, so no stream ends early and lets a later
    // request in (seen on a busy machine: all six accepted one after another).
    let no_end = common::ban_special_tokens(&s, common::KEY).await;
    let sends = (0..6).map(|_| {
        let mut body = long_stream(&s.model_id);
        body["logit_bias"] = no_end.clone();
        s.chat(body).send()
    });
    let responses: Vec<reqwest::Response> =
        futures_util::future::join_all(sends).await.into_iter().map(Result::unwrap).collect();
    let mut accepted = Vec::new();
    let mut refused = 0;
    for r in responses {
        match r.status().as_u16() {
            200 => accepted.push(r),
            503 => {
                assert_eq!(r.headers()["retry-after"], "1");
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"]["type"], "server_error");
                assert_eq!(v["error"]["code"], "server_overloaded");
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    // One runs and one waits; the rest find the queue full.
    assert_eq!((accepted.len(), refused), (2, 4), "one running + one queued, the rest refused");
    drop(accepted); // cancels both
    let quick = json!({"model": s.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let mut ok = false;
    for _ in 0..50 {
        if s.chat(quick.clone()).send().await.unwrap().status() == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the server serves again once the queue drains");
}

#[tokio::test]
async fn metrics_are_exposed_in_prometheus_format() {
    // Read without the admin token: `/metrics` open on the one listener.
    let s = TestServer::start(&["--public-metrics"]);
    for _ in 0..2 {
        let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5});
        assert_eq!(s.chat(body).send().await.unwrap().status(), 200);
    }
    let _ = s.client().get(s.url("/nope")).send().await.unwrap();
    let resp = s.client().get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = resp.text().await.unwrap();
    // The engine's metrics carry the model they are about.
    let label = format!("{{model=\"{}\"}} ", s.model_id);
    for name in [
        "gantry_prompt_tokens_total",
        "gantry_cached_prompt_tokens_total",
        "gantry_completion_tokens_total",
        "gantry_prefix_cache_hit_ratio",
        "gantry_queue_depth",
        "gantry_running_sequences",
        "gantry_kv_cache_tokens",
        "gantry_host_cache_bytes",
        "gantry_host_cache_entries",
        "gantry_decode_steps_total",
    ] {
        let needle = format!("{name}{label}");
        assert!(text.contains(&needle), "metrics lack {needle:?}:\n{text}");
    }
    for needle in [
        r#"gantry_http_requests_total{route="/v1/chat/completions",status="200"} 2"#,
        r#"gantry_http_requests_total{route="other",status="404"} 1"#,
        "gantry_batch_tokens_bucket",
        "gantry_time_to_first_token_seconds_bucket",
        "gantry_inter_token_latency_seconds_bucket",
    ] {
        assert!(text.contains(needle), "metrics lack {needle:?}:\n{text}");
    }
    // Every phase of a decoding step is counted, and the two requests took some time in all.
    let phase_total = |phase: &str| -> u64 {
        let prefix = "gantry_step_phase_microseconds_total{";
        let line = text.lines().find(|l| l.starts_with(prefix) && l.contains(&format!("phase=\"{phase}\"")));
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("no {phase} phase:\n{text}"))
    };
    let phases = ["plan", "decode", "sync", "sample", "finish"].map(phase_total);
    assert!(phases[1] > 0, "decoding took time: {phases:?}");
    // Both requests ended (at their length, or their end of text).
    let finished: f64 = text
        .lines()
        .filter(|l| l.starts_with(&format!("gantry_requests_total{{model=\"{}\",", s.model_id)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(finished, 2.0, "requests by model: {text}");
    assert_cpu_backend_reported(&text);
    let cached: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("gantry_cached_prompt_tokens_total{label}")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(cached > 0.0, "the repeated prompt hit the prefix cache");
    // Once idle, the gauges say so (rather than keeping the last busy step's figures).
    let running = format!("gantry_running_sequences{label}0\n");
    let mut text = text;
    for _ in 0..50 {
        if text.contains(&running) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        text = s.client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    }
    assert!(text.contains(&running), "metrics lack {running:?} once idle:\n{text}");
}

/// `gantry_cpu_backend_info{features="SSE3 AVX …", variant="built-in"} 1`: the kernels the server
/// runs are named (this build has them built in; the portable build names the variant it chose).
fn assert_cpu_backend_reported(text: &str) {
    let line = text
        .lines()
        .find(|l| l.starts_with("gantry_cpu_backend_info{"))
        .unwrap_or_else(|| panic!("no gantry_cpu_backend_info gauge:\n{text}"));
    let features = line
        .split_once("features=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(features, _)| features)
        .unwrap_or_else(|| panic!("no features label: {line}"));
    assert!(!features.trim().is_empty(), "empty features label: {line}");
    assert!(line.contains("variant=\"built-in\""), "no variant label: {line}");
    #[cfg(target_arch = "x86_64")]
    assert!(features.split(' ').any(|f| f == "SSE3"), "x86-64 ggml always has SSE3: {line}");
    // This build links ggml's CPU backend in, and every machine these tests run on has AVX2: a
    // few rows of activations are multiplied by Gantry's kernels, through the linker's --wrap.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    assert!(line.contains("small_batches=\"gantry-avx"), "llamafile multiplies small batches: {line}");
    // And every one has AVX-512 VNNI: Gantry's K-quant kernels read Q4_K weights as loaded, so
    // ggml makes no repacked copies (the --wrap of its repacking buffer type took).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    assert!(line.contains("repacked_weights=\"no\""), "ggml repacks weights: {line}");
    assert!(line.ends_with(" 1"), "{line}");
}

#[tokio::test]
async fn sigterm_cuts_a_running_stream_after_the_grace_period_and_bills_it() {
    let mut s = TestServer::start(&["--parallel", "1", "--ctx-size", "4096", "--shutdown-grace", "1"]);
    let mut body = long_stream(&s.model_id);
    body["max_tokens"] = json!(4000);
    body["stream_options"] = json!({"include_usage": true});
    // A long generation, terminated while it runs.
    let resp = s.chat(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    let status = s.terminate();
    assert!(status.success(), "exit status {status:?}");
    let mut rest = String::from_utf8_lossy(&first).into_owned();
    while let Some(Ok(chunk)) = stream.next().await {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events = sse_data(&rest);
    let last = events.last().unwrap();
    // Either the generation finished inside the grace period, or it was cut with an error event.
    assert!(last == "[DONE]" || last.contains("\"error\""), "stream ended with {last}");

    let out = gantry().args(["usage", "--format", "json"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["requests"], 1);
    assert!(rows[0]["completion_tokens"].as_u64().unwrap() > 0, "the cut stream is billed: {rows:?}");
}

#[tokio::test]
async fn sigterm_drains_readiness_refuses_new_requests_and_lets_a_running_stream_finish() {
    let mut s =
        TestServer::start(&["--parallel", "2", "--ctx-size", "8192", "--drain-delay", "5", "--shutdown-grace", "60"]);
    let ready = |s: &TestServer| {
        let (client, url) = (s.client(), s.url("/health/ready"));
        async move {
            let resp = client.get(url).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = ready(&s).await;
    assert_eq!((status, v["status"].as_str()), (200, Some("ready")), "{v}");
    assert_eq!(v["loaded_models"], json!([s.model_id]));

    // A stream of a known length (end-of-text banned), long enough (over a second on the tiny
    // model) to run through the signal and the drain delay.
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "go on"}], "max_tokens": 3000,
                      "stream": true, "stream_options": {"include_usage": true},
                      "logit_bias": common::ban_special_tokens(&s, common::KEY).await});
    let resp = s.chat(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::from_utf8_lossy(&stream.next().await.unwrap().unwrap()).into_owned();
    s.send_sigterm();

    // Within the drain delay the listener is open: not ready (once the signal is handled), and
    // new work is turned away.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, v) = loop {
        let (status, v) = ready(&s).await;
        if status == 503 || std::time::Instant::now() > deadline {
            break (status, v);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((status, v["status"].as_str()), (503, Some("draining")), "{v}");
    let live = s.client().get(s.url("/health/live")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let refused =
        s.chat(json!({"model": s.model_id, "messages": [{"role": "user", "content": "hi"}]})).send().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "server_shutting_down");

    // The running stream finishes whole, and is billed.
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let told = events
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["usage"]["completion_tokens"].as_u64());
    assert_eq!(told, Some(3000));
    let status = s.terminate();
    assert!(status.success(), "exit status {status:?}");
    let out = gantry().args(["usage", "--format", "json"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["requests"], 1, "the refused request is not billed: {rows:?}");
    assert_eq!(rows[0]["completion_tokens"], 3000);
}
