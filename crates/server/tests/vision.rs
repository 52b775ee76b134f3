//! Images through the real binary: the tiny model with the tiny projector (`--mmproj`), asked
//! with data URLs over HTTP.

mod common;

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::OnceLock;

use base64::Engine as _;
use common::{sse_data, TestServer};
use serde_json::{json, Value};

/// The tiny model and its projector, written once per test binary.
fn tiny_pair() -> &'static (PathBuf, PathBuf) {
    static PAIR: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PAIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-vision-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (model, mmproj) = (dir.join("model.gguf"), dir.join("mmproj.gguf"));
        tiny_gguf::write_tiny_model(&model, &tiny_gguf::TinyModelSpec::default()).unwrap();
        tiny_gguf::write_tiny_projector(&mmproj, &tiny_gguf::TinyProjectorSpec::default()).unwrap();
        (model, mmproj)
    })
}

fn vision_server() -> TestServer {
    let (model, mmproj) = tiny_pair();
    TestServer::start_with(model, true, &["--mmproj", mmproj.to_str().unwrap()])
}

fn png_data_url(seed: u8) -> String {
    let img =
        image::RgbImage::from_fn(40, 30, |x, y| image::Rgb([(x as u8).wrapping_mul(seed), (y as u8) ^ seed, seed]));
    let mut png = Vec::new();
    image::DynamicImage::ImageRgb8(img).write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png))
}

fn ask(model: &str, url: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": model, "temperature": 0, "max_tokens": 6,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

async fn completion(s: &TestServer, body: Value) -> Value {
    let resp = s.chat(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn an_image_is_answered_billed_by_its_positions_and_cached_by_content() {
    let s = vision_server();
    let image_tokens = u64::from(tiny_gguf::TinyProjectorSpec::default().image_tokens());
    let text = completion(
        &s,
        json!({"model": s.model_id, "temperature": 0, "max_tokens": 6,
        "messages": [{"role": "user", "content": "What is in this picture?"}]}),
    )
    .await;
    let first = completion(&s, ask(&s.model_id, &png_data_url(3), false)).await;
    assert!(first["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert_eq!(first["usage"]["prompt_tokens"], text["usage"]["prompt_tokens"].as_u64().unwrap() + image_tokens);

    // Streamed at temperature 0: the same answer and usage, and the whole prompt, image
    // included, from the cache.
    let resp = s.chat(ask(&s.model_id, &png_data_url(3), true)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut content = String::new();
    let mut usage = Value::Null;
    for data in sse_data(&resp.text().await.unwrap()) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(piece);
        }
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
    }
    assert_eq!(content, first["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(usage["prompt_tokens"], first["usage"]["prompt_tokens"]);
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), prompt - 1);

    // Another image in the same place: only the text before it comes from the cache.
    let other = completion(&s, ask(&s.model_id, &png_data_url(9), false)).await;
    assert_eq!(other["usage"]["prompt_tokens"].as_u64().unwrap(), prompt);
    let cached = other["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt - image_tokens, "{cached} of {prompt}");
}

#[tokio::test]
async fn bad_images_and_limits_are_400s_and_a_text_model_still_refuses() {
    let s = TestServer::start_with(
        &tiny_pair().0,
        true,
        &["--mmproj", tiny_pair().1.to_str().unwrap(), "--max-images", "1"],
    );
    // Never a fetch to the server's own network.
    for url in ["http://127.0.0.1:1/cat.png", "http://169.254.169.254/latest/meta-data", "http://localhost/x.png"] {
        let v: Value = s.chat(ask(&s.model_id, url, false)).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["error"]["param"], "messages[0].content[1].image_url", "{url}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("public"), "{v}");
    }
    let broken = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB";
    for (body, param) in [
        (ask(&s.model_id, broken, false), "messages[0].content[1].image_url"),
        (ask(&s.model_id, "data:image/png;base64,bm90IGFuIGltYWdl", false), "messages[0].content[1].image_url"),
    ] {
        let resp = s.chat(body).send().await.unwrap();
        assert_eq!(resp.status(), 400);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let mut two = ask(&s.model_id, &png_data_url(1), false);
    two["messages"][0]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "image_url", "image_url": {"url": png_data_url(2)}}));
    let resp = s.chat(two).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("at most 1"), "{v}");

    let text_only = TestServer::start(&[]);
    let resp = text_only.chat(ask(&text_only.model_id, &png_data_url(1), false)).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("does not support image inputs"), "{v}");
    // Refused before any fetch: a URL nothing could resolve gets the same answer.
    let remote = ask(&text_only.model_id, "http://images.invalid/cat.png", false);
    let v: Value = text_only.chat(remote).send().await.unwrap().json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("does not support image inputs"), "{v}");
}

#[test]
fn a_projector_that_does_not_fit_the_model_stops_the_server_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("mmproj-32.gguf");
    // Its output is 32 wide; the tiny model's embeddings are 64.
    tiny_gguf::write_tiny_projector(&wrong, &tiny_gguf::TinyProjectorSpec { text_n_embd: 32, ..Default::default() })
        .unwrap();
    for (projector, why) in
        [(wrong, "could not load the projector"), (dir.path().join("missing.gguf"), "does not exist")]
    {
        let out = common::gantry()
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "--api-key", common::KEY])
            .arg("--model")
            .arg(&tiny_pair().0)
            .arg("--mmproj")
            .arg(&projector)
            .arg("--data-dir")
            .arg(dir.path())
            .env_remove("GANTRY_API_KEY")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started with {}", projector.display());
        assert!(stderr.contains(why), "{stderr}");
    }
}
