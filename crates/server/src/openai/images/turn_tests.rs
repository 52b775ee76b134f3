//! A request's images are decoded in a preparation turn of its key (`PrepareGate`), as its
//! prompt is prepared: a key's flood of large images waits for its own turns. Test-only.

use std::sync::{Arc, Mutex, OnceLock};

use axum::http::StatusCode;
use base64::Engine as _;
use gantry_engine::{Event, FinishReason};
use serde_json::json;

use crate::openai::prepare_gate::PrepareGate;
use crate::router_tests::{body, delta, harness, usage, ScriptedEngine, KEY};

#[tokio::test]
async fn images_are_decoded_in_a_turn_of_the_keys_preparation() {
    let events = vec![delta("hi"), Event::Finished { choice: 0, reason: FinishReason::Stop }, Event::Done(usage(1))];
    // What the gate had left for the key while the engine decoded (the key's id, once known).
    let gate: Arc<OnceLock<(PrepareGate, i64)>> = Arc::default();
    let left: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (seen_gate, seen_left) = (gate.clone(), left.clone());
    let engine = ScriptedEngine::new(events, usage(1)).seeing().attaching(move || {
        let (gate, key_id) = seen_gate.get().expect("the gate is known before any request");
        seen_left.lock().unwrap().push(gate.available_for(*key_id));
    });
    let h = harness(Arc::new(engine)).await;
    let key = h.accounts.authenticate(KEY).await.unwrap().expect("the harness's key");
    let per_key = h.prepare_gate.available_for(key.id);
    assert!(gate.set((h.prepare_gate.clone(), key.id)).is_ok());
    let png = crate::openai::images::blank_png(8);
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&png));
    let (status, text) = h
        .chat(body(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]})))
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(*left.lock().unwrap(), [per_key - 1], "one of the key's turns is held while its images decode");
    assert_eq!(h.prepare_gate.available_for(key.id), per_key, "and given back");
}
