//! The HTTP contract, against the real binary and a tiny random-weight model.

mod common;

use common::{sse_data, TestServer, KEY};
use serde_json::{json, Value};

fn hello(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0})
}

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    assert!(resp.headers().get("x-request-id").is_some(), "every response carries x-request-id");
    let ct = resp.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    assert!(ct.starts_with("application/json"), "error content-type {ct}");
    let body: Value = resp.json().await.unwrap();
    for k in ["message", "type", "param", "code"] {
        assert!(body["error"].get(k).is_some(), "error body lacks {k}: {body}");
    }
    (status, body)
}

#[tokio::test]
async fn completion_usage_and_length_are_exact() {
    let s = TestServer::start(&[]);
    let resp = s.chat(hello(&s.model_id)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], s.model_id.as_str());
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    let reason = v["choices"][0]["finish_reason"].as_str().unwrap();
    if reason == "length" {
        assert_eq!(u["completion_tokens"], 8);
    } else {
        assert!(u["completion_tokens"].as_u64().unwrap() <= 8);
    }
    // The prompt is the template rendering: far more tokens than the two words typed.
    assert!(u["prompt_tokens"].as_u64().unwrap() > 4);
}

#[tokio::test]
async fn greedy_is_deterministic_and_streaming_matches() {
    let s = TestServer::start(&[]);
    let body = hello(&s.model_id);
    let a: Value = s.chat(body.clone()).send().await.unwrap().json().await.unwrap();
    let b: Value = s.chat(body.clone()).send().await.unwrap().json().await.unwrap();
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    // The repeat reuses the whole prompt from the prefix cache except the last token, whose
    // logits start the completion; the answer is unchanged.
    let prompt_tokens = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let resp = s.chat(streamed).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = sse_data(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let id = chunks[0]["id"].clone();
    assert!(chunks.iter().all(|c| c["id"] == id));
    let content: String =
        chunks.iter().filter_map(|c| c["choices"].get(0).and_then(|ch| ch["delta"]["content"].as_str())).collect();
    assert_eq!(content, a["choices"][0]["message"]["content"].as_str().unwrap());
    let finishes =
        chunks.iter().filter(|c| c["choices"].get(0).is_some_and(|ch| !ch["finish_reason"].is_null())).count();
    assert_eq!(finishes, 1);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"], b["usage"]);
}

#[tokio::test]
async fn a_burst_sharing_a_system_prompt_computes_it_once() {
    let s = TestServer::start(&["--parallel", "4"]);
    let system = "You are a careful assistant. ".repeat(12);
    let body = |q: &str| {
        json!({"model": s.model_id, "max_tokens": 4, "temperature": 0,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]})
    };
    let questions = ["alpha", "bravo", "charlie", "delta"];
    let results = futures_util::future::join_all(questions.iter().map(|q| s.chat(body(q)).send())).await;
    let mut cached = Vec::new();
    let mut burst_answers = Vec::new();
    for r in results {
        let v: Value = r.unwrap().json().await.unwrap();
        cached.push(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
        burst_answers.push(v["choices"][0]["message"]["content"].clone());
    }
    cached.sort();
    assert_eq!(cached[0], 0, "the first request computes the prefix: {cached:?}");
    assert!(cached[1..].iter().all(|&c| c >= 60), "the others reuse the system prompt: {cached:?}");
    // Answers do not depend on where the prefix came from.
    for (q, want) in questions.iter().zip(&burst_answers) {
        let v: Value = s.chat(body(q)).send().await.unwrap().json().await.unwrap();
        assert_eq!(&v["choices"][0]["message"]["content"], want, "{q}");
    }
}

#[tokio::test]
async fn concurrent_requests_match_their_solo_answers() {
    let s = TestServer::start(&[]);
    let prompts: Vec<String> = (0..8).map(|i| format!("Question number {i}: {}", "why ".repeat(i * 3))).collect();
    let body = |p: &str, max: u32| json!({"model": s.model_id, "messages": [{"role": "user", "content": p}], "max_tokens": max, "temperature": 0});
    let mut solo = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let v: Value = s.chat(body(p, 6 + i as u32 * 3)).send().await.unwrap().json().await.unwrap();
        solo.push(v["choices"][0]["message"]["content"].as_str().unwrap().to_string());
    }
    let futures = prompts.iter().enumerate().map(|(i, p)| s.chat(body(p, 6 + i as u32 * 3)).send());
    let results = futures_util::future::join_all(futures).await;
    for (i, r) in results.into_iter().enumerate() {
        let v: Value = r.unwrap().json().await.unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"].as_str().unwrap(),
            solo[i],
            "prompt {i} differs under batching"
        );
    }
}

