//! The streaming client, its SSE parsing, and one level of a workload: closed loop (a fixed
//! number of streams) or open loop (requests sent at Poisson arrival times, `traffic`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::stats::{summarize, LevelResult, RequestSample};
use crate::workloads::{Request, Workload};

/// Where and how to send requests.
#[derive(Clone)]
pub(crate) struct Target {
    pub client: reqwest::Client,
    pub base_url: String,
    /// The keys requests are sent with (none: no `Authorization`); a request's `key_slot` picks one.
    pub api_keys: Vec<String>,
    pub model: String,
    /// `/v1/completions` with the messages' text as the prompt, not `/v1/chat/completions`.
    pub completions: bool,
}

/// Incremental Server-Sent-Events decoder: feed raw bytes, get the `data:` payloads of complete
/// events. Bytes are buffered until a blank line so multi-byte UTF-8 split across reads survives.
#[derive(Default)]
pub(crate) struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some((end, sep)) = find_event_end(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end + sep).collect();
            let text = String::from_utf8_lossy(&raw[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                events.push(data.join("\n"));
            }
        }
        events
    }
}

fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// What one `data:` payload of a chat-completions stream carries.
#[derive(Debug, PartialEq)]
pub(crate) enum Chunk {
    Done,
    /// Visible text (content or reasoning) and the usage block when present.
    Data {
        text: Option<String>,
        completion_tokens: Option<u64>,
        prompt_tokens: Option<u64>,
        cached_tokens: Option<u64>,
    },
    Error(String),
}

pub(crate) fn parse_chunk(data: &str) -> Chunk {
    if data.trim() == "[DONE]" {
        return Chunk::Done;
    }
    let v: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => return Chunk::Error(format!("bad chunk JSON ({e}): {data}")),
    };
    if let Some(err) = v.get("error") {
        return Chunk::Error(err.to_string());
    }
    let delta = v.pointer("/choices/0/delta");
    let text = ["content", "reasoning_content"]
        .iter()
        .filter_map(|k| delta.and_then(|d| d.get(*k)).and_then(Value::as_str))
        .chain(v.pointer("/choices/0/text").and_then(Value::as_str))
        .find(|s| !s.is_empty())
        .map(str::to_string);
    let usage = v.get("usage").filter(|u| !u.is_null());
    Chunk::Data {
        text,
        completion_tokens: usage.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64),
        prompt_tokens: usage.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64),
        cached_tokens: usage.and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens")).and_then(Value::as_u64),
    }
}

/// Sends one streaming request and times it. Never fails: errors land in the sample.
pub(crate) async fn stream_request(target: &Target, request: Request, max_tokens: u32) -> RequestSample {
    let mut sample = RequestSample::default();
    if let Err(e) = stream_inner(target, request, max_tokens, &mut sample).await {
        sample.error = Some(format!("{e:#}"));
    }
    sample
}

/// The JSON body of `request`, the same for both servers: only the model id differs. For
/// `/v1/completions` the messages' contents, one after another, are the prompt, and the answer
/// runs to `max_tokens`.
pub(crate) fn request_body(model: &str, request: &Request, max_tokens: u32, completions: bool) -> Value {
    let mut body = json!({
        "model": model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": request.temperature,
        "max_tokens": request.max_tokens.unwrap_or(max_tokens),
    });
    if completions {
        let contents = request.messages.as_array().into_iter().flatten();
        let texts: Vec<&str> = contents.filter_map(|m| m.get("content").and_then(Value::as_str)).collect();
        body["prompt"] = json!(texts.join("\n\n"));
    } else {
        body["messages"] = request.messages.clone();
    }
    if let Some(top_p) = request.top_p {
        body["top_p"] = json!(top_p);
    }
    if let Some(format) = &request.response_format {
        body["response_format"] = format.clone();
    }
    // A base model often ends a raw prompt at once (no answer to stream): both servers write
    // `max_tokens` instead.
    if request.ignore_eos || completions {
        body["ignore_eos"] = json!(true);
    }
    body
}

