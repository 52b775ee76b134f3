//! Several models in one server, through the real binary: two tiny models under a memory budget
//! that holds one at a time, and a third whose file is cut short.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{gantry, sse_data, tiny_model, TestServer};
use serde_json::{json, Value};

const FIRST: &str = "tiny-chatml";

/// A second tiny model (other weights) and a third whose tensor data is cut off: its header
/// reads, so the server starts, but llama.cpp cannot load it.
fn more_models() -> &'static (PathBuf, PathBuf) {
    static PATHS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PATHS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-several-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (second, broken) = (dir.join("second.gguf"), dir.join("broken.gguf"));
        let spec = tiny_gguf::TinyModelSpec { seed: 7, ..Default::default() };
        tiny_gguf::write_tiny_model(&second, &spec).unwrap();
        let bytes = tiny_gguf::tiny_model_bytes(&spec).unwrap();
        std::fs::write(&broken, &bytes[..bytes.len() * 9 / 10]).unwrap();
        (second, broken)
    })
}

/// A budget that holds one tiny model but not two (both have the same shape, so the same
/// estimate), at the settings `TestServer` starts with.
fn one_model_budget() -> String {
    let mut config = gantry_engine::EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel) = (512, 4);
    (config.estimate_memory().unwrap().total() * 3 / 2).to_string()
}

fn start(budget: &str, extra: &[&str]) -> TestServer {
    let (second, broken) = more_models();
    let mut args = vec![
        "--model".to_string(),
        format!("second={}", second.display()),
        "--model".to_string(),
        format!("broken={}", broken.display()),
        "--max-memory".to_string(),
        budget.to_string(),
        // The models' figures are read from `/metrics`, without the admin token.
        "--public-metrics".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TestServer::start(&args)
}

async fn ask(s: &TestServer, model: &str) -> (u16, Value) {
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0});
    let resp = s.chat(body).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn loaded_models(s: &TestServer) -> Vec<(String, f64)> {
    let text = s.client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("gantry_model_loaded_bytes{model=\""))
        .map(|rest| {
            let (model, value) = rest.split_once("\"} ").unwrap();
            (model.to_string(), value.parse().unwrap())
        })
        .filter(|(_, bytes)| *bytes > 0.0)
        .collect()
}

