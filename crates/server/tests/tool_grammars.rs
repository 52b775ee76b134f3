//! Tools and structured output against the real binary and a tiny random-weight model: what the
//! grammars allow, what stop strings and max_tokens do to constrained output, and how calls are
//! read back. A random model writes whatever a grammar lets it, so these find what it lets through.

mod common;

use common::{sse_data, TestServer};
use serde_json::{json, Value};

fn lookup_tool(parameters: Value) -> Value {
    json!([{"type": "function", "function": {"name": "lookup", "description": "Look a word up", "parameters": parameters}}])
}

fn word_schema() -> Value {
    json!({"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}, "required": ["word"], "additionalProperties": false})
}

/// `bias` plus a ban on tab, line feed and space (byte-level token ids 9, 10, 32): JSON grammars
/// allow layout whitespace between tokens, and a random model at temperature 0 fills every gap
/// with as much as allowed, so tests that count tokens into a document ask for it compact.
fn no_layout(mut bias: Value) -> Value {
    for id in ["9", "10", "32"] {
        bias[id] = json!(-100);
    }
    bias
}

async fn post(s: &TestServer, body: Value) -> Value {
    let resp = s.chat(body).send().await.unwrap();
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    v
}

/// Streams `body` and returns (content, tool calls as (name, accumulated arguments), finish reasons).
async fn stream(s: &TestServer, mut body: Value) -> (String, Vec<(String, String)>, Vec<String>) {
    body["stream"] = json!(true);
    let text = s.chat(body).send().await.unwrap().text().await.unwrap();
    let (mut content, mut calls, mut reasons) = (String::new(), Vec::<(String, String)>::new(), Vec::new());
    for data in sse_data(&text) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        for choice in v["choices"].as_array().unwrap() {
            content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let i = call["index"].as_u64().unwrap() as usize;
                if calls.len() <= i {
                    calls.resize(i + 1, (String::new(), String::new()));
                }
                calls[i].0.push_str(call["function"]["name"].as_str().unwrap_or(""));
                calls[i].1.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                reasons.push(r.to_string());
            }
        }
    }
    (content, calls, reasons)
}

#[tokio::test]
async fn json_that_is_not_a_committed_call_is_not_coerced_into_one() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    // The tiny vocabulary is byte-level: token 123 is `{`. Biasing it makes the random model open
    // bare JSON and keep writing `{`. That never becomes `{"name": "lookup", "arguments": {`, so it
    // is an answer (here: junk) and must stay content, not be forced into a call.
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "Look up a word"}],
        "tools": lookup_tool(word_schema()), "tool_choice": "auto", "logit_bias": {"123": 100}, "max_tokens": 20, "temperature": 0});
    let v = post(&s, body).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    assert!(choice["message"]["tool_calls"].is_null(), "{v}");
    assert!(choice["message"]["content"].as_str().unwrap().starts_with("{{"), "{v}");
}

#[tokio::test]
async fn auto_tools_with_a_response_format_answer_in_the_format() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let answer = json!({"type": "object", "properties": {"word_count": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["word_count"], "additionalProperties": false});
    // Token 119 is `w`: biased, the model takes the answer's key, not the call's `"name"`. Before,
    // the answer's opening `{` switched to the call grammar and every answer became a call.
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "Count the words"}],
        "tools": lookup_tool(word_schema()), "tool_choice": "auto", "logit_bias": no_layout(json!({"119": 100})), "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "count", "schema": answer}}});
    let v = post(&s, body).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{v}");
    assert!(choice["message"]["tool_calls"].is_null(), "{v}");
    let doc: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
    assert!(doc["word_count"].as_i64().is_some_and(|n| (0..=99).contains(&n)), "{doc}");
    assert_eq!(doc.as_object().unwrap().len(), 1, "{doc}");
}

#[tokio::test]
async fn a_call_cut_by_max_tokens_comes_back_as_a_partial_call() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    // A forced call is `{"name":"lookup","arguments":{"word":"…"}}`: 33 byte-level tokens reach
    // into the arguments but never past their end.
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "Look up a word"}],
        "tools": lookup_tool(word_schema()), "tool_choice": "required", "max_tokens": 33, "temperature": 0,
        "logit_bias": no_layout(json!({}))});
    let v = post(&s, body.clone()).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup", "{v}");
    let args = call["function"]["arguments"].as_str().unwrap();
    assert!(args.starts_with('{') && serde_json::from_str::<Value>(args).is_err(), "not a partial object: {args}");
    let (content, calls, reasons) = stream(&s, body).await;
    assert_eq!(content, "");
    assert_eq!(reasons, ["length"]);
    assert_eq!(calls, vec![("lookup".to_string(), args.to_string())]);
}

