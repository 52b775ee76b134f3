//! Router tests of `/admin/v1/usage` and `/admin/v1/usage/requests` over a ledger written
//! directly: each batch's spend is a row of its own, and `batch_id` keeps one batch's lines.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use gantry_accounts::UsageRecord;
use serde_json::{json, Value};

use crate::router_tests::{harness_with_admin, usage, Harness, ScriptedEngine};

const ADMIN: &str = "usage-test-admin-token";

async fn get(h: &Harness, path: &str) -> (StatusCode, String) {
    let request = Request::get(path).header(header::AUTHORIZATION, format!("Bearer {ADMIN}"));
    h.send(request.body(Body::empty()).unwrap()).await
}

async fn rows(h: &Harness, path: &str) -> Vec<Value> {
    let (status, text) = get(h, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["data"].as_array().unwrap().clone()
}

/// A request of the harness's key; `batch` makes it a line of that batch, billed in tier `batch`.
fn record(key_id: i64, id: &str, prompt: u32, batch: Option<&str>) -> UsageRecord {
    UsageRecord {
        request_id: id.into(),
        client_request_id: None,
        key_id,
        model: "scripted".into(),
        prompt_tokens: prompt,
        cached_tokens: 0,
        completion_tokens: 1,
        reasoning_tokens: 0,
        cost_nanos: 0,
        service_tier: if batch.is_some() { "batch" } else { "default" }.into(),
        batch_id: batch.map(String::from),
        outcome: "completed".into(),
        started_at_ms: 1_800_000_000_000,
        finished_at_ms: 1_800_000_000_100,
    }
}

#[tokio::test]
async fn usage_is_reported_by_batch_and_filtered_to_one() {
    let h = harness_with_admin(Arc::new(ScriptedEngine::new(Vec::new(), usage(1))), Some(ADMIN)).await;
    let key_id = h.accounts.find_key("router-test").await.unwrap().id;
    for (id, prompt, batch) in
        [("i1", 10, None), ("a1", 20, Some("batch_a")), ("a2", 30, Some("batch_a")), ("b1", 40, Some("batch_b"))]
    {
        h.accounts.record_usage(&record(key_id, id, prompt, batch)).await.unwrap();
    }

    let all = rows(&h, "/admin/v1/usage").await;
    let groups: Vec<Value> =
        all.iter().map(|r| json!([r["service_tier"], r["batch_id"], r["requests"], r["prompt_tokens"]])).collect();
    assert_eq!(
        groups,
        [json!(["batch", "batch_a", 2, 50]), json!(["batch", "batch_b", 1, 40]), json!(["default", null, 1, 10])],
        "{all:?}"
    );

    let one = rows(&h, "/admin/v1/usage?batch_id=batch_a&group_by=day").await;
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(json!([one[0]["batch_id"], one[0]["requests"], one[0]["day"]]), json!(["batch_a", 2, "2027-01-15"]));

    let (status, csv) = get(&h, "/admin/v1/usage?batch_id=batch_b&format=csv").await;
    assert_eq!(status, StatusCode::OK, "{csv}");
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].ends_with(",key_id,service_tier,batch_id"), "{csv}");
    assert_eq!(lines.len(), 2, "{csv}");
    assert!(lines[1].ends_with(&format!(",{key_id},batch,batch_b")), "{csv}");

    let requests = rows(&h, "/admin/v1/usage/requests?batch_id=batch_a").await;
    let ids: Vec<Value> = requests.iter().map(|r| json!([r["request_id"], r["batch_id"]])).collect();
    assert_eq!(ids, [json!(["a1", "batch_a"]), json!(["a2", "batch_a"])]);
    assert!(rows(&h, "/admin/v1/usage?batch_id=batch_none").await.is_empty());
}
