//! Starts the real `gantry` binary on a free port with a tiny random-weight model.
#![allow(dead_code)]
#![allow(unsafe_code, reason = "kill(2) of the test's own child server through libc")]

pub(crate) mod cluster;
pub(crate) mod cluster_load;
pub(crate) mod metrics;
pub(crate) mod postgres;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub(crate) const KEY: &str = "sk-gantry-test-0123456789abcdefghijklmnop";

/// One tiny model file shared by every test in the binary.
pub(crate) fn tiny_model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-tiny-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny-chatml.gguf");
        tiny_gguf::write_tiny_model(&path, &tiny_gguf::TinyModelSpec::default()).unwrap();
        path
    })
}

pub(crate) fn gantry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gantry"))
}

pub(crate) struct TestServer {
    child: Child,
    pub base: String,
    pub model_id: String,
    pub data_dir: tempfile::TempDir,
    pub stdout_lines: Vec<String>,
}

impl TestServer {
    pub(crate) fn start(extra: &[&str]) -> Self {
        Self::start_with(tiny_model(), true, extra)
    }

    pub(crate) fn start_with(model: &Path, with_key: bool, extra: &[&str]) -> Self {
        let data_dir = tempfile::tempdir().unwrap();
        let mut cmd = gantry();
        // One llama.cpp thread: the suite runs two tests at once on two cores, and ggml's OpenMP
        // threads spin at every barrier, so two 2-thread servers sharing two cores ran 25 times
        // slower (the database outage tests took 300 s instead of 12, and timed out in CI).
        cmd.args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ctx-size",
            "512",
            "--parallel",
            "4",
            "--threads",
            "1",
        ])
        .arg("--model")
        .arg(model)
        .arg("--data-dir")
        .arg(data_dir.path())
        .args(extra)
        .env_remove("GANTRY_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if with_key {
            cmd.args(["--api-key", KEY]);
        }
        let mut child = cmd.spawn().expect("spawn gantry");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("gantry did not start; stdout: {lines:?}");
            };
            lines.push(line.clone());
            if let Some(rest) = line.strip_prefix("Gantry is serving `") {
                let (model_id, tail) = rest.split_once('`').unwrap();
                let base = tail.trim().strip_prefix("at ").unwrap().trim_end_matches("/v1").to_string();
                // Keep reading the banner (the printed key) for tests that want it: its last line
                // is the curl command.
                while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    let last = l.starts_with("  curl ");
                    lines.push(l);
                    if last {
                        break;
                    }
                }
                return Self { child, base, model_id: model_id.to_string(), data_dir, stdout_lines: lines };
            }
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub(crate) fn client(&self) -> reqwest::Client {
        reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
    }

    pub(crate) fn chat(&self, body: serde_json::Value) -> reqwest::RequestBuilder {
        self.client().post(self.url("/v1/chat/completions")).bearer_auth(KEY).json(&body)
    }

    /// Sends SIGTERM and returns at once.
    pub(crate) fn send_sigterm(&self) {
        // SAFETY: kill(2) on the pid of a child this value owns and has not waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        self.send_sigterm();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "gantry did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses an SSE body into its `data:` payloads.
pub(crate) fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> =
                event.lines().filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:"))).collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// A `logit_bias` banning the tiny model's special tokens (end of text, turn start, turn end: the
/// last three of its vocabulary), so a request generates until `max_tokens` or cancellation. The
/// vocabulary size is read from the out-of-range error.
pub(crate) async fn ban_special_tokens(s: &TestServer, key: &str) -> serde_json::Value {
    ban_special_tokens_at(&s.base, &s.model_id, key).await
}

/// [`ban_special_tokens`] for a server at `base` (`http://host:port`).
pub(crate) async fn ban_special_tokens_at(base: &str, model: &str, key: &str) -> serde_json::Value {
    let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "go"}], "logit_bias": {"99999999": 1}});
    let refused: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let message = refused["error"]["message"].as_str().unwrap();
    let n_vocab: i64 =
        message.rsplit("0..").next().unwrap().trim_end_matches(").").parse().unwrap_or_else(|_| panic!("{message}"));
    serde_json::json!({(n_vocab - 3).to_string(): -100, (n_vocab - 2).to_string(): -100, (n_vocab - 1).to_string(): -100})
}

/// `n` streamed answers of up to 4,000 tokens on `s` (special tokens banned, so none ends early),
/// each running or waiting for a sequence until its response is dropped.
pub(crate) async fn long_streams(s: &TestServer, n: usize) -> Vec<reqwest::Response> {
    let bias = ban_special_tokens(s, KEY).await;
    let mut streams = Vec::new();
    for i in 0..n {
        let body = serde_json::json!({"model": s.model_id, "messages": [{"role": "user", "content": format!("story {i}")}],
                                      "max_tokens": 4000, "stream": true, "logit_bias": bias});
        let resp = s.chat(body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        streams.push(resp);
    }
    streams
}