#[tokio::test]
async fn n_choices_and_logprobs() {
    let s = TestServer::start(&[]);
    let mut body = hello(&s.model_id);
    body["n"] = json!(3);
    body["temperature"] = json!(1.0);
    body["seed"] = json!(7);
    body["max_tokens"] = json!(5);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v: Value = s.chat(body.clone()).send().await.unwrap().json().await.unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut total = 0;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let lp = c["logprobs"]["content"].as_array().unwrap();
        for t in lp {
            assert!(t["logprob"].as_f64().unwrap() <= 0.0);
            let top = t["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 2);
            assert!(top[0]["logprob"].as_f64().unwrap() >= top[1]["logprob"].as_f64().unwrap());
        }
        total += lp.len();
    }
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap() as usize, total);
    // Same seed, same request: same output.
    let again: Value = s.chat(body).send().await.unwrap().json().await.unwrap();
    assert_eq!(again["choices"], v["choices"]);
}

#[tokio::test]
async fn errors_are_openai_shaped() {
    let s = TestServer::start(&[]);
    let c = s.client();
    // Auth comes before validation.
    let (st, body) = error_of(c.post(s.url("/v1/chat/completions")).body("{not json").send().await.unwrap()).await;
    assert_eq!(st, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let (st, body) = error_of(
        c.post(s.url("/v1/chat/completions"))
            .bearer_auth("sk-gantry-wrong-key-000000000000000000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st, 401);
    assert!(!body["error"]["message"].as_str().unwrap().contains("wrong-key-000000000000000000"));

    let post = |b: &str, ct: &str| {
        c.post(s.url("/v1/chat/completions")).bearer_auth(KEY).header("content-type", ct).body(b.to_string()).send()
    };
    let (st, _) = error_of(post("{not json", "application/json").await.unwrap()).await;
    assert_eq!(st, 400);
    let (st, _) = error_of(post(&hello(&s.model_id).to_string(), "text/plain").await.unwrap()).await;
    assert_eq!(st, 400);

    let mut bad = hello(&s.model_id);
    bad["temperature"] = json!(3);
    let (st, body) = error_of(s.chat(bad).send().await.unwrap()).await;
    assert_eq!((st, body["error"]["param"].as_str()), (400, Some("temperature")));

    let mut unknown = hello(&s.model_id);
    unknown["model"] = json!("gpt-17");
    let (st, body) = error_of(s.chat(unknown).send().await.unwrap()).await;
    assert_eq!((st, body["error"]["code"].as_str()), (404, Some("model_not_found")));

    let mut long = hello(&s.model_id);
    long["messages"][0]["content"] = json!("hello ".repeat(600));
    let (st, body) = error_of(s.chat(long).send().await.unwrap()).await;
    assert_eq!((st, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")));
    assert!(body["error"]["message"].as_str().unwrap().contains("512"));

    let mut too_many = hello(&s.model_id);
    too_many["max_tokens"] = json!(100_000);
    let (st, body) = error_of(s.chat(too_many).send().await.unwrap()).await;
    assert_eq!((st, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")));

    let huge = json!({"model": s.model_id, "messages": [{"role": "user", "content": "x".repeat(5 * 1024 * 1024)}]});
    let (st, _) = error_of(s.chat(huge).send().await.unwrap()).await;
    assert_eq!(st, 413);

    let (st, _) = error_of(c.get(s.url("/v1/nope")).bearer_auth(KEY).send().await.unwrap()).await;
    assert_eq!(st, 404);
    let (st, _) = error_of(c.delete(s.url("/v1/chat/completions")).bearer_auth(KEY).send().await.unwrap()).await;
    assert_eq!(st, 405);

    // A validation error on a streaming request is a plain HTTP error, not an SSE stream.
    let mut streamed_bad = hello(&s.model_id);
    streamed_bad["stream"] = json!(true);
    streamed_bad["n"] = json!(0);
    let (st, body) = error_of(s.chat(streamed_bad).send().await.unwrap()).await;
    assert_eq!((st, body["error"]["param"].as_str()), (400, Some("n")));
}

#[tokio::test]
async fn models_and_health() {
    let s = TestServer::start(&[]);
    let c = s.client();
    let health = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let list: Value = c.get(s.url("/v1/models")).bearer_auth(KEY).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"][0]["id"], s.model_id.as_str());
    assert_eq!(list["data"][0]["object"], "model");
    let one: Value = c
        .get(s.url(&format!("/v1/models/{}", s.model_id)))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["id"], s.model_id.as_str());
    let missing = c.get(s.url("/v1/models/nope")).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(c.get(s.url("/v1/models")).send().await.unwrap().status(), 401);
}

#[tokio::test]
async fn stop_strings_cut_the_output() {
    let s = TestServer::start(&[]);
    // Random weights may end a greedy reply early; some prompt among a few gives enough text to
    // cut in the middle, and the test fails if none does.
    let mut found = None;
    for prompt in ["Hello there", "Tell me a story", "abc def ghi", "1 2 3 4 5", "Why is the sky blue?"] {
        let mut body = hello(&s.model_id);
        body["messages"][0]["content"] = json!(prompt);
        body["max_tokens"] = json!(24);
        let v: Value = s.chat(body.clone()).send().await.unwrap().json().await.unwrap();
        let full = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        if full.chars().count() >= 6 {
            found = Some((body, full));
            break;
        }
    }
    let (mut body, full) = found.expect("no prompt gave a greedy reply of 6 or more characters");
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    body["stop"] = json!([stop]);
    let v: Value = s.chat(body.clone()).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let text = s.chat(body).send().await.unwrap().text().await.unwrap();
    let streamed: String = sse_data(&text)
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, cut);
}

/// A text model refuses every image before fetching it (not even a URL that would be refused as
/// private is looked at; a data URL that is no image at all is already refused by the request's
/// validation). How images are checked for a model that reads them: tests/vision.rs.
#[tokio::test]
async fn a_text_model_refuses_images_before_fetching_them() {
    let s = TestServer::start(&[]);
    let image = |url: &str| {
        json!({"model": s.model_id, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]})
    };
    let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
    for url in ["http://127.0.0.1:1/cat.png", "http://169.254.169.254/latest/meta-data", png] {
        let (status, body) = error_of(s.chat(image(url)).send().await.unwrap()).await;
        assert_eq!((status, body["error"]["param"].as_str()), (400, Some("messages")), "{url}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("does not support image"), "{body}");
    }
}

#[tokio::test]
async fn response_format_constrains_even_a_random_model() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
                        "required": ["name", "age"], "additionalProperties": false});
    for (format, n) in [
        (json!({"type": "json_object"}), 1),
        (json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema}}), 3),
    ] {
        let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "a person"}], "max_tokens": 1500,
                          "temperature": 1.0, "n": n, "response_format": format});
        let v: Value = s.chat(body).send().await.unwrap().json().await.unwrap();
        for choice in v["choices"].as_array().unwrap() {
            let content = choice["message"]["content"].as_str().unwrap();
            if choice["finish_reason"] == "stop" {
                let doc: Value = match serde_json::from_str(content) {
                    Ok(doc) => doc,
                    // A random model may write a valid number like 7e604117 that serde cannot hold
                    // in an f64; the document is still well-formed JSON.
                    Err(e) if n == 1 && e.to_string().contains("number out of range") => json!({}),
                    Err(e) => panic!("{e}: {content}"),
                };
                assert!(doc.is_object() && content.starts_with('{') && content.ends_with('}'), "{content}");
                if n == 3 {
                    assert!(
                        doc["name"].is_string() && (0..=150).contains(&doc["age"].as_i64().unwrap_or(-1)),
                        "{content}"
                    );
                    assert_eq!(doc.as_object().unwrap().len(), 2, "{content}");
                }
            } else {
                assert_eq!(choice["finish_reason"], "length");
                assert!(content.starts_with('{'), "{content}");
            }
        }
    }
    let bad = json!({"model": s.model_id, "messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "objec"}}}});
    let (status, body) = error_of(s.chat(bad).send().await.unwrap()).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "response_format");
}

