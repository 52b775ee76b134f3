//! `/v1/embeddings` through the router with a scripted embedding model beside the scripted chat
//! model: each route refuses the other kind of model without loading it, vectors come back in
//! both encodings in input order, and the ledger books what the answer says. Test-only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use gantry_engine::{
    Capabilities, ChatInput, EmbedError, EmbeddingShape, Embeddings, GenerateRequest, GenerationHandle, Generator,
    Health, ModelInfo, Pooling, PrepareError, SubmitError, Usage,
};
use serde_json::{json, Value};

use crate::pool::{ModelLoader, ModelPool, ModelSpec, PoolOptions};
use crate::router_tests::{harness_tweaked, Harness, ScriptedEngine, KEY};

/// Two dimensions per vector: the input's index in its job, and its token count.
struct ScriptedEmbedder {
    info: ModelInfo,
}

impl Generator for ScriptedEmbedder {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }
    fn prepare(&self, _: ChatInput) -> Result<GenerateRequest, PrepareError> {
        Err(PrepareError::NotGenerative)
    }
    fn prepare_raw(&self, _: ChatInput, _: gantry_engine::RawPrompt) -> Result<GenerateRequest, PrepareError> {
        Err(PrepareError::NotGenerative)
    }
    /// A token per word (its length), plus a leading special token as BERT's `[CLS]`.
    fn tokenize(&self, text: &str, add_special: bool, _: bool) -> Vec<i32> {
        let words = text.split_whitespace().map(|w| w.len() as i32);
        std::iter::once(1).filter(|_| add_special).chain(words).collect()
    }
    fn submit(&self, _: GenerateRequest) -> Result<GenerationHandle, SubmitError> {
        Err(SubmitError::Failed("an embedding model generates no text".into()))
    }
    fn health(&self) -> Health {
        Health::Ready
    }
    fn embedding_shape(&self) -> Option<EmbeddingShape> {
        Some(EmbeddingShape { dimensions: 2, max_input_tokens: 8 })
    }
    fn embed(
        &self,
        _: gantry_engine::Owner,
        inputs: Vec<Vec<i32>>,
    ) -> tokio::sync::oneshot::Receiver<Result<Embeddings, EmbedError>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let vectors = inputs.iter().enumerate().map(|(i, input)| vec![i as f32, input.len() as f32]).collect();
        let _ = tx.send(Ok(vectors));
        rx
    }
}

struct Loader {
    chat: Arc<ScriptedEngine>,
    embedder: Arc<ScriptedEmbedder>,
    embedder_loads: Arc<AtomicUsize>,
}

impl ModelLoader for Loader {
    fn estimate(&self, _: &ModelSpec) -> anyhow::Result<u64> {
        Ok(1)
    }
    fn load(&self, spec: &ModelSpec) -> anyhow::Result<(Arc<dyn Generator>, u64)> {
        if spec.capabilities.embeds() {
            self.embedder_loads.fetch_add(1, Ordering::SeqCst);
            return Ok((self.embedder.clone(), 0));
        }
        Ok((self.chat.clone(), 0))
    }
}

/// The router with the scripted chat model `scripted` and the scripted embedding model
/// `embedder`; the count of the embedder's loads.
async fn harness() -> (Harness, Arc<AtomicUsize>) {
    let chat = Arc::new(ScriptedEngine::new(Vec::new(), Usage::default()));
    let embedder_loads = Arc::new(AtomicUsize::new(0));
    let info = ModelInfo { path: PathBuf::from("embedder.gguf"), n_vocab: 100, ..chat.model_info().clone() };
    let loader = Loader {
        chat: chat.clone(),
        embedder: Arc::new(ScriptedEmbedder { info }),
        embedder_loads: embedder_loads.clone(),
    };
    let loads = embedder_loads.clone();
    let harness = harness_tweaked(chat, None, Default::default(), crate::router::Routes::All, move |state| {
        let mut specs = state.models.specs().to_vec();
        let mut embedder = specs[0].clone();
        embedder.id = "embedder".into();
        embedder.aliases = Vec::new();
        embedder.capabilities =
            Capabilities { pooling: Pooling::Mean, chat_template: false, fill_in_the_middle: false };
        specs.push(embedder);
        let options = PoolOptions { budget: 1 << 30, wait_for_room: std::time::Duration::from_secs(1) };
        state.models = ModelPool::new(specs, Box::new(loader), options);
    })
    .await;
    (harness, loads)
}

