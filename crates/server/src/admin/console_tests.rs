//! Router tests of what the console relies on: `/admin/v1/stats` (auth, shape, live figures),
//! keys listed with their spend, and `/console` itself (served only with an admin token, under a
//! strict Content-Security-Policy, with no inline script or style).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use gantry_engine::{Event, FinishReason};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::admin::console::CONTENT_SECURITY_POLICY;
use crate::router_tests::{body, delta, harness_with_admin, usage, Harness, ScriptedEngine, KEY};

const ADMIN: &str = "console-test-admin-token";

async fn console_harness(admin_token: Option<&str>) -> Harness {
    let events = vec![delta("Hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    harness_with_admin(Arc::new(ScriptedEngine::new(events, usage(1))), admin_token).await
}

async fn get(h: &Harness, path: &str, bearer: Option<&str>) -> (StatusCode, HeaderMap, String) {
    let mut request = Request::get(path);
    if let Some(token) = bearer {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = h.app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn admin_post(h: &Harness, path: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, text) = h.send(request).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test]
async fn stats_needs_the_admin_token() {
    let off = console_harness(None).await;
    let (status, _, text) = get(&off, "/admin/v1/stats", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert_eq!(json_of(&text)["error"]["code"], "admin_api_disabled");

    let on = console_harness(Some(ADMIN)).await;
    for bearer in [None, Some("wrong-token"), Some(KEY)] {
        let (status, _, text) = get(&on, "/admin/v1/stats", bearer).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bearer:?}: {text}");
        assert_eq!(json_of(&text)["error"]["code"], "invalid_admin_token");
    }
    let (status, _, text) = get(&on, "/admin/v1/stats", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn stats_has_the_figures_the_overview_draws_and_they_move() {
    // The process-wide recorder (as `gantry serve` installs it) feeds the stats' tap.
    crate::telemetry::install();
    let h = console_harness(Some(ADMIN)).await;
    h.stats.sample();
    let (_, _, before) = get(&h, "/admin/v1/stats", Some(ADMIN)).await;
    let before = json_of(&before);
    assert_eq!(before["object"], "stats");
    assert_eq!(before["series"], json!([]), "one sample is only the baseline");

    let (status, text) = h.chat(body(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let bad_key = Request::post("/v1/chat/completions")
        .header(header::AUTHORIZATION, "Bearer sk-gantry-not-a-key-0123456789abcdefghij")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body(json!({})).to_string()))
        .unwrap();
    assert_eq!(h.send(bad_key).await.0, StatusCode::UNAUTHORIZED);
    h.stats.sample();

    let (_, _, after) = get(&h, "/admin/v1/stats", Some(ADMIN)).await;
    let after = json_of(&after);
    // Other tests in this process count too, hence "at least".
    let grew = |v: &Value, field: &str| v["now"][field].as_u64().unwrap();
    assert!(grew(&after, "requests_total") >= grew(&before, "requests_total") + 2, "{after}");
    assert!(after["now"]["errors_total"]["401"].as_u64().unwrap() >= 1, "{after}");
    for field in
        ["queue_depth", "running_sequences", "kv_cache_tokens", "kv_cache_capacity_tokens", "completion_tokens_total"]
    {
        assert!(after["now"][field].is_number(), "now.{field}: {after}");
    }
    assert_eq!(after["sample_seconds"], 5);
    assert_eq!(after["window_seconds"], 900);
    let series = after["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{after}");
    let point = &series[0];
    assert!(point["requests_per_second"].as_f64().unwrap() > 0.0, "{point}");
    assert!(point["errors"]["401"].as_u64().unwrap() >= 1, "{point}");
    for field in [
        "at_ms",
        "completion_tokens_per_second",
        "prompt_tokens_per_second",
        "queue_depth",
        "running_sequences",
        "kv_cache_tokens",
    ] {
        assert!(point[field].is_number(), "series[0].{field}: {point}");
    }
    assert!(point["completion_tokens_per_second_by_model"].is_object(), "{point}");
    for field in ["ttft_p50", "ttft_p95", "itl_p50", "itl_p95"] {
        assert!(point[field].is_number() || point[field].is_null(), "series[0].{field}: {point}");
    }
    let window = &after["window"];
    assert!(window["requests"].as_u64().unwrap() >= 2, "{window}");
    for q in ["ttft_seconds", "inter_token_seconds"] {
        assert!(
            window[q]["count"].is_u64() && window[q].get("p50").is_some() && window[q].get("p95").is_some(),
            "{window}"
        );
    }
    assert!(after["models"].is_array());
}

#[tokio::test]
async fn listed_keys_carry_their_spend() {
    let h = console_harness(Some(ADMIN)).await;
    let (status, created) = admin_post(&h, "/admin/v1/keys", json!({"name": "budgeted", "budget_tokens": 1000})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, _, text) = get(&h, "/admin/v1/keys", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let list = json_of(&text);
    let key = list["data"].as_array().unwrap().iter().find(|k| k["name"] == "budgeted").expect("the new key is listed");
    assert_eq!(key["budget_tokens"], 1000);
    assert_eq!(key["spend"]["tokens"], 0, "{key}");
    assert!(key["spend"]["usd"].is_number(), "{key}");
    assert!(key.get("secret").is_none(), "a list never shows secrets: {key}");
}

fn assert_locked_down(headers: &HeaderMap) {
    assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
    assert!(
        CONTENT_SECURITY_POLICY.contains("script-src 'self';")
            && CONTENT_SECURITY_POLICY.contains("frame-ancestors 'none'")
    );
    assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
}

#[tokio::test]
async fn without_an_admin_token_the_console_says_how_to_enable_it() {
    let h = console_harness(None).await;
    let (status, headers, text) = get(&h, "/console", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html"));
    assert!(text.contains("--admin-token") && text.contains("GANTRY_ADMIN_TOKEN"), "{text}");
    assert!(!text.contains("app.js"), "the console itself is not served: {text}");
    assert_locked_down(&headers);
    let (status, _, _) = get(&h, "/console/assets/app.js", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy() {
    let h = console_harness(Some(ADMIN)).await;
    let (status, headers, page) = get(&h, "/console", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_locked_down(&headers);
    assert!(page.contains(r#"<script type="module" src="/console/assets/app.js"></script>"#), "{page}");
    for (path, content_type) in [
        ("/console/assets/app.js", "text/javascript; charset=utf-8"),
        ("/console/assets/pages/keys.js", "text/javascript; charset=utf-8"),
        ("/console/assets/console.css", "text/css; charset=utf-8"),
        ("/console/assets/favicon.svg", "image/svg+xml"),
    ] {
        let (status, headers, _) = get(&h, path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
        assert_locked_down(&headers);
    }
    for missing in ["/console/assets/nope.js", "/console/assets/../Cargo.toml"] {
        assert_eq!(get(&h, missing, None).await.0, StatusCode::NOT_FOUND, "{missing}");
    }
}

/// The policy forbids inline script and style; a page that used them would break in the browser.
#[test]
fn console_files_use_no_inline_script_or_style_or_html_injection() {
    for (path, bytes) in crate::admin::console::ASSETS {
        let text = std::str::from_utf8(bytes).unwrap();
        if path.ends_with(".html") {
            assert!(!text.contains(" style="), "{path} has an inline style attribute");
            assert!(!text.contains("<style"), "{path} has an inline <style>");
            for script in text.split("<script").skip(1) {
                assert!(script.trim_start().starts_with("type=\"module\" src="), "{path} has an inline script");
            }
        }
        if path.ends_with(".js") {
            for banned in ["innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "new Function", "document.write"] {
                assert!(!text.contains(banned), "{path} uses {banned}");
            }
            assert!(!text.contains("localStorage"), "{path}: the admin token belongs in sessionStorage only");
        }
    }
}