#[tokio::test]
async fn tools_reach_a_model_whose_template_lacks_them_and_forced_calls_parse() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let tools = json!([{"type": "function", "function": {"name": "lookup", "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}, "required": ["word"]}}}]);
    let plain: Value = s.chat(hello(&s.model_id)).send().await.unwrap().json().await.unwrap();
    let mut body = hello(&s.model_id);
    body["tools"] = tools.clone();
    body["tool_choice"] = json!("required");
    // The grammar bounds the call (a word of at most 8 characters) well inside 200 tokens.
    body["max_tokens"] = json!(200);
    let resp = s.chat(body).send().await.unwrap();
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    // The tiny model's ChatML template ignores `tools`; the generic tool prompt shows them anyway.
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() > plain["usage"]["prompt_tokens"].as_u64().unwrap() + 10,
        "tools were not rendered: {v}"
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["word"].as_str().is_some_and(|w| w.chars().count() <= 8), "{args}");
    assert!(choice["message"]["content"].is_null());
}

#[tokio::test]
async fn a_refused_request_is_answered_unread_with_connection_close_and_the_next_connection_works() {
    use std::io::{Read, Write};
    let s = TestServer::start(&[]);
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    // A 401 decided from the headers alone, with a body too large to be drained: the server
    // answers without reading it and says it closes, so a pooling client opens a new one.
    let body = format!("{{\"model\": \"x\", \"messages\": [], \"pad\": \"{}\"}}", "a".repeat(200_000));
    let first = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // The server may close before all of the body is written.
    let _ = conn.write_all(first.as_bytes());
    let read_response = |conn: &mut std::net::TcpStream| {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk).unwrap_or(0);
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if rest.len() >= len {
                    break;
                }
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    };
    let r1 = read_response(&mut conn);
    assert!(r1.starts_with("HTTP/1.1 401"), "{r1}");
    assert!(r1.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{r1}");
    let mut next = std::net::TcpStream::connect(&addr).unwrap();
    next.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    next.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).unwrap();
    let r2 = read_response(&mut next);
    assert!(r2.starts_with("HTTP/1.1 200"), "{r2:?}");
}

/// More choices than sequences would wait forever; the engine refuses them up front with a 400
/// (a 500 made the SDKs retry it twice), streamed or not, and `stream_options` without a stream
/// is refused as OpenAI does.
#[tokio::test]
async fn n_beyond_parallel_and_stream_options_without_stream_are_400s() {
    let s = TestServer::start(&["--parallel", "2"]);
    for stream in [false, true] {
        let mut body = hello(&s.model_id);
        body["n"] = json!(3);
        body["stream"] = json!(stream);
        let (status, err) = error_of(s.chat(body).send().await.unwrap()).await;
        assert_eq!(status, 400, "stream={stream}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert_eq!(err["error"]["param"], "n");
    }
    let mut body = hello(&s.model_id);
    body["n"] = json!(2);
    let ok: Value = s.chat(body).send().await.unwrap().json().await.unwrap();
    assert_eq!(ok["choices"].as_array().unwrap().len(), 2);

    let mut body = hello(&s.model_id);
    body["stream_options"] = json!({"include_usage": true});
    let (status, err) = error_of(s.chat(body).send().await.unwrap()).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["param"], "stream_options");
}