async fn post(h: &Harness, path: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, text) = h.send(request).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn each_route_refuses_the_other_kind_of_model_without_loading_it() {
    let (h, embedder_loads) = harness().await;
    let (status, body) = post(&h, "/v1/embeddings", json!({"model": "scripted", "input": "hi"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "model");
    assert!(body["error"]["message"].as_str().unwrap().contains("does not give embeddings"), "{body}");
    for (path, request) in [
        ("/v1/chat/completions", json!({"model": "embedder", "messages": [{"role": "user", "content": "hi"}]})),
        ("/v1/completions", json!({"model": "embedder", "prompt": "hi"})),
    ] {
        let (status, body) = post(&h, path, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"]["param"], "model", "{path}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("embedding model"), "{body}");
    }
    assert_eq!(embedder_loads.load(Ordering::SeqCst), 0);
    let (status, body) = post(&h, "/v1/embeddings", json!({"model": "nope", "input": "hi"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("model_not_found")));
}

#[tokio::test]
async fn vectors_come_in_input_order_in_either_encoding_and_the_ledger_books_the_usage() {
    let (h, _) = harness().await;
    let input = json!(["one two", "three", [5, 6, 7]]);
    let (status, float) = post(&h, "/v1/embeddings", json!({"model": "embedder", "input": input})).await;
    assert_eq!(status, StatusCode::OK, "{float}");
    // Texts get the special token; token arrays are taken as they are.
    let want = json!([[0.0, 3.0], [1.0, 2.0], [2.0, 3.0]]);
    let got: Vec<Value> = float["data"].as_array().unwrap().iter().map(|d| d["embedding"].clone()).collect();
    assert_eq!(Value::Array(got), want);
    assert_eq!(float["data"][2]["index"], 2);
    assert_eq!(float["model"], "embedder");
    assert_eq!(float["usage"], json!({"prompt_tokens": 8, "total_tokens": 8}));
    let (status, b64) =
        post(&h, "/v1/embeddings", json!({"model": "embedder", "input": "a b c", "encoding_format": "base64"})).await;
    assert_eq!(status, StatusCode::OK, "{b64}");
    let bytes =
        base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap();
    assert_eq!(bytes, [0.0f32.to_le_bytes(), 4.0f32.to_le_bytes()].concat());
    h.meter.shutdown(std::time::Duration::from_secs(10)).await;
    let rows = h.accounts.usage_summary().await.unwrap();
    let row = rows.iter().find(|r| r.model == "embedder").expect("the embeddings were booked");
    assert_eq!((row.requests, row.prompt_tokens, row.completion_tokens), (2, 12, 0));
}

#[tokio::test]
async fn bounds_of_the_model_are_400s_naming_the_field() {
    let (h, _) = harness().await;
    let cases = [
        (json!({"model": "embedder", "input": "x", "dimensions": 3}), "dimensions"),
        (json!({"model": "embedder", "input": "1 2 3 4 5 6 7 8"}), "input"),
        (json!({"model": "embedder", "input": [[1, 100]]}), "input"),
        (json!({"model": "embedder", "input": "x", "encoding_format": "int8"}), "encoding_format"),
    ];
    for (request, param) in cases {
        let (status, body) = post(&h, "/v1/embeddings", request.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {body}");
        assert_eq!(body["error"]["param"], param, "{request}: {body}");
    }
    // The model's own length is accepted.
    let (status, body) = post(&h, "/v1/embeddings", json!({"model": "embedder", "input": "x", "dimensions": 2})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn the_model_list_says_what_each_model_serves() {
    let (h, _) = harness().await;
    let request =
        Request::get("/v1/models").header("authorization", format!("Bearer {KEY}")).body(Body::empty()).unwrap();
    let (status, text) = h.send(request).await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&text).unwrap();
    let of =
        |id: &str| list["data"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap()["capabilities"].clone();
    assert_eq!(of("scripted"), json!(["chat", "completions"]));
    assert_eq!(of("embedder"), json!(["embeddings"]));
}
