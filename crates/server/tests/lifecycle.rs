//! Keys, usage records, cancellation and shutdown, against the real binary.

mod common;

use std::time::Duration;

use common::{gantry, TestServer, KEY};
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test]
async fn first_start_prints_a_working_key() {
    let s = TestServer::start_with(common::tiny_model(), false, &[]);
    let key = s
        .stdout_lines
        .iter()
        .map(|l| l.trim())
        .find(|l| l.starts_with("sk-gantry-"))
        .expect("banner prints the new key")
        .to_string();
    assert!(s.stdout_lines.iter().any(|l| l.contains("curl ")), "banner has a curl line");
    let resp = s.client().get(s.url("/v1/models")).bearer_auth(&key).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn keys_created_by_the_cli_work_at_once_and_revocation_too() {
    let s = TestServer::start(&[]);
    let out =
        gantry().args(["keys", "create", "--name", "ci"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let key = stdout.lines().last().unwrap().trim().to_string();
    assert!(key.starts_with("sk-gantry-"));
    let models = |k: String| s.client().get(s.url("/v1/models")).bearer_auth(k).send();
    assert_eq!(models(key.clone()).await.unwrap().status(), 200);

    let list = gantry().args(["keys", "list"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    let listing = String::from_utf8(list.stdout).unwrap();
    assert!(listing.contains("ci"));
    assert!(!listing.contains(&key), "keys list must never show a secret");

    let rev = gantry().args(["keys", "revoke", "ci"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    assert!(rev.status.success(), "{}", String::from_utf8_lossy(&rev.stderr));
    assert_eq!(models(key).await.unwrap().status(), 401);
}

#[tokio::test]
async fn usage_is_recorded_once_per_request_and_matches_the_response() {
    let s = TestServer::start(&[]);
    let mut prompt_total = 0;
    let mut completion_total = 0;
    for i in 0..3 {
        let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": format!("hi {i}")}], "max_tokens": 4 + i});
        let v: Value = s.chat(body).send().await.unwrap().json().await.unwrap();
        prompt_total += v["usage"]["prompt_tokens"].as_u64().unwrap();
        completion_total += v["usage"]["completion_tokens"].as_u64().unwrap();
    }
    // Records are written just after the response; give the writer a moment.
    let mut rows = Vec::new();
    for _ in 0..50 {
        let out =
            gantry().args(["usage", "--format", "json"]).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
        assert!(out.status.success());
        rows = serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap();
        if rows.first().is_some_and(|r| r["requests"] == 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["requests"], 3);
    assert_eq!(rows[0]["model"], s.model_id.as_str());
    assert_eq!(rows[0]["prompt_tokens"].as_u64().unwrap(), prompt_total);
    assert_eq!(rows[0]["completion_tokens"].as_u64().unwrap(), completion_total);
}

#[tokio::test]
async fn cancelled_streams_free_their_slots() {
    let s = TestServer::start(&["--parallel", "2"]);
    let long = json!({"model": s.model_id, "messages": [{"role": "user", "content": "go"}], "max_tokens": 400, "stream": true, "temperature": 1.0});
    for _ in 0..2 {
        let resp = s.chat(long.clone()).send().await.unwrap();
        let mut body = resp.bytes_stream();
        let _ = body.next().await;
        drop(body);
    }
    // Both slots were taken by abandoned streams; new work must still get through.
    let quick = json!({"model": s.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let results = futures_util::future::join_all((0..4).map(|_| s.chat(quick.clone()).send())).await;
    for r in results {
        assert_eq!(r.unwrap().status(), 200);
    }
}

#[test]
fn a_taken_port_stops_the_server_before_its_model_loads() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let data_dir = tempfile::tempdir().unwrap();
    let out = gantry()
        .args(["serve", "--host", "127.0.0.1", "--port", &port, "--threads", "1", "--model"])
        .arg(common::tiny_model())
        .arg("--data-dir")
        .arg(data_dir.path())
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{said}");
    assert!(said.contains(&format!("binding 127.0.0.1:{port}")), "{said}");
    assert!(!said.contains("model loaded"), "{said}");
}

#[tokio::test]
async fn sigterm_exits_cleanly() {
    let mut s = TestServer::start(&[]);
    let resp = s.client().get(s.url("/health")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let status = s.terminate();
    assert!(status.success(), "exit status {status:?}");
    let _ = KEY;
}

#[tokio::test]
async fn rate_limits_answer_429_with_openai_headers() {
    let s = TestServer::start(&[]);
    let key = create_key(&s, &["--name", "limited", "--rpm", "2", "--tpm", "100000"]);
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let send = || s.client().post(s.url("/v1/chat/completions")).bearer_auth(&key).json(&body).send();
    let first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    let h = first.headers();
    assert_eq!(h["x-ratelimit-limit-requests"], "2");
    assert_eq!(h["x-ratelimit-remaining-requests"], "1");
    assert_eq!(h["x-ratelimit-limit-tokens"], "100000");
    assert!(h["x-ratelimit-remaining-tokens"].to_str().unwrap().parse::<u64>().unwrap() < 100000);
    assert!(h["x-ratelimit-reset-requests"].to_str().unwrap().ends_with('s'));
    assert_eq!(send().await.unwrap().status(), 200);
    let third = send().await.unwrap();
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["x-ratelimit-remaining-requests"], "0");
    let retry: u64 = third.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    let v: Value = third.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(v["error"]["type"], "requests");
    // Another key is not affected.
    assert_eq!(s.chat(body.clone()).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn every_answer_carries_ratelimit_headers_and_server_defaults_apply() {
    // No default: a key without limits reports the documented "unlimited" ceilings.
    let s = TestServer::start(&[]);
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let r = s.chat(body.clone()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    assert_eq!(h["x-ratelimit-limit-requests"], "1000000");
    assert_eq!(h["x-ratelimit-remaining-requests"], "999999");
    assert_eq!(h["x-ratelimit-limit-tokens"], "1000000000");
    assert!(h["x-ratelimit-remaining-tokens"].to_str().unwrap().parse::<u64>().unwrap() < 1_000_000_000);
    assert!(h.contains_key("x-ratelimit-reset-requests") && h.contains_key("x-ratelimit-reset-tokens"));
    // Streamed answers carry them too.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let r = s.chat(stream_body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "999998");
    drop(s);

    // --default-rpm limits keys without their own limit; a key's own limit still wins.
    let s = TestServer::start(&["--default-rpm", "2", "--default-tpm", "50000"]);
    let own = create_key(&s, &["--name", "own-limit", "--rpm", "5"]);
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let first = s.chat(body.clone()).send().await.unwrap();
    assert_eq!(first.headers()["x-ratelimit-limit-requests"], "2");
    assert_eq!(first.headers()["x-ratelimit-limit-tokens"], "50000");
    assert_eq!(s.chat(body.clone()).send().await.unwrap().status(), 200);
    let third = s.chat(body.clone()).send().await.unwrap();
    assert_eq!(third.status(), 429);
    let v: Value = third.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    let r = s.client().post(s.url("/v1/chat/completions")).bearer_auth(&own).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-limit-requests"], "5");
    assert_eq!(r.headers()["x-ratelimit-limit-tokens"], "50000");
}

#[tokio::test]
async fn images_are_fetched_only_after_admission() {
    let s = TestServer::start(&[]);
    let broke = create_key(&s, &["--name", "broke", "--budget-tokens", "1"]);
    // A loopback image URL: looking at it at all gives a 400 from the address guard.
    let body = json!({"model": s.model_id, "max_tokens": 3, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}
    ]}]});
    let r = s.client().post(s.url("/v1/chat/completions")).bearer_auth(&broke).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 429, "a key over its budget is refused before its images are looked at");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "insufficient_quota");
    // An admitted key gets the image checked (and refused), with the rate-limit headers.
    let r = s.chat(body).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.headers().contains_key("x-ratelimit-limit-requests"));
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("image"), "{v}");
}

/// Creates a key with `gantry keys create ARGS` in the server's data directory; its secret.
fn create_key(s: &TestServer, args: &[&str]) -> String {
    let out = gantry().args(["keys", "create"]).args(args).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_string()
}
