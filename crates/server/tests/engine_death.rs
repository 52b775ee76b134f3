//! The engine dies under a running request: the real binary, with its documented test hook.
//! Alone in its test binary because it sets an environment variable the server inherits.

mod common;

use std::time::{Duration, Instant};

use common::{gantry, sse_data, TestServer};
use serde_json::{json, Value};

#[tokio::test]
async fn a_panicking_engine_fails_the_request_bills_it_turns_unhealthy_and_exits_non_zero() {
    // The only test in this binary, so no other test sees it; the server inherits it.
    std::env::set_var("GANTRY_TEST_PANIC_AFTER_TOKENS", "3");
    let mut s = TestServer::start(&[]);
    let body = json!({
        "model": s.model_id, "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 50, "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
    });
    let resp = s.chat(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events = sse_data(&text);
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap_or_else(|_| panic!("{text}"));
    assert_eq!(last["error"]["type"], "server_error", "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let streamed: usize = events.iter().filter(|e| e.contains("\"content\":\"")).count();
    assert!(streamed >= 2, "content before the failure: {text}");

    // It stops serving on its own: /health is 503 (or the port is closed) from now on.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.get(s.url("/health")).send().await {
            Ok(r) => assert_eq!(r.status(), 503, "health after the engine died"),
            Err(_) => break,
        }
        assert!(Instant::now() < deadline, "the server kept running after its engine died");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = s.terminate();
    assert_eq!(status.code(), Some(1), "exit status after the engine died: {status:?}");

    // The tokens generated before the panic were billed.
    let out = gantry().args(["usage", "--format", "json"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["requests"], 1);
    assert_eq!(rows[0]["completion_tokens"], 3, "{rows:?}");
}
