//! Router tests of `POST /v1/files` past `--max-file-bytes`: a file read whole and found too
//! large, and an upload cut off at the route's body limit, both answer OpenAI's 413 naming the
//! limit.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::Value;

use crate::router::{RouterOptions, Routes};
use crate::router_tests::{harness_tweaked, usage, Harness, ScriptedEngine, KEY};

const MAX_FILE_BYTES: u64 = 1000;
const BOUNDARY: &str = "gantry-test-boundary";

async fn upload(h: &Harness, file_bytes: usize) -> (StatusCode, Value) {
    let line = "x".repeat(file_bytes);
    let form = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{line}\r\n--{BOUNDARY}--\r\n"
    );
    let request = Request::post("/v1/files")
        .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
        .header(header::CONTENT_TYPE, format!("multipart/form-data; boundary={BOUNDARY}"))
        .body(Body::from(form))
        .unwrap();
    let (status, text) = h.send(request).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

#[tokio::test]
async fn a_file_over_the_limit_is_a_413_naming_the_limit() {
    let engine = Arc::new(ScriptedEngine::new(Vec::new(), usage(1)));
    let h = harness_tweaked(engine, None, RouterOptions::default(), Routes::All, |state| {
        state.batches.max_file_bytes = MAX_FILE_BYTES;
    })
    .await;
    let (status, v) = upload(&h, MAX_FILE_BYTES as usize).await;
    assert_eq!(status, StatusCode::OK, "at the limit it is stored: {v}");
    assert_eq!(v["bytes"], MAX_FILE_BYTES);

    // Read whole, then found one byte too large; and cut off past the body limit (the file's
    // limit plus 64 KiB for the form), mid-read.
    for (size, said) in [(MAX_FILE_BYTES as usize + 1, "The file is 1001 bytes"), (10 * 1024 * 1024, "too large")] {
        let (status, v) = upload(&h, size).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{size} bytes: {v}");
        let error = &v["error"];
        assert_eq!(
            (&error["type"], &error["code"], &error["param"]),
            (&"invalid_request_error".into(), &"request_too_large".into(), &"file".into()),
            "{v}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(said) && message.contains("at most 1000 bytes"), "{size} bytes: {message}");
    }
}
