//! A base model beside a chat model, through the real binary: a GGUF without a chat template
//! loads and is served, and a chat on it is the client's 400 in every dialect (naming the model),
//! never a failed load nor a template made up; the chat model beside it answers as before.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{gantry, TestServer, KEY};
use serde_json::{json, Value};

/// A tiny model whose GGUF has no `tokenizer.chat_template`, as Gemma 3 270M's base GGUF.
fn base_model() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-base-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.gguf");
        let spec = tiny_gguf::TinyModelSpec { chat_template: None, ..Default::default() };
        tiny_gguf::write_tiny_model(&path, &spec).unwrap();
        path
    })
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let response = s
        .client()
        .post(s.url(path))
        .bearer_auth(KEY)
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: {status} {text}")))
}

/// The refusal's message, checked to name the model and the missing template.
fn refusal_message(v: &Value) -> &str {
    let message = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(message.contains("`base`") && message.contains("no chat template"), "{v}");
    message
}

#[tokio::test]
async fn a_chat_on_a_model_without_a_chat_template_is_a_400_in_every_dialect() {
    let s = TestServer::start(&["--model", &format!("base={}", base_model().display()), "--public-metrics"]);
    let user = json!([{"role": "user", "content": "hello"}]);

    for stream in [false, true] {
        let body = json!({"model": "base", "messages": user, "max_tokens": 4, "stream": stream});
        let (status, v) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(status, 400, "stream {stream}: {v}");
        assert_eq!(
            (v["error"]["type"].as_str(), v["error"]["param"].as_str()),
            (Some("invalid_request_error"), Some("model"))
        );
        refusal_message(&v);

        let body = json!({"model": "base", "input": "hello", "max_output_tokens": 16, "stream": stream});
        let (status, v) = post(&s, "/v1/responses", body).await;
        assert_eq!(status, 400, "stream {stream}: {v}");
        assert_eq!(v["error"]["param"], "model", "{v}");
        refusal_message(&v);

        let body = json!({"model": "base", "messages": user, "max_tokens": 4, "stream": stream});
        let (status, v) = post(&s, "/v1/messages", body).await;
        assert_eq!(status, 400, "stream {stream}: {v}");
        assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")));
        refusal_message(&v);
    }
    let (status, v) = post(&s, "/v1/messages/count_tokens", json!({"model": "base", "messages": user})).await;
    assert_eq!(status, 400, "{v}");
    refusal_message(&v);

    // The model was loaded to be asked (it is served, for what it can do), and stays loaded.
    let metrics = s.client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let loaded = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gantry_model_loaded_bytes{model=\"base\"} "))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(loaded.parse::<f64>().unwrap() > 0.0, "{metrics}");
    assert!(metrics.contains("gantry_model_loads_total{model=\"base\"} 1"), "loaded once: {metrics}");

    // The chat model beside it answers, and only its answer is billed.
    let (status, v) =
        post(&s, "/v1/chat/completions", json!({"model": s.model_id, "messages": user, "max_tokens": 4})).await;
    assert_eq!(status, 200, "{v}");
    let mut rows = Vec::new();
    for _ in 0..100 {
        let out =
            gantry().args(["usage", "--requests", "--format", "json", "--data-dir"]).arg(s.data_dir.path()).output();
        rows = serde_json::from_slice::<Vec<Value>>(&out.unwrap().stdout).unwrap();
        if !rows.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let models: Vec<&str> = rows.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(models, [s.model_id.as_str()], "{rows:?}");
}