fn ledger(s: &TestServer) -> Vec<Value> {
    let out = gantry()
        .args(["usage", "--requests", "--format", "json", "--data-dir"])
        .arg(s.data_dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn two_models_take_turns_in_a_budget_that_holds_one_and_a_broken_one_fails_alone() {
    let s = start(&one_model_budget(), &[]);
    let listed: Value =
        s.client().get(s.url("/v1/models")).bearer_auth(common::KEY).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [FIRST, "second", "broken"], "every model is listed, loaded or not");
    assert_eq!(
        loaded_models(&s).await.into_iter().map(|(m, _)| m).collect::<Vec<_>>(),
        [FIRST],
        "only the first loads at start"
    );

    let mut told = Vec::new();
    for model in ["second", FIRST, "second", FIRST] {
        let (status, v) = ask(&s, model).await;
        assert_eq!(status, 200, "{model}: {v}");
        assert_eq!(v["model"], model);
        told.push((model, v["usage"]["total_tokens"].as_i64().unwrap()));
        let loaded: Vec<String> = loaded_models(&s).await.into_iter().map(|(m, _)| m).collect();
        assert_eq!(loaded, [model], "the budget holds one model: the other was unloaded");
    }
    let metrics = s.client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("gantry_model_evictions_total{model=\"second\"} 2"), "{metrics}");
    assert!(metrics.contains(&format!("gantry_model_loads_total{{model=\"{FIRST}\"}} 3")), "{metrics}");

    // A file llama.cpp cannot load: that request gets a clear, retryable error; the server
    // and its other models go on.
    let (status, v) = ask(&s, "broken").await;
    assert_eq!(status, 503, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("`broken` could not be loaded"), "{v}");
    let health = s.client().get(s.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let (status, v) = ask(&s, FIRST).await;
    assert_eq!(status, 200, "{v}");
    told.push((FIRST, v["usage"]["total_tokens"].as_i64().unwrap()));

    // Every answer is in the ledger under the id its client used, with the tokens it was told.
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = ledger(&s);
        if rows.len() == told.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(rows.len(), told.len(), "{rows:?}");
    for model in [FIRST, "second"] {
        let billed: i64 = rows
            .iter()
            .filter(|r| r["model"] == model)
            .map(|r| r["prompt_tokens"].as_i64().unwrap() + r["completion_tokens"].as_i64().unwrap())
            .sum();
        let answered: i64 = told.iter().filter(|(m, _)| *m == model).map(|(_, t)| t).sum();
        assert!(answered > 0);
        assert_eq!(billed, answered, "{model}");
    }
    assert!(rows.iter().all(|r| r["model"] != "broken"), "a model that never loaded bills nothing");
}

#[tokio::test]
async fn a_running_stream_keeps_its_model_while_a_request_for_another_waits() {
    let s = start(&one_model_budget(), &[]);
    let body = json!({"model": FIRST, "messages": [{"role": "user", "content": "go"}], "max_tokens": 480, "stream": true,
                      "stream_options": {"include_usage": true}, "logit_bias": common::ban_special_tokens(&s, common::KEY).await});
    let mut stream = s.chat(body).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let mut text = String::from_utf8(stream.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    // The first model is busy: the second cannot load until the stream ends, then it does.
    let waiting = tokio::spawn({
        let client = s.client();
        let url = s.url("/v1/chat/completions");
        async move {
            let body = json!({"model": "second", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
            let resp = client.post(url).bearer_auth(common::KEY).json(&body).send().await.unwrap();
            (resp.status().as_u16(), std::time::Instant::now())
        }
    });
    while let Some(chunk) = stream.chunk().await.unwrap() {
        text.push_str(core::str::from_utf8(&chunk).unwrap());
    }
    let stream_ended = std::time::Instant::now();
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "the stream was not cut");
    let usage = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["usage"]["completion_tokens"].as_i64());
    assert_eq!(usage, Some(480));
    let (status, answered_at) = waiting.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        answered_at >= stream_ended - std::time::Duration::from_millis(50),
        "the second model loaded only after the stream ended"
    );
}

#[tokio::test]
async fn pinned_models_load_at_start_and_a_model_larger_than_the_budget_stops_the_server() {
    let s = start("4GiB", &["--pin", "second"]);
    let mut loaded: Vec<String> = loaded_models(&s).await.into_iter().map(|(m, _)| m).collect();
    loaded.sort(); // the exporter's order is its own
    assert_eq!(loaded, ["second", FIRST]);
    drop(s);

    for (budget, extra, expected) in
        [("1MB", vec![], "raise --max-memory"), ("4GiB", vec!["--pin", "nope"], "--pin nope")]
    {
        let (second, _) = more_models();
        let out = gantry()
            .args(["serve", "--port", "0", "--ctx-size", "512", "--parallel", "4", "--threads", "1", "--model"])
            .arg(tiny_model())
            .arg("--model")
            .arg(format!("second={}", second.display()))
            .args(["--max-memory", budget])
            .args(extra)
            .arg("--data-dir")
            .arg(tempfile::tempdir().unwrap().path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[tokio::test]
async fn operators_see_and_load_and_unload_models_over_the_admin_api() {
    // Long streams (2000 tokens take the tiny model over a second), so the one below is still
    // running when the operator asks.
    let s = start("4GiB", &["--admin-token", "several-models-admin-5e0b8c3f7a1d9246b8e4", "--ctx-size", "2048"]);
    let admin = |method: reqwest::Method, path: &str| {
        s.client()
            .request(method, s.url(&format!("/admin/v1{path}")))
            .bearer_auth("several-models-admin-5e0b8c3f7a1d9246b8e4")
    };
    let listed: Value = admin(reqwest::Method::GET, "/models").send().await.unwrap().json().await.unwrap();
    let states: Vec<(&str, &str)> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [(FIRST, "loaded"), ("second", "unloaded"), ("broken", "unloaded")]);
    assert!(listed["data"][0]["bytes"].as_u64().unwrap() > 0);

    let loaded: Value = admin(reqwest::Method::POST, "/models/second/load").send().await.unwrap().json().await.unwrap();
    assert_eq!((loaded["state"].as_str(), loaded["running_requests"].as_u64()), (Some("loaded"), Some(0)));
    let failed = admin(reqwest::Method::POST, "/models/broken/load").send().await.unwrap();
    assert_eq!(failed.status(), 503);

    // A model with a stream running is not unloaded unless forced; forced, the stream is cut
    // and ends with an error event, and the model is unloaded.
    let body = json!({"model": FIRST, "messages": [{"role": "user", "content": "go"}], "max_tokens": 2000, "stream": true,
                      "logit_bias": common::ban_special_tokens(&s, common::KEY).await});
    let mut stream = s.chat(body).send().await.unwrap();
    let mut text = String::from_utf8(stream.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    let refused = admin(reqwest::Method::POST, &format!("/models/{FIRST}/unload")).send().await.unwrap();
    assert_eq!(refused.status(), 409);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_in_use");
    let forced = admin(reqwest::Method::POST, &format!("/models/{FIRST}/unload?force=true")).send().await.unwrap();
    assert_eq!(forced.status(), 200);
    let v: Value = forced.json().await.unwrap();
    assert_eq!(v["state"], "unloaded");
    while let Some(chunk) = stream.chunk().await.unwrap() {
        text.push_str(core::str::from_utf8(&chunk).unwrap());
    }
    assert!(sse_data(&text).iter().any(|d| d.contains("\"error\"")), "the cut stream says so: {text}");
    // Asked for again, it loads again.
    assert_eq!(ask(&s, FIRST).await.0, 200);
    let missing = admin(reqwest::Method::POST, "/models/nope/unload").send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn a_models_file_gives_aliases_and_idle_unloading() {
    let (second, _) = more_models();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("models.toml");
    std::fs::write(
        &file,
        format!(
            "[[model]]\nmodel = \"{}\"\nid = \"second\"\naliases = [\"gpt-4o-mini\"]\nidle_unload_s = 1\n",
            second.display()
        ),
    )
    .unwrap();
    let s = TestServer::start(&["--models-config", file.to_str().unwrap(), "--public-metrics"]);
    let listed: Value =
        s.client().get(s.url("/v1/models")).bearer_auth(common::KEY).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [FIRST, "second", "gpt-4o-mini"]);

    let (status, v) = ask(&s, "gpt-4o-mini").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "second", "the answer names the model that wrote it");
    // It was loaded for the request (a counter: the unload below may already have come).
    let metrics = s.client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "gantry_model_loads_total{model=\"second\"} 1"), "{metrics}");
    // Idle for its idle_unload_s (checked every second): unloaded; the first model has none.
    let mut after = Vec::new();
    for _ in 0..50 {
        after = loaded_models(&s).await.into_iter().map(|(m, _)| m).collect();
        if after == [FIRST] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(after, [FIRST]);
    let rows = ledger(&s);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["model"], "gpt-4o-mini", "the ledger keeps the name the client sent");
}

#[tokio::test]
async fn a_keys_allow_list_and_prices_apply_per_model() {
    let s = start("4GiB", &["--price", "second=1000,2000"]);
    let out = gantry()
        .args(["keys", "create", "--name", "only-second", "--models", "second", "--data-dir"])
        .arg(s.data_dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let narrow = String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_string();

    // It sees and may use the one model it is allowed; the others are missing to it, as OpenAI
    // answers for a model a key may not use.
    let listed: Value =
        s.client().get(s.url("/v1/models")).bearer_auth(&narrow).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        listed["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect::<Vec<_>>(),
        ["second"]
    );
    for (model, status) in [(FIRST, 404), ("broken", 404), ("second", 200)] {
        let one = s.client().get(s.url(&format!("/v1/models/{model}"))).bearer_auth(&narrow).send().await.unwrap();
        assert_eq!(one.status().as_u16(), status, "GET /v1/models/{model}");
        let body =
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
        let resp =
            s.client().post(s.url("/v1/chat/completions")).bearer_auth(&narrow).json(&body).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "POST {model}");
        if status == 404 {
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], "model_not_found");
        }
    }
    // The server's own key uses both; only `second` has a price.
    assert_eq!(ask(&s, FIRST).await.0, 200);
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = ledger(&s);
        if rows.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        let expected = if r["model"] == "second" {
            (r["prompt_tokens"].as_f64().unwrap() * 1000.0 + r["completion_tokens"].as_f64().unwrap() * 2000.0) / 1e6
        } else {
            0.0
        };
        assert!((r["cost"].as_f64().unwrap() - expected).abs() < 1e-9, "{r}");
        assert!(r["cost"].as_f64().unwrap() > 0.0 || r["model"] == FIRST, "{r}");
    }
}
