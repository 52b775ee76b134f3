//! Rerank and embeddings through the real binary, on tiny random BERTs (`tiny_gguf::
//! write_tiny_bert`: no reranker ships in a package reachable here) beside the tiny chat model:
//! `/v1/rerank` and llama.cpp's `/rerank` answer best first with scores in 0–1, the same for a
//! document alone or among others; a document too long is cut to fit; each route refuses the
//! other kinds of model; another key cannot reach a model it is not allowed; and the ledger books
//! what each answer's usage said.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{gantry, TestServer, KEY};
use serde_json::{json, Value};
use tiny_gguf::{BertPooling, TinyBertSpec};

/// The two tiny BERTs, written once for every test of the binary.
fn berts() -> &'static (PathBuf, PathBuf) {
    static PATHS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PATHS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-rerank-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, pooling| {
            let path = dir.join(format!("{name}.gguf"));
            tiny_gguf::write_tiny_bert(&path, &TinyBertSpec { pooling, ..Default::default() }).unwrap();
            path
        };
        (write("ranker", BertPooling::Rank), write("embedder", BertPooling::Mean))
    })
}

/// A server of the test's own (a shared one would outlive the tests and hold their output open).
fn server() -> TestServer {
    let (ranker, embedder) = berts();
    let (ranker, embedder) = (format!("ranker={}", ranker.display()), format!("embedder={}", embedder.display()));
    TestServer::start(&["--model", &ranker, "--model", &embedder])
}

async fn post(s: &TestServer, path: &str, key: &str, body: Value) -> (u16, Value) {
    let response = s.client().post(s.url(path)).bearer_auth(key).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: {status} {text}")))
}

const DOCS: [&str; 4] =
    ["paris is the capital of france", "the cat sat on the mat", "the stock market fell", "rates rose"];

#[tokio::test]
async fn results_come_best_first_in_0_1_and_each_score_is_the_documents_own() {
    let s = &server();
    let (status, all) =
        post(s, "/v1/rerank", KEY, json!({"model": "ranker", "query": "what is the capital?", "documents": DOCS}))
            .await;
    assert_eq!(status, 200, "{all}");
    let results = all["results"].as_array().unwrap();
    assert_eq!(results.len(), DOCS.len());
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first: {scores:?}");
    assert!(scores.iter().all(|s| (0.0..=1.0).contains(s)), "{scores:?}");
    assert!(scores.first() != scores.last(), "the documents score differently: {scores:?}");
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(r["document"]["text"], DOCS[i]);
        // The same pair alone scores the same (Cohere's shape: a document as `{"text"}`).
        let one = json!({"model": "ranker", "query": "what is the capital?", "documents": [{"text": DOCS[i]}]});
        let (_, alone) = post(s, "/v1/rerank", KEY, one).await;
        let alone = alone["results"][0]["relevance_score"].as_f64().unwrap();
        assert!((alone - r["relevance_score"].as_f64().unwrap()).abs() < 1e-5, "{alone} vs {r}");
    }
    assert_eq!(all["model"], "ranker");
    assert!(all["usage"]["prompt_tokens"].as_u64().unwrap() > 20);

    // llama.cpp's route, no model named: the reranker; top_n and no documents.
    let body = json!({"query": "what is the capital?", "documents": DOCS, "top_n": 2, "return_documents": false});
    let (status, top) = post(s, "/rerank", KEY, body).await;
    assert_eq!(status, 200, "{top}");
    assert_eq!(top["results"].as_array().unwrap().len(), 2);
    assert_eq!(top["results"][0]["index"], all["results"][0]["index"]);
    assert!(top["results"][0].get("document").is_none());
}

#[tokio::test]
async fn a_long_document_is_cut_to_fit_and_routes_refuse_the_wrong_model() {
    let s = &server();
    // The tiny reranker takes 128 tokens a pair.
    let long = "the cat sat on the mat ".repeat(100);
    let (status, v) = post(s, "/v1/rerank", KEY, json!({"model": "ranker", "query": "cat", "documents": [long]})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 128, "{v}");
    let long_query = json!({"model": "ranker", "query": "cat ".repeat(200), "documents": ["x"]});
    let (status, v) = post(s, "/v1/rerank", KEY, long_query).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("query")), "{v}");

    for (path, body) in [
        ("/v1/rerank", json!({"model": "embedder", "query": "q", "documents": ["d"]})),
        ("/v1/rerank", json!({"model": s.model_id, "query": "q", "documents": ["d"]})),
        ("/v1/embeddings", json!({"model": "ranker", "input": "hello"})),
        ("/v1/chat/completions", json!({"model": "ranker", "messages": [{"role": "user", "content": "hi"}]})),
    ] {
        let (status, v) = post(s, path, KEY, body.clone()).await;
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some("model")), "{path} {body}: {v}");
    }
    let (status, models) = {
        let r = s.client().get(s.url("/v1/models")).bearer_auth(KEY).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 200);
    let caps =
        |id: &str| models["data"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap()["capabilities"].clone();
    assert_eq!((caps("ranker"), caps("embedder")), (json!(["rerank"]), json!(["embeddings"])));
}

#[tokio::test]
async fn strangers_are_turned_away_and_the_ledger_books_what_was_told() {
    let s = &server();
    let body = json!({"model": "ranker", "query": "q", "documents": ["d"]});
    let r = s.client().post(s.url("/v1/rerank")).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401, "no key");
    // A key allowed only the chat model does not see the reranker.
    let out = gantry()
        .args(["keys", "create", "--name", "chat-only", "--models", &s.model_id, "--data-dir"])
        .arg(s.data_dir.path())
        .output()
        .unwrap();
    let created = String::from_utf8_lossy(&out.stdout).to_string();
    let other = created.split_whitespace().find(|w| w.starts_with("sk-")).unwrap_or_else(|| panic!("{created}"));
    let (status, v) = post(s, "/v1/rerank", other, body.clone()).await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("model_not_found")), "{v}");
    let (status, v) = post(s, "/v1/embeddings", other, json!({"model": "embedder", "input": "x"})).await;
    assert_eq!(status, 404, "{v}");

    let mut told = Vec::new();
    for (path, body) in [
        ("/v1/rerank", json!({"model": "ranker", "query": "where is paris?", "documents": DOCS})),
        ("/v1/embeddings", json!({"model": "embedder", "input": ["the cat", "the dog sat"]})),
    ] {
        let id = format!("told-{}", told.len());
        let r =
            s.client().post(s.url(path)).bearer_auth(KEY).header("x-request-id", &id).json(&body).send().await.unwrap();
        let v: Value = r.json().await.unwrap();
        told.push((id, v["usage"]["prompt_tokens"].as_u64().unwrap()));
    }
    for (id, tokens) in told {
        let mut row = None;
        for _ in 0..100 {
            let out = gantry()
                .args(["usage", "--requests", "--format", "json", "--data-dir"])
                .arg(s.data_dir.path())
                .output()
                .unwrap();
            let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
            row = rows.into_iter().find(|r| r["client_request_id"] == id.as_str());
            if row.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let row = row.unwrap_or_else(|| panic!("{id} was never booked"));
        assert_eq!(
            (row["prompt_tokens"].as_u64(), row["completion_tokens"].as_u64()),
            (Some(tokens), Some(0)),
            "{row}"
        );
    }
}
