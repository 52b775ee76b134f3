//! The workloads, the streaming client and its SSE parsing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::stats::{summarize, LevelResult, RequestSample};

/// Where and how to send requests.
#[derive(Clone)]
pub struct Target {
    pub client: reqwest::Client,
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub temperature: f64,
}

/// What a level sends: the chat messages for request `i`, and how many tokens to ask for.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub prompt_tokens: usize,
    pub shared_prefix_tokens: usize,
    pub max_tokens: u32,
    pub seed: u64,
}

const WORDS: &[&str] = &[
    "river", "mountain", "engine", "garden", "signal", "harbor", "lantern", "forest", "market", "bridge",
    "winter", "copper", "library", "orbit", "valley", "thunder", "pencil", "island", "castle", "meadow",
    "silver", "window", "compass", "desert", "anchor", "candle", "planet", "ribbon", "tunnel", "village",
    "kernel", "socket", "buffer", "thread", "cache", "module", "packet", "vector", "matrix", "tensor",
    "morning", "evening", "summer", "autumn", "spring", "ocean", "cloud", "stone", "glass", "paper",
    "music", "story", "travel", "letter", "friend", "teacher", "doctor", "farmer", "painter", "sailor",
    "quiet", "bright", "gentle", "ancient", "simple", "rapid", "careful", "golden", "hidden", "open",
    "build", "carry", "measure", "follow", "gather", "listen", "repair", "launch", "travel", "explain",
];

/// Deterministic splitmix64, so both servers get identical prompts.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn word(&mut self) -> &'static str {
        WORDS[(self.next() % WORDS.len() as u64) as usize]
    }
}

/// Roughly `tokens` tokens of sentences (one common English word is about one token; a sentence of
/// ~10 words adds a full stop).
pub fn filler(rng: &mut Rng, tokens: usize) -> String {
    let words = tokens * 10 / 11;
    let mut out = String::with_capacity(words * 8);
    let mut in_sentence = 0;
    for i in 0..words {
        let w = rng.word();
        if in_sentence == 0 {
            let mut c = w.chars();
            let first = c.next().unwrap().to_ascii_uppercase();
            out.push(first);
            out.push_str(c.as_str());
        } else {
            out.push_str(w);
        }
        in_sentence += 1;
        if in_sentence >= 8 + (rng.next() % 6) as usize || i + 1 == words {
            out.push_str(". ");
            in_sentence = 0;
        } else {
            out.push(' ');
        }
    }
    out.trim_end().to_string()
}

impl Workload {
    /// Messages for request `i` of a level at `concurrency`. Plain prompts differ from the first
    /// word (no prefix-cache hits across requests or levels); shared-prefix requests share one long
    /// system prompt and differ only in a short user turn.
    pub fn messages(&self, concurrency: usize, i: usize) -> Value {
        let mut rng = Rng::new(self.seed ^ ((concurrency as u64) << 32) ^ i as u64);
        if self.shared_prefix_tokens > 0 {
            let mut shared = Rng::new(self.seed);
            let system = format!(
                "You are a writing assistant. Use the following reference notes when answering.\n\n{}",
                filler(&mut shared, self.shared_prefix_tokens)
            );
            let user = format!(
                "Question {i} (run {concurrency}): write a long, detailed paragraph about the {} and the {} near the {}.",
                rng.word(),
                rng.word(),
                rng.word()
            );
            json!([{"role": "system", "content": system}, {"role": "user", "content": user}])
        } else {
            let lead = format!("{} {} {}", rng.word(), rng.word(), rng.word());
            let user = format!(
                "[{lead} #{i}] Write a long, detailed story that uses all of these words: {}",
                filler(&mut rng, self.prompt_tokens.saturating_sub(24))
            );
            json!([{"role": "user", "content": user}])
        }
    }
}

/// Incremental Server-Sent-Events decoder: feed raw bytes, get the `data:` payloads of complete
/// events. Bytes are buffered until a blank line so multi-byte UTF-8 split across reads survives.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
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
pub enum Chunk {
    Done,
    /// Visible text (content or reasoning) and the usage block when present.
    Data { text: Option<String>, completion_tokens: Option<u64>, prompt_tokens: Option<u64> },
    Error(String),
}

pub fn parse_chunk(data: &str) -> Chunk {
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
        .find(|s| !s.is_empty())
        .map(str::to_string);
    let usage = v.get("usage").filter(|u| !u.is_null());
    Chunk::Data {
        text,
        completion_tokens: usage.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64),
        prompt_tokens: usage.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64),
    }
}

/// Sends one streaming request and times it. Never fails: errors land in the sample.
pub async fn stream_request(target: &Target, messages: Value, max_tokens: u32) -> RequestSample {
    let mut sample = RequestSample::default();
    if let Err(e) = stream_inner(target, messages, max_tokens, &mut sample).await {
        sample.error = Some(format!("{e:#}"));
    }
    sample
}

async fn stream_inner(target: &Target, messages: Value, max_tokens: u32, s: &mut RequestSample) -> Result<()> {
    let body = json!({
        "model": target.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": target.temperature,
        "max_tokens": max_tokens,
    });
    let start = Instant::now();
    let mut req = target
        .client
        .post(format!("{}/v1/chat/completions", target.base_url))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body)?);
    if let Some(key) = &target.api_key {
        req = req.bearer_auth(key);
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
                Chunk::Data { text, completion_tokens, prompt_tokens } => {
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

/// Runs `requests` requests of `workload`, `concurrency` in flight at a time (closed loop).
pub async fn run_level(target: &Target, workload: &Workload, concurrency: usize, requests: usize) -> LevelResult {
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
                let messages = workload.messages(concurrency, i);
                out.push(stream_request(&target, messages, workload.max_tokens).await);
            }
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap_or_default());
    }
    summarize(&workload.name, concurrency, &samples, started.elapsed().as_secs_f64())
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
        assert_eq!(c, Chunk::Data { text: Some("Hi".into()), completion_tokens: None, prompt_tokens: None });
        let role = parse_chunk(r#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":null}"#);
        assert_eq!(role, Chunk::Data { text: None, completion_tokens: None, prompt_tokens: None });
        let usage = parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":64,"total_tokens":76}}"#);
        assert_eq!(usage, Chunk::Data { text: None, completion_tokens: Some(64), prompt_tokens: Some(12) });
        assert_eq!(parse_chunk(" [DONE]"), Chunk::Done);
        assert!(matches!(parse_chunk(r#"{"error":{"message":"boom"}}"#), Chunk::Error(_)));
        assert!(matches!(parse_chunk("not json"), Chunk::Error(_)));
    }

    #[test]
    fn prompts_are_deterministic_and_sized() {
        let w = Workload { name: "chat".into(), prompt_tokens: 128, shared_prefix_tokens: 0, max_tokens: 8, seed: 1 };
        assert_eq!(w.messages(4, 3), w.messages(4, 3));
        assert_ne!(w.messages(4, 3), w.messages(4, 4));
        assert_ne!(w.messages(4, 3), w.messages(8, 3));
        let words = w.messages(1, 0)[0]["content"].as_str().unwrap().split_whitespace().count();
        assert!((80..140).contains(&words), "{words}");
        let s = Workload { shared_prefix_tokens: 1500, name: "shared".into(), ..w };
        let (a, b) = (s.messages(8, 0), s.messages(8, 1));
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        let sys_words = a[0]["content"].as_str().unwrap().split_whitespace().count();
        assert!((1200..1500).contains(&sys_words), "{sys_words}");
    }
}