#[tokio::test]
async fn stop_strings_never_cut_constrained_json() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"], "additionalProperties": false});
    for format in
        [json!({"type": "json_object"}), json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})]
    {
        // Every object with a key has `"` and `:`; before, the first one ended the output there.
        let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "a person"}], "max_tokens": 400,
                          "temperature": 1.0, "seed": 3, "n": 3, "stop": ["\"", ":", "}"], "response_format": format});
        let v = post(&s, body).await;
        for choice in v["choices"].as_array().unwrap() {
            let content = choice["message"]["content"].as_str().unwrap();
            if choice["finish_reason"] == "stop" {
                let doc: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
                assert!(doc.is_object(), "{content}");
            } else {
                assert_eq!(choice["finish_reason"], "length", "{v}");
            }
        }
        let stopped = v["choices"].as_array().unwrap().iter().filter(|c| c["finish_reason"] == "stop").count();
        assert!(stopped >= 1, "no choice finished: {v}");
    }
}

#[tokio::test]
async fn tool_arguments_carry_only_declared_properties() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    // No `additionalProperties`: closed, as the client's function takes only `word`.
    let open = json!({"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}});
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "Look up a word"}],
        "tools": lookup_tool(open), "tool_choice": "required", "max_tokens": 300, "temperature": 1.0, "seed": 11, "n": 4});
    let v = post(&s, body).await;
    for choice in v["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        let args: Value =
            serde_json::from_str(choice["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap())
                .unwrap();
        assert!(args.as_object().unwrap().keys().all(|k| k == "word"), "undeclared key in {args}");
    }
}

#[tokio::test]
async fn a_forced_call_comes_back_as_a_call_whatever_the_model_writes_in_it() {
    let s = TestServer::start(&["--ctx-size", "2048", "--parallel", "4"]);
    // Every kind of value a schema can hold: a random model at a high temperature fills them with
    // whatever the grammar allows (escapes, unicode, exponents, deep nesting), and each answer must
    // still read back as the forced call, complete (`tool_calls`) or cut (`length`).
    let rich = json!({"type": "object", "properties": {
        "word": {"type": "string"}, "count": {"type": "integer"}, "score": {"type": "number"},
        "exact": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"enum": ["fast", "slow", "a \"quoted\" one"]},
        "meta": {"type": "object", "properties": {"note": {"type": ["string", "null"]}}}},
        "required": ["word", "count", "score", "exact", "tags", "mode", "meta"]});
    let tools = lookup_tool(rich);
    let named = json!({"type": "function", "function": {"name": "lookup"}});
    let mut seen = 0;
    for (seed, choice) in [(1, named.clone()), (2, json!("required")), (3, named.clone()), (4, json!("required"))] {
        let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "Look up a word"}],
            "tools": tools, "tool_choice": choice, "max_tokens": 160, "temperature": 1.6, "seed": seed, "n": 4});
        let v = post(&s, body.clone()).await;
        for c in v["choices"].as_array().unwrap() {
            let reason = c["finish_reason"].as_str().unwrap();
            assert!(reason == "tool_calls" || reason == "length", "{c}");
            let calls = c["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no call in {c}"));
            assert_eq!(calls.len(), 1, "{c}");
            assert_eq!(calls[0]["function"]["name"], "lookup", "{c}");
            if reason == "tool_calls" {
                let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
                    .unwrap_or_else(|e| panic!("{e}: {c}"));
                assert!(args.is_object(), "{c}");
            }
            seen += 1;
        }
        let (content, calls, reasons) = stream(&s, body).await;
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        // `stream` gathers calls by call index across choices: each of the 4 choices streamed
        // exactly one call (index 0) named `lookup`, and no text.
        assert_eq!(calls.len(), 1, "{calls:?} {content:?}");
        assert_eq!(calls[0].0, "lookup".repeat(4), "{calls:?}");
        assert_eq!(content, "", "{calls:?}");
    }
    assert_eq!(seen, 16);
}

