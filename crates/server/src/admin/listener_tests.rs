//! `--admin-listen`'s two routers, the admin API's throttle on wrong tokens, and what the
//! unauthenticated health probes may say. Test-only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use gantry_engine::{Event, FinishReason};
use serde_json::Value;

use crate::admin::guard::MAX_FAILURES;
use crate::router::Routes;
use crate::router_tests::{body, delta, harness_serving, usage, Harness, ScriptedEngine, KEY};

const ADMIN: &str = "listener-test-admin-8d2f6a0c4e9b1735";

async fn serving(which: Routes) -> Harness {
    let events = vec![delta("Hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    harness_serving(Arc::new(ScriptedEngine::new(events, usage(1))), Some(ADMIN), which).await
}

fn get(path: &str, bearer: Option<&str>, from: &str) -> Request<Body> {
    let mut builder = Request::get(path);
    if let Some(token) = bearer {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    let mut request = builder.body(Body::empty()).unwrap();
    let peer: SocketAddr = from.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

const OPERATOR_PATHS: [&str; 4] = ["/admin/v1/keys", "/console", "/console/assets/app.js", "/metrics"];

#[tokio::test]
async fn the_public_router_does_not_serve_the_operators_routes() {
    let h = serving(Routes::Public).await;
    for path in OPERATOR_PATHS {
        let (status, text) = h.send(get(path, Some(ADMIN), "192.0.2.1:4000")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {text}");
        assert_eq!(json(&text)["error"]["type"], "invalid_request_error", "{path}: {text}");
    }
    let (status, text) = h.send(get("/v1/models", Some(KEY), "192.0.2.1:4000")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = h.chat(body(serde_json::json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    for path in ["/health", "/health/live", "/health/ready"] {
        assert_eq!(h.send(get(path, None, "192.0.2.1:4000")).await.0, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn the_admin_listeners_router_serves_the_operators_routes_and_the_api_the_playground_calls() {
    let h = serving(Routes::Admin).await;
    let (status, text) = h.send(get("/admin/v1/keys", Some(ADMIN), "127.0.0.1:4000")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(json(&text)["data"].as_array().is_some_and(|keys| !keys.is_empty()), "{text}");
    for path in ["/console", "/console/assets/app.js", "/metrics", "/health", "/health/live", "/health/ready"] {
        let (status, text) = h.send(get(path, None, "127.0.0.1:4000")).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
    }
    // The console's playground posts to /v1/chat/completions on the console's own origin.
    let (status, text) = h.chat(body(serde_json::json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(h.send(get("/v1/models", None, "127.0.0.1:4000")).await.0, StatusCode::UNAUTHORIZED, "still keyed");
}

#[tokio::test]
async fn wrong_admin_tokens_lock_out_their_address_only() {
    let h = serving(Routes::All).await;
    let attacker = "203.0.113.9:5000";
    // Requests without any token guess nothing and lock nobody out.
    for _ in 0..2 * MAX_FAILURES {
        assert_eq!(h.send(get("/admin/v1/keys", None, attacker)).await.0, StatusCode::UNAUTHORIZED);
    }
    for i in 1..MAX_FAILURES {
        let (status, text) = h.send(get("/admin/v1/keys", Some(&format!("guess-{i}")), attacker)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {i}: {text}");
        assert_eq!(json(&text)["error"]["code"], "invalid_admin_token");
    }
    // An API key is a wrong admin token too, and the last one allowed.
    let response = h.app.clone();
    let refused = tower::ServiceExt::oneshot(response, get("/admin/v1/keys", Some(KEY), attacker)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after > 0);
    // Locked out: even the right token is refused, from any port of that address.
    let (status, text) = h.send(get("/admin/v1/keys", Some(ADMIN), "203.0.113.9:5001")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    let error = &json(&text)["error"];
    assert_eq!(
        (error["code"].as_str(), error["type"].as_str()),
        (Some("admin_auth_throttled"), Some("invalid_request_error"))
    );
    // Another address is not affected, and the API keeps serving the attacker's address.
    let (status, text) = h.send(get("/admin/v1/keys", Some(ADMIN), "198.51.100.4:6000")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = h.send(get("/v1/models", Some(KEY), attacker)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn a_right_admin_token_resets_the_failure_count() {
    let h = serving(Routes::All).await;
    let client = "192.0.2.77:7000";
    for round in 0..3 {
        for _ in 1..MAX_FAILURES {
            assert_eq!(
                h.send(get("/admin/v1/keys", Some("typo"), client)).await.0,
                StatusCode::UNAUTHORIZED,
                "round {round}"
            );
        }
        assert_eq!(h.send(get("/admin/v1/keys", Some(ADMIN), client)).await.0, StatusCode::OK, "round {round}");
    }
}

#[tokio::test]
async fn readiness_does_not_show_the_database_error() {
    let h = serving(Routes::Public).await;
    h.accounts.close().await;
    let (status, text) = h.send(get("/health/ready", None, "192.0.2.1:4000")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    let v = json(&text);
    assert_eq!(v, serde_json::json!({"status": "database_unreachable"}), "only which check failed: {text}");
}