async fn stream_inner(target: &Target, request: Request, max_tokens: u32, s: &mut RequestSample) -> Result<()> {
    let body = request_body(&target.model, &request, max_tokens, target.completions);
    let start = Instant::now();
    let path = if target.completions { "completions" } else { "chat/completions" };
    let mut req = target
        .client
        .post(format!("{}/v1/{path}", target.base_url))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body)?);
    if !target.api_keys.is_empty() {
        req = req.bearer_auth(&target.api_keys[request.key_slot % target.api_keys.len()]);
    }
    let mut resp = req.send().await?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        bail!("HTTP {status}: {}", text.chars().take(300).collect::<String>());
    }
    let mut parser = SseParser::default();
    let mut last: Option<f64> = None;
    let mut deltas = 0u64;
    let mut usage_tokens = None;
    'read: while let Some(bytes) = resp.chunk().await? {
        let now = start.elapsed().as_secs_f64();
        for data in parser.push(&bytes) {
            match parse_chunk(&data) {
                Chunk::Done => break 'read,
                Chunk::Error(e) => bail!("stream error: {e}"),
                Chunk::Data { text, completion_tokens, prompt_tokens, cached_tokens } => {
                    if text.is_some() {
                        deltas += 1;
                        match last {
                            None => s.ttft = Some(now),
                            Some(prev) => s.itl.push(now - prev),
                        }
                        last = Some(now);
                    }
                    usage_tokens = completion_tokens.or(usage_tokens);
                    s.prompt_tokens = prompt_tokens.or(s.prompt_tokens);
                    s.cached_tokens = cached_tokens.or(s.cached_tokens);
                }
            }
        }
    }
    s.completion_tokens = usage_tokens.unwrap_or(deltas);
    if deltas == 0 {
        bail!("stream carried no content");
    }
    Ok(())
}

/// Runs `requests` requests of `workload` (pass `pass`'s prompts), `concurrency` in flight at a
/// time (closed loop).
pub(crate) async fn run_level(
    target: &Target,
    workload: &Workload,
    pass: usize,
    concurrency: usize,
    requests: usize,
) -> LevelResult {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (target, workload, next) = (target.clone(), workload.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= requests {
                    break out;
                }
                let request = workload.request(pass, concurrency, i);
                out.push(stream_request(&target, request, workload.max_tokens).await);
            }
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap_or_default());
    }
    let mut result = summarize(&workload.label(), concurrency, &samples, started.elapsed().as_secs_f64());
    result.pass = pass;
    result
}