/// Pydantic writes nested models and enums as `$ref`s into `$defs`; the grammars nest each tool's
/// schema inside call objects, so its definitions must follow it to the grammar's root. Every
/// tool_choice compiles, and a forced call keeps to the referenced enum and nested model.
#[tokio::test]
async fn argument_schemas_with_definitions_compile_and_constrain_the_call() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let parameters = json!({"type": "object", "required": ["color", "size"],
        "$defs": {"Color": {"type": "string", "enum": ["red", "green"]},
                  "Size": {"type": "object", "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "required": ["unit"]},
                  "Unit": {"enum": ["cm", "in"]}},
        "properties": {"color": {"$ref": "#/$defs/Color"}, "size": {"$ref": "#/$defs/Size"}}});
    let tools = json!([{"type": "function", "function": {"name": "paint", "parameters": parameters}},
                       {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object",
                        "definitions": {"W": {"type": "string", "maxLength": 4}}, "properties": {"w": {"$ref": "#/definitions/W"}}}}}]);
    let body = |choice: Value| {
        json!({"model": s.model_id, "messages": [{"role": "user", "content": "Paint it"}], "tools": tools,
               "tool_choice": choice, "max_tokens": 200, "temperature": 0, "logit_bias": no_layout(json!({}))})
    };
    for choice in [json!("auto"), json!("required"), json!({"type": "function", "function": {"name": "paint"}})] {
        let v = post(&s, body(choice.clone())).await;
        if choice != json!("auto") {
            let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
            let args: Value =
                serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {v}"));
            if call["name"] == "paint" {
                assert!(["red", "green"].contains(&args["color"].as_str().unwrap()), "{v}");
                assert!(["cm", "in"].contains(&args["size"]["unit"].as_str().unwrap()), "{v}");
            } else {
                assert_eq!(call["name"], "lookup", "{v}");
            }
        }
    }
    let mut with_format = body(json!("auto"));
    with_format["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "$defs": {"Color": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/Color"}}}}});
    post(&s, with_format).await;
    // A schema that does not compile is named in one line, not with the grammar it was put in.
    let broken = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "banana"}}}}}]);
    let resp = s
        .chat(json!({"model": s.model_id, "messages": [{"role": "user", "content": "x"}], "tools": broken}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!((status.as_u16(), v["error"]["param"].as_str()), (400, Some("tools")), "{v}");
    assert!(message.contains("banana") && message.len() < 120, "{message}");
}

/// Keywords a grammar cannot enforce (pydantic's `set[str]` is `uniqueItems`; MCP servers send
/// `not`, `if`/`then`, `contains`, `propertyNames`) are skipped in a schema sent without
/// `strict`, as OpenAI enforces none of such a schema; with `strict: true` they are refused.
#[tokio::test]
async fn keywords_no_grammar_enforces_are_skipped_unless_strict() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let parameters = json!({"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": true, "maxItems": 2,
                 "contains": {"const": "a"}},
        "mode": {"not": {"const": "x"}}, "extra": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}}});
    let tool = |strict: bool| json!([{"type": "function", "function": {"name": "tag", "parameters": parameters, "strict": strict}}]);
    let body = |tools: Value, choice: Value| {
        json!({"model": s.model_id, "messages": [{"role": "user", "content": "Tag it"}], "tools": tools,
               "tool_choice": choice, "max_tokens": 120, "temperature": 0, "logit_bias": no_layout(json!({}))})
    };
    for choice in [json!("auto"), json!("required")] {
        let v = post(&s, body(tool(false), choice.clone())).await;
        if choice == json!("required") {
            let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
            assert_eq!(call["name"], "tag", "{v}");
        }
    }
    let resp = s.chat(body(tool(true), json!("required"))).send().await.unwrap();
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert_eq!((status.as_u16(), v["error"]["param"].as_str()), (400, Some("tools")), "{v}");
    let format = |strict: bool| {
        json!({"model": s.model_id, "messages": [{"role": "user", "content": "Tags"}], "max_tokens": 60,
               "response_format": {"type": "json_schema", "json_schema": {"name": "t", "strict": strict, "schema": parameters}}})
    };
    post(&s, format(false)).await;
    assert_eq!(s.chat(format(true)).send().await.unwrap().status(), 400);
}

/// A function sent without `parameters` takes none, as OpenAI reads it: a forced call's
/// arguments are `{}`, never keys the model made up.
#[tokio::test]
async fn a_function_without_parameters_is_called_with_none() {
    let s = TestServer::start(&["--ctx-size", "2048"]);
    let tools = json!([{"type": "function", "function": {"name": "now", "description": "The time"}}]);
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "Time?"}], "tools": tools,
                      "tool_choice": "required", "max_tokens": 80, "temperature": 1.0, "seed": 5, "n": 3,
                      "logit_bias": no_layout(json!({}))});
    let v = post(&s, body).await;
    for choice in v["choices"].as_array().unwrap() {
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!((call["name"].as_str(), call["arguments"].as_str()), (Some("now"), Some("{}")), "{v}");
    }
}
