//! `/admin/v1/models/{name}/load` and `/unload` name a model as requests do: by its id or an
//! alias; an unknown name is a 404 in the API's error shape. Test-only.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use gantry_engine::{Event, FinishReason};
use serde_json::Value;

use crate::router_tests::{delta, harness_with_admin, usage, Harness, ScriptedEngine, ALIAS};

const ADMIN: &str = "models-test-admin-5c1e9a7d3b6f2048";

async fn post(h: &Harness, path: &str) -> (StatusCode, Value) {
    let request = Request::post(path).header(header::AUTHORIZATION, format!("Bearer {ADMIN}")).body(Body::empty());
    let (status, text) = h.send(request.unwrap()).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

#[tokio::test]
async fn load_and_unload_take_an_alias_as_requests_do() {
    let events = vec![delta("Hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    let h = harness_with_admin(Arc::new(ScriptedEngine::new(events, usage(1))), Some(ADMIN)).await;
    let (status, model) = post(&h, &format!("/admin/v1/models/{ALIAS}/load")).await;
    assert_eq!(status, StatusCode::OK, "{model}");
    assert_eq!((model["id"].as_str(), model["state"].as_str()), (Some("scripted"), Some("loaded")), "{model}");
    let (status, model) = post(&h, &format!("/admin/v1/models/{ALIAS}/unload")).await;
    assert_eq!(status, StatusCode::OK, "{model}");
    assert_eq!((model["id"].as_str(), model["state"].as_str()), (Some("scripted"), Some("unloaded")), "{model}");
    // The id itself still works.
    let (status, model) = post(&h, "/admin/v1/models/scripted/load").await;
    assert_eq!((status, model["state"].as_str()), (StatusCode::OK, Some("loaded")), "{model}");
}

#[tokio::test]
async fn an_unknown_model_is_a_404_naming_it() {
    let h = harness_with_admin(Arc::new(ScriptedEngine::new(Vec::new(), usage(0))), Some(ADMIN)).await;
    for action in ["load", "unload"] {
        let (status, error) = post(&h, &format!("/admin/v1/models/no-such-model/{action}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{action}: {error}");
        assert_eq!(error["error"]["code"], "model_not_found", "{action}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{action}: {error}");
        assert!(error["error"]["message"].as_str().unwrap().contains("no-such-model"), "{action}: {error}");
    }
}
