//! Authentication before the body, the body read timeout, the per-address budget of failed
//! authentications and the image pixel bound, driven through the router in-process.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use gantry_engine::{Event, FinishReason};

use crate::router::RouterOptions;
use crate::router_tests::{body, delta, harness_with_options, usage, Harness, ScriptedEngine, KEY};

/// Longer than any of these tests needs; reaching it means the server waited for a body that
/// never comes.
const STUCK: Duration = Duration::from_secs(20);

async fn harness(options: RouterOptions) -> Harness {
    let events = vec![delta("hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    let engine = Arc::new(ScriptedEngine::new(events, usage(1)));
    harness_with_options(engine, Some("admin-token-for-connection-tests"), options, crate::router::Routes::All).await
}

/// A body that sends `head` and then never ends, noting whether anything polled it.
fn endless_body(head: &'static [u8]) -> (Body, Arc<AtomicBool>) {
    let polled = Arc::new(AtomicBool::new(false));
    let seen = polled.clone();
    let first = futures_util::stream::once(async move {
        seen.store(true, Ordering::SeqCst);
        Ok::<_, std::io::Error>(Bytes::from_static(head))
    });
    (Body::from_stream(futures_util::StreamExt::chain(first, futures_util::stream::pending())), polled)
}

fn post(path: &str, authorization: Option<&str>, body: Body, peer: &str) -> Request<Body> {
    let mut request =
        Request::post(path).header("content-type", "application/json").header("content-length", (1 << 20).to_string());
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    let mut request = request.body(body).unwrap();
    request.extensions_mut().insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

async fn answer(h: &Harness, request: Request<Body>) -> Response {
    tokio::time::timeout(STUCK, h.app.clone().oneshot(request))
        .await
        .expect("answered without waiting for the body")
        .unwrap()
}

async fn error_json(response: Response) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn refused_requests_are_answered_unread_with_connection_close() {
    let h = harness(RouterOptions::default()).await;
    let cases = [
        ("/v1/chat/completions", None, "invalid_api_key"),
        ("/v1/chat/completions", Some("Bearer sk-gantry-not-a-real-key-0123456789"), "invalid_api_key"),
        ("/admin/v1/keys", Some(KEY), "invalid_admin_token"),
        ("/v1/no-such-route", None, "unknown_url"),
    ];
    for (path, authorization, code) in cases {
        let authorization =
            authorization.map(|a| if a.starts_with("Bearer ") { a.to_string() } else { format!("Bearer {a}") });
        let (stream, polled) = endless_body(b"{\"model\":");
        let response = answer(&h, post(path, authorization.as_deref(), stream, "10.1.1.1:5000")).await;
        assert!(response.status().is_client_error(), "{path}: {}", response.status());
        assert_eq!(response.headers()["connection"], "close", "{path}");
        assert!(!polled.load(Ordering::SeqCst), "{path}: the body was read before authentication");
        assert_eq!(error_json(response).await["error"]["code"], code, "{path}");
    }
}

#[tokio::test]
async fn a_small_refused_body_is_drained_so_the_connection_is_kept() {
    let h = harness(RouterOptions::default()).await;
    let json = body(json!({})).to_string();
    let request = Request::post("/v1/chat/completions")
        .header("authorization", "Bearer sk-gantry-not-a-real-key-0123456789")
        .header("content-type", "application/json")
        .header("content-length", json.len().to_string())
        .body(Body::from(json))
        .unwrap();
    let response = answer(&h, request).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(response.headers().get("connection").is_none(), "{:?}", response.headers());
}

#[tokio::test]
async fn an_accepted_request_reads_its_body_and_keeps_the_connection() {
    let h = harness(RouterOptions::default()).await;
    let json = body(json!({})).to_string();
    let request = Request::post("/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .header("content-length", json.len().to_string())
        .body(Body::from(json))
        .unwrap();
    let response = h.app.clone().oneshot(request).await.unwrap();
    let headers = response.headers().clone();
    let status = response.status();
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::OK, "{text:?}");
    assert!(headers.get("connection").is_none(), "{headers:?}");
}

/// axum answers a body over the limit in plain text, which is rewritten into OpenAI's shape; the
/// rewrite must keep `Connection: close`, or the client reuses a connection the server closes.
#[tokio::test]
async fn a_body_over_the_limit_gets_json_413_and_the_connection_closed() {
    let options = RouterOptions { body_limit: 64 * 1024, ..RouterOptions::default() };
    let h = harness(options).await;
    let chunk = Bytes::from(vec![b' '; 16 * 1024]);
    let chunks = (0..8).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
    let stream = Body::from_stream(futures_util::StreamExt::chain(
        futures_util::stream::iter(chunks),
        futures_util::stream::pending(),
    ));
    let mut request = post("/v1/chat/completions", Some(&format!("Bearer {KEY}")), stream, "10.1.1.3:5000");
    request.headers_mut().insert("content-length", (1u64 << 20).into());
    let response = answer(&h, request).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()["connection"], "close", "{:?}", response.headers());
    assert_eq!(response.headers()["content-type"], "application/json");
    let error = error_json(response).await;
    assert_eq!(error["error"]["code"], "request_too_large", "{error}");
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closed() {
    let options = RouterOptions { body_read_timeout: Duration::from_millis(300), ..RouterOptions::default() };
    let h = harness(options).await;
    for (path, authorization) in [
        ("/v1/chat/completions", format!("Bearer {KEY}")),
        ("/admin/v1/keys", "Bearer admin-token-for-connection-tests".to_string()),
    ] {
        let (stream, polled) = endless_body(b"{\"name\":");
        let response = answer(&h, post(path, Some(&authorization), stream, "10.1.1.2:5000")).await;
        assert!(polled.load(Ordering::SeqCst), "{path}: an authenticated body is read");
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT, "{path}");
        assert_eq!(response.headers()["connection"], "close", "{path}");
        let error = error_json(response).await;
        assert_eq!(error["error"]["code"], "request_timeout", "{path}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{path}: {error}");
    }
}

fn fake_key_request(i: usize, peer: &str) -> Request<Body> {
    let mut request = Request::get("/v1/models")
        .header("authorization", format!("Bearer sk-gantry-fake-{i:040}"))
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

#[tokio::test]
async fn a_spray_of_fake_keys_costs_a_bounded_number_of_lookups() {
    let options = RouterOptions { auth_failures_per_minute: 5, ..RouterOptions::default() };
    let h = harness(options).await;
    let before = h.accounts.key_lookups();
    let mut statuses = Vec::new();
    for i in 0..200 {
        let response = h.app.clone().oneshot(fake_key_request(i, "203.0.113.7:40000")).await.unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(response.headers().contains_key("retry-after"));
            let error = error_json(response).await;
            assert_eq!(error["error"]["code"], "rate_limit_exceeded", "{error}");
        }
    }
    assert_eq!(h.accounts.key_lookups() - before, 5, "{statuses:?}");
    assert!(statuses[..5].iter().all(|&s| s == 401) && statuses[5..].iter().all(|&s| s == 429), "{statuses:?}");
    // Another address has a budget of its own.
    let other = h.app.clone().oneshot(fake_key_request(1000, "198.51.100.9:1")).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNAUTHORIZED);
    // A real key from yet another address is served.
    let mut real =
        Request::get("/v1/models").header("authorization", format!("Bearer {KEY}")).body(Body::empty()).unwrap();
    real.extensions_mut().insert(ConnectInfo("192.0.2.1:2".parse::<SocketAddr>().unwrap()));
    assert_eq!(h.app.clone().oneshot(real).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn an_image_bomb_is_refused_by_its_header_naming_its_part() {
    let events = vec![delta("hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    let engine = Arc::new(ScriptedEngine::new(events, usage(1)).seeing());
    let h = harness_with_options(engine, None, RouterOptions::default(), crate::router::Routes::All).await;
    let png = crate::openai::images::blank_png(16_384);
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&png));
    let (status, text) = h
        .chat(body(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["param"], "messages[0].content[1].image_url", "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("16384x16384"), "{error}");
}

fn get_from(path: &str, bearer: Option<&str>, peer: &str) -> Request<Body> {
    let mut request = Request::get(path);
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let mut request = request.body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

const ADMIN: &str = "admin-token-for-connection-tests";

#[tokio::test]
async fn metrics_on_the_one_listener_take_the_admin_token_unless_public() {
    let h = harness(RouterOptions::default()).await;
    let (status, text) = h.send(get_from("/metrics", None, "192.0.2.5:1")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "invalid_admin_token");
    assert_eq!(h.send(get_from("/metrics", Some(KEY), "192.0.2.5:1")).await.0, StatusCode::UNAUTHORIZED);
    let (status, text) = h.send(get_from("/metrics", Some(ADMIN), "192.0.2.5:1")).await;
    assert_eq!(status, StatusCode::OK, "{text}");

    // Without an admin token configured nobody may read them there.
    let events = vec![delta("hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    let engine = Arc::new(ScriptedEngine::new(events, usage(1)));
    let h = harness_with_options(engine, None, RouterOptions::default(), crate::router::Routes::All).await;
    assert_eq!(h.send(get_from("/metrics", None, "192.0.2.5:1")).await.0, StatusCode::FORBIDDEN);

    // --public-metrics: open on every listener, the public one with --admin-listen included.
    for which in [crate::router::Routes::All, crate::router::Routes::Public] {
        let events =
            vec![delta("hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
        let engine = Arc::new(ScriptedEngine::new(events, usage(1)));
        let options = RouterOptions { public_metrics: true, ..RouterOptions::default() };
        let h = harness_with_options(engine, Some(ADMIN), options, which).await;
        assert_eq!(h.send(get_from("/metrics", None, "192.0.2.5:1")).await.0, StatusCode::OK, "{which:?}");
    }
}

#[tokio::test]
async fn readiness_reads_the_database_state_at_most_once_a_second() {
    let h = harness(RouterOptions::default()).await;
    assert_eq!(h.send(get_from("/health/ready", None, "192.0.2.6:1")).await.0, StatusCode::OK);
    // The database goes away: probes within the second are answered from the cached state, with
    // no round trip (which would now fail), and the next one after it asks again.
    h.accounts.close().await;
    for _ in 0..20 {
        assert_eq!(h.send(get_from("/health/ready", None, "192.0.2.6:1")).await.0, StatusCode::OK);
    }
    tokio::time::sleep(crate::health::DATABASE_STATE_TTL + Duration::from_millis(100)).await;
    let (status, text) = h.send(get_from("/health/ready", None, "192.0.2.6:1")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
}