/// Sends `requests` requests of `workload` at Poisson arrival times of `rate` requests/s (open
/// loop: whether earlier ones have finished or not), and waits for all of them. The arrival times
/// are seeded by the workload's seed, the pass and the rate, so both servers get the same ones.
pub(crate) async fn run_open_level(
    target: &Target,
    workload: &Workload,
    pass: usize,
    requests: usize,
    rate: f64,
) -> LevelResult {
    let seed = workload.seed ^ ((pass as u64) << 48) ^ rate.to_bits();
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (i, at) in crate::traffic::arrivals(rate, requests, seed).into_iter().enumerate() {
        tokio::time::sleep_until(started + std::time::Duration::from_secs_f64(at)).await;
        let (target, request) = (target.clone(), workload.request(pass, 0, i));
        let max_tokens = workload.max_tokens;
        tasks.push(tokio::spawn(async move { stream_request(&target, request, max_tokens).await }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.push(t.await.unwrap_or_else(|e| RequestSample { error: Some(e.to_string()), ..Default::default() }));
    }
    let mut result = summarize(&workload.label(), 0, &samples, started.elapsed().as_secs_f64());
    result.pass = pass;
    result.offered_rate = Some(rate);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_splits_events_across_reads() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\":").is_empty());
        assert_eq!(p.push(b"1}\n\ndata: [DONE]\n\n"), vec!["{\"a\":1}".to_string(), "[DONE]".into()]);
        assert!(p.push(b"").is_empty());
    }

    #[test]
    fn sse_handles_crlf_comments_and_multibyte() {
        let mut p = SseParser::default();
        let text = "data: {\"x\":\"é\"}\r\n\r\n: keep-alive\n\nevent: foo\ndata: a\ndata: b\n\n".as_bytes();
        let (first, rest) = text.split_at(11); // inside the two-byte é
        assert!(p.push(first).is_empty());
        assert_eq!(p.push(rest), vec!["{\"x\":\"é\"}".to_string(), "a\nb".into()]);
    }

    #[test]
    fn chunks_parse_content_usage_and_errors() {
        let c = parse_chunk(r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#);
        let none = Chunk::Data { text: None, completion_tokens: None, prompt_tokens: None, cached_tokens: None };
        assert_eq!(
            c,
            Chunk::Data { text: Some("Hi".into()), completion_tokens: None, prompt_tokens: None, cached_tokens: None }
        );
        let role = parse_chunk(r#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":null}"#);
        assert_eq!(role, none);
        let usage =
            parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":64,"total_tokens":76}}"#);
        assert_eq!(
            usage,
            Chunk::Data { text: None, completion_tokens: Some(64), prompt_tokens: Some(12), cached_tokens: None }
        );
        let cached = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":1040,"completion_tokens":32,"prompt_tokens_details":{"cached_tokens":1024}}}"#,
        );
        assert_eq!(
            cached,
            Chunk::Data {
                text: None,
                completion_tokens: Some(32),
                prompt_tokens: Some(1040),
                cached_tokens: Some(1024)
            }
        );
        assert_eq!(parse_chunk(" [DONE]"), Chunk::Done);
        assert!(matches!(parse_chunk(r#"{"error":{"message":"boom"}}"#), Chunk::Error(_)));
        assert!(matches!(parse_chunk("not json"), Chunk::Error(_)));
    }

    #[test]
    fn bodies_carry_the_requests_sampling_and_nothing_else_per_server() {
        let greedy = Request::greedy(serde_json::json!([{"role": "user", "content": "Hi"}]));
        let b = request_body("m", &greedy, 64, false);
        assert_eq!(
            (b["temperature"].as_f64(), b["max_tokens"].as_u64(), b["model"].as_str()),
            (Some(0.0), Some(64), Some("m"))
        );
        assert!(b.get("top_p").is_none() && b.get("seed").is_none() && b.get("response_format").is_none(), "{b}");
        assert!(b.get("ignore_eos").is_none(), "only sharing and traffic ask for it: {b}");
        assert_eq!(request_body("m", &Request { max_tokens: Some(17), ..greedy.clone() }, 64, false)["max_tokens"], 17);
        assert_eq!(request_body("m", &Request { ignore_eos: true, ..greedy.clone() }, 8, false)["ignore_eos"], true);
        let sampled = Request { temperature: 0.8, top_p: Some(0.95), ..greedy };
        let b = request_body("m", &sampled, 128, false);
        assert_eq!((b["temperature"].as_f64(), b["top_p"].as_f64()), (Some(0.8), Some(0.95)));
        assert!(b.get("seed").is_none(), "no seed: Gantry would skip its prompt cache for it");
        assert_eq!(b["stream_options"]["include_usage"], true);
        let mut other = request_body("other-model", &sampled, 128, false);
        other["model"] = "m".into();
        assert_eq!(other, b, "both servers get the same body but for the model id");
    }

    #[test]
    fn a_base_models_requests_are_raw_prompts_and_its_chunks_text() {
        let two = serde_json::json!([{"role": "system", "content": "Notes."}, {"role": "user", "content": "Go on"}]);
        let b = request_body("m", &Request::greedy(two), 64, true);
        assert_eq!(b["prompt"], "Notes.\n\nGo on");
        assert!(b.get("messages").is_none(), "{b}");
        assert_eq!(b["ignore_eos"], true, "a base model writes max_tokens");
        assert_eq!((b["stream"].as_bool(), b["max_tokens"].as_u64()), (Some(true), Some(64)));
        let chunk = parse_chunk(r#"{"choices":[{"index":0,"text":" once","finish_reason":null}]}"#);
        assert!(matches!(chunk, Chunk::Data { text: Some(t), .. } if t == " once"));
    }
}
