//! The cluster test's load: workers that send a mix of streamed, plain and cancelled requests
//! under three keys through the load balancer, and what each was told.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::sse_data;

/// A request that takes longer than this is a hang.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Plain,
    Stream,
    Cancelled,
    LongStream,
}

impl Kind {
    pub(crate) fn max_tokens(self) -> u64 {
        match self {
            Kind::Plain => 24,
            Kind::Stream | Kind::Cancelled => 48,
            Kind::LongStream => 160,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// 200 with usage: what the client was told, prompt + completion.
    Completed(u64),
    /// 429 or 503, with `Retry-After` where the refusal is retryable, and OpenAI's error body.
    Refused(u16, String),
    /// A stream that ended with an error event (cut at the grace period).
    StreamError,
    /// Dropped by the client after two chunks.
    Cancelled,
    /// Ended without an answer: a stream cut mid-way, a 502, a transport error.
    Cut(String),
    Hung,
    Unexpected(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) client_id: String,
    pub(crate) key: usize,
    pub(crate) kind: Kind,
    pub(crate) upstream: String,
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
    pub(crate) answer: Answer,
}

pub(crate) async fn send(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    kind: Kind,
    client_id: &str,
    model: &str,
) -> (String, Answer) {
    let stream = kind != Kind::Plain;
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": format!("request {client_id}")}],
                          "max_tokens": kind.max_tokens(), "temperature": 1.0});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let resp = match client.post(url).bearer_auth(secret).header("x-request-id", client_id).json(&body).send().await {
        Ok(r) => r,
        Err(e) => return (String::new(), Answer::Cut(format!("transport: {e}"))),
    };
    let upstream = resp.headers().get("x-gantry-upstream").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let status = resp.status().as_u16();
    let retry_after = resp.headers().contains_key("retry-after");
    if status != 200 {
        let text = resp.text().await.unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().unwrap_or("").to_string();
        // insufficient_quota is not retryable (the budget is spent), so it has no Retry-After.
        let answer = match (status, retry_after || code == "insufficient_quota") {
            (502, _) => Answer::Cut(format!("502 {text}")),
            (429 | 503, true) if v["error"]["message"].is_string() => Answer::Refused(status, code),
            _ => Answer::Unexpected(format!("{status} retry-after={retry_after} {text}")),
        };
        return (upstream, answer);
    }
    if !stream {
        return match resp.json::<Value>().await {
            Ok(v) => (upstream, Answer::Completed(v["usage"]["total_tokens"].as_u64().unwrap())),
            Err(e) => (upstream, Answer::Cut(format!("body: {e}"))),
        };
    }
    let mut resp = resp;
    let mut text = String::new();
    let mut chunks = 0;
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                text.push_str(&String::from_utf8_lossy(&c));
                chunks += 1;
                if kind == Kind::Cancelled && chunks == 2 {
                    return (upstream, Answer::Cancelled);
                }
            }
            Ok(None) => break,
            Err(e) => return (upstream, Answer::Cut(format!("stream: {e}"))),
        }
    }
    let events = sse_data(&text);
    let answer = if events.last().map(String::as_str) == Some("[DONE]") {
        let told = events
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find_map(|v| v["usage"]["total_tokens"].as_u64());
        match told {
            Some(t) => Answer::Completed(t),
            None => Answer::Unexpected(format!("no usage in {text}")),
        }
    } else if events.iter().any(|d| d.contains("\"error\"")) {
        Answer::StreamError
    } else if kind == Kind::Cancelled {
        Answer::Cancelled // the stream ended before its second chunk
    } else {
        Answer::Cut(format!("stream ended without [DONE]: {}", &text[text.len().saturating_sub(200)..]))
    };
    (upstream, answer)
}

/// Workers send requests back to back until `until`, each a key and kind in turn.
pub(crate) async fn load(
    url: String,
    secrets: Vec<String>,
    model: String,
    workers: usize,
    until: Instant,
) -> Vec<Sent> {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let kinds = [Kind::Plain, Kind::Stream, Kind::Cancelled, Kind::LongStream];
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (url, secrets, model, sent) = (url.clone(), secrets.clone(), model.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let mut i = 0;
            while Instant::now() < until {
                let (key, kind) = ((w + i) % secrets.len(), kinds[(w + i / 3) % kinds.len()]);
                let client_id = format!("w{w}-{i}");
                let started = Instant::now();
                let answer =
                    tokio::time::timeout(ANSWER_TIMEOUT, send(&client, &url, &secrets[key], kind, &client_id, &model))
                        .await;
                let (upstream, answer) = answer.unwrap_or((String::new(), Answer::Hung));
                let refused = matches!(answer, Answer::Refused(..));
                sent.lock().unwrap().push(Sent {
                    client_id,
                    key,
                    kind,
                    upstream,
                    started,
                    ended: Instant::now(),
                    answer,
                });
                // As the SDKs do on 429/503, wait a little before the next request.
                if refused {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(sent).unwrap().into_inner().unwrap()
}
