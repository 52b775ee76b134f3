//! Chat Completions validation: defaults, accepted values, content parts, tools and schemas, and
//! every refusal (hostile sizes included) a 400 that names its `param`.

use serde_json::{json, Value};

use super::*;
use crate::fields::MAX_SCHEMA_BYTES;
use crate::image::tests::{data_url, PNG};
use crate::tools::{MAX_TOOLS, MAX_TOOLS_BYTES};
use crate::{ImageDetail, ImagePart, ImageRef, Role};

fn base() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

/// `base()` with `patch`'s keys set (merged at top level).
fn with(patch: Value) -> Vec<u8> {
    let mut b = base();
    for (k, v) in patch.as_object().unwrap() {
        b[k] = v.clone();
    }
    serde_json::to_vec(&b).unwrap()
}

fn ok(patch: Value) -> ValidatedChat {
    parse_chat_request(&with(patch.clone())).unwrap_or_else(|e| panic!("{patch}: {e:?}"))
}

fn msgs(m: Value) -> Vec<u8> {
    with(json!({ "messages": m }))
}

#[test]
fn rejection_table() {
    // (body, expected param, substring of message)
    let cases: Vec<(Vec<u8>, Option<&str>, &str)> = vec![
        (
            with(json!({"temperature": "1"})),
            Some("temperature"),
            "Invalid type for 'temperature': expected a number, but got a string instead.",
        ),
        (
            with(json!({"temperature": 3})),
            Some("temperature"),
            "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead.",
        ),
        (
            with(json!({"temperature": -0.5})),
            Some("temperature"),
            "below minimum value. Expected a value >= 0, but got -0.5",
        ),
        (with(json!({"top_p": true})), Some("top_p"), "expected a number, but got a boolean"),
        (with(json!({"top_p": 1.5})), Some("top_p"), "Expected a value <= 1, but got 1.5"),
        (with(json!({"presence_penalty": "x"})), Some("presence_penalty"), "expected a number"),
        (with(json!({"presence_penalty": 2.5})), Some("presence_penalty"), "<= 2"),
        (with(json!({"frequency_penalty": [1]})), Some("frequency_penalty"), "but got an array instead"),
        (with(json!({"frequency_penalty": -3})), Some("frequency_penalty"), ">= -2, but got -3"),
        (with(json!({"n": 0})), Some("n"), "integer below minimum value. Expected a value >= 1, but got 0 instead."),
        (with(json!({"n": 129})), Some("n"), "<= 128"),
        (with(json!({"n": 1.5})), Some("n"), "expected an integer, but got a decimal instead"),
        (with(json!({"max_tokens": 0})), Some("max_tokens"), ">= 1, but got 0"),
        (with(json!({"max_tokens": -1})), Some("max_tokens"), ">= 1, but got -1"),
        (with(json!({"max_tokens": "5"})), Some("max_tokens"), "expected an integer, but got a string"),
        (with(json!({"max_completion_tokens": 0})), Some("max_completion_tokens"), ">= 1"),
        (with(json!({"seed": 1.5})), Some("seed"), "expected an integer"),
        (with(json!({"seed": u64::MAX})), Some("seed"), "above maximum"),
        (with(json!({"logprobs": "yes"})), Some("logprobs"), "expected a boolean"),
        (with(json!({"stream": 1})), Some("stream"), "expected a boolean, but got an integer"),
        (with(json!({"stream_options": true})), Some("stream_options"), "expected an object"),
        (
            with(json!({"stream_options": {"include_usage": true}})),
            Some("stream_options"),
            "only allowed when 'stream' is enabled",
        ),
        (
            with(json!({"stream": false, "stream_options": {}})),
            Some("stream_options"),
            "only allowed when 'stream' is enabled",
        ),
        (with(json!({"top_logprobs": 3})), Some("top_logprobs"), "'logprobs' must be set to true"),
        (with(json!({"top_logprobs": 3, "logprobs": false})), Some("top_logprobs"), "'logprobs' must be set to true"),
        (with(json!({"top_logprobs": 21, "logprobs": true})), Some("top_logprobs"), "<= 20"),
        (with(json!({"stop": 5})), Some("stop"), "expected a string or array, but got an integer"),
        (
            with(json!({"stop": ["a", "b", "c", "d", "e"]})),
            Some("stop"),
            "maximum length 4, but got an array with length 5",
        ),
        (with(json!({"stop": ["a", 1]})), Some("stop[1]"), "expected a string"),
        (with(json!({"logit_bias": [1]})), Some("logit_bias"), "expected an object"),
        (with(json!({"logit_bias": {"abc": 1}})), Some("logit_bias"), "Invalid key in 'logit_bias': abc"),
        (with(json!({"logit_bias": {"-1": 1}})), Some("logit_bias"), "non-negative"),
        (with(json!({"logit_bias": {"5": 101}})), Some("logit_bias"), "between -100 and 100"),
        (with(json!({"logit_bias": {"5": "x"}})), Some("logit_bias.5"), "expected a number"),
        (with(json!({"user": 7})), Some("user"), "expected a string"),
        (with(json!({"parallel_tool_calls": "no"})), Some("parallel_tool_calls"), "expected a boolean"),
        (with(json!({"model": 5})), Some("model"), "expected a string"),
        (with(json!({"model": null})), None, "you must provide a model parameter"),
        (br#"{"messages":[{"role":"user","content":"x"}]}"#.to_vec(), None, "you must provide a model parameter"),
        (br#"{"model":"m"}"#.to_vec(), Some("messages"), "Missing required parameter: 'messages'."),
        (format!("{}{}", "[".repeat(200), "]".repeat(200)).into_bytes(), None, "nested too deeply"),
        (b"{\"model\": ".to_vec(), None, "not valid JSON"),
        (
            msgs(json!([])),
            Some("messages"),
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        ),
        (msgs(json!("hi")), Some("messages"), "expected an array, but got a string"),
        (msgs(json!(["hi"])), Some("messages[0]"), "expected an object"),
        (msgs(json!([{"role": "wizard", "content": "x"}])), Some("messages[0].role"), "Invalid value: 'wizard'"),
        (msgs(json!([{"content": "x"}])), Some("messages[0].role"), "Missing required parameter"),
        (
            msgs(json!([{"role": "user"}])),
            Some("messages[0].content"),
            "Missing required parameter: 'messages[0].content'.",
        ),
        (msgs(json!([{"role": "system", "content": null}])), Some("messages[0].content"), "Missing required"),
        (msgs(json!([{"role": "user", "content": 5}])), Some("messages[0].content"), "expected a string or array"),
        (msgs(json!([{"role": "user", "content": []}])), Some("messages[0].content"), "empty array"),
        (
            msgs(
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "audio"}]}]),
            ),
            Some("messages[1].content[1].type"),
            "Invalid value: 'audio'",
        ),
        (
            msgs(
                json!([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]),
            ),
            Some("messages[0].content[0].type"),
            "Invalid value: 'image_url'",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}])),
            Some("messages[0].content[0].type"),
            "'refusal'",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "text"}]}])),
            Some("messages[0].content[0].text"),
            "Missing required",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "text", "text": 1}]}])),
            Some("messages[0].content[0].text"),
            "expected a string",
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!"}}]}]),
            ),
            Some("messages[0].content[0].image_url"),
            "base64",
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url("image/png", b"plain text")}}]}]),
            ),
            Some("messages[0].content[0].image_url"),
            "not a valid image",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}])),
            Some("messages[0].content[0].image_url"),
            "http(s)",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}])),
            Some("messages[0].content[0].image_url"),
            "empty",
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "max"}}]}]),
            ),
            Some("messages[0].content[0].image_url.detail"),
            "'max'",
        ),
        (
            msgs(json!([{"role": "tool", "content": "42"}])),
            Some("messages[0].tool_call_id"),
            "Missing required parameter: 'messages[0].tool_call_id'.",
        ),
        (
            msgs(json!([{"role": "tool", "content": "42", "tool_call_id": 3}])),
            Some("messages[0].tool_call_id"),
            "expected a string",
        ),
        (
            msgs(
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}]),
            ),
            Some("messages[0].tool_calls[0].function.arguments"),
            "Missing required",
        ),
        (msgs(json!([{"role": "assistant", "tool_calls": {}}])), Some("messages[0].tool_calls"), "expected an array"),
        (msgs(json!([{"role": "user", "content": "x", "name": 1}])), Some("messages[0].name"), "expected a string"),
        (with(json!({"tools": {}})), Some("tools"), "expected an array"),
        (with(json!({"tools": [{"type": "retrieval"}]})), Some("tools[0].type"), "'retrieval'"),
        (
            with(json!({"tools": [{"type": "function", "function": {}}]})),
            Some("tools[0].function.name"),
            "Missing required",
        ),
        (with(json!({"tool_choice": "sometimes"})), Some("tool_choice"), "'sometimes'"),
        (with(json!({"tool_choice": "required"})), Some("tool_choice"), "only allowed when 'tools'"),
        (
            with(
                json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            ),
            Some("tool_choice"),
            "'g' is not one of the offered",
        ),
        (with(json!({"tool_choice": 3})), Some("tool_choice"), "expected a string or object"),
        (with(json!({"response_format": {"type": "xml"}})), Some("response_format.type"), "'xml'"),
        (with(json!({"response_format": "json"})), Some("response_format"), "expected an object"),
        (
            with(json!({"response_format": {"type": "json_schema"}})),
            Some("response_format.json_schema"),
            "Missing required",
        ),
        (
            with(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})),
            Some("response_format.json_schema.name"),
            "Missing required",
        ),
        (
            with(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "s"}}})),
            Some("response_format.json_schema.schema"),
            "expected an object",
        ),
        (b"{not json".to_vec(), None, "We could not parse the JSON body of your request."),
        (b"".to_vec(), None, "We could not parse the JSON body"),
        (b"[1,2]".to_vec(), None, "expected an object, but got an array"),
        (b"\"hi\"".to_vec(), None, "expected an object, but got a string"),
    ];
    for (body, param, needle) in cases {
        let shown = String::from_utf8_lossy(&body).into_owned();
        let e = match parse_chat_request(&body) {
            Ok(_) => panic!("accepted: {shown}"),
            Err(e) => e,
        };
        assert_eq!(e.status.as_u16(), 400, "{shown}");
        assert_eq!(e.error_type, "invalid_request_error", "{shown}");
        assert_eq!(e.param.as_deref(), param, "{shown}: {}", e.message);
        assert!(e.message.contains(needle), "{shown}: {:?} lacks {needle:?}", e.message);
    }
}

#[test]
fn defaults() {
    let c = ok(json!({}));
    assert_eq!(c.model, "m");
    assert_eq!(c.messages.len(), 1);
    assert_eq!(c.messages[0].role, Role::User);
    assert_eq!(c.messages[0].content.as_deref(), Some("hi"));
    assert!(!c.stream && !c.include_usage && !c.logprobs);
    assert_eq!((c.temperature, c.top_p, c.max_tokens, c.seed), (None, None, None, None));
    assert_eq!((c.n, c.top_logprobs), (1, 0));
    assert_eq!((c.presence_penalty, c.frequency_penalty), (0.0, 0.0));
    assert!(c.stop.is_empty() && c.logit_bias.is_empty() && c.images.is_empty());
    assert!(c.tools.is_none() && c.tool_choice.is_none() && c.response_format.is_none());
    assert_eq!(c.top_k, None);
}

#[test]
fn prompt_cache_fields_are_accepted_and_a_day_of_retention_refused() {
    ok(json!({"prompt_cache_key": "conversation-1", "prompt_cache_retention": "in-memory"}));
    for (v, needle) in [(json!("24h"), "not supported"), (json!("1w"), "Supported values"), (json!(3), "string")] {
        let e = parse_chat_request(&with(json!({"prompt_cache_retention": v}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt_cache_retention"));
        assert!(e.message.contains(needle), "{}", e.message);
    }
    let e = parse_chat_request(&with(json!({"prompt_cache_key": 5}))).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prompt_cache_key"));
}

#[test]
fn top_k_is_a_limit_and_zero_or_minus_one_none() {
    assert_eq!(ok(json!({"top_k": 40})).top_k, Some(40));
    assert_eq!(ok(json!({"top_k": 0})).top_k, None);
    assert_eq!(ok(json!({"top_k": -1})).top_k, None);
    let e = parse_chat_request(&with(json!({"top_k": -2}))).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("top_k"));
}

#[test]
fn nulls_are_absent_and_unknown_fields_ignored() {
    let c = ok(json!({
        "temperature": null, "top_p": null, "n": null, "stop": null, "max_tokens": null, "seed": null,
        "logprobs": null, "top_logprobs": null, "logit_bias": null, "tools": null, "tool_choice": null,
        "response_format": null, "stream": null, "stream_options": null, "user": null,
        "presence_penalty": null, "frequency_penalty": null, "parallel_tool_calls": null,
        "max_completion_tokens": null,
        "metadata": {"x": 1}, "store": true, "some_future_field": [1, 2, 3],
    }));
    assert_eq!(c.n, 1);
    assert_eq!(c.temperature, None);
    assert!(c.stop.is_empty());
}

#[test]
fn accepted_values() {
    let c = ok(json!({
        "temperature": 0.7, "top_p": 0, "n": 3, "seed": -5, "presence_penalty": -2, "frequency_penalty": 2,
        "max_tokens": 10, "max_completion_tokens": 20, "logprobs": true, "top_logprobs": 5,
        "logit_bias": {"15": -100, "7": 2.5}, "user": "u1", "parallel_tool_calls": false,
        "stream": true, "stream_options": {"include_usage": true},
        "stop": ["", "END", "\n\n"],
    }));
    assert_eq!(c.temperature, Some(0.7));
    assert_eq!(c.top_p, Some(0.0));
    assert_eq!(c.n, 3);
    assert_eq!(c.seed, Some(-5));
    assert_eq!((c.presence_penalty, c.frequency_penalty), (-2.0, 2.0));
    assert_eq!(c.max_tokens, Some(20), "max_completion_tokens wins");
    assert!(c.logprobs);
    assert_eq!(c.top_logprobs, 5);
    assert_eq!(c.logit_bias, vec![(15, -100.0), (7, 2.5)]);
    assert_eq!(c.user.as_deref(), Some("u1"));
    assert_eq!(c.parallel_tool_calls, Some(false));
    assert!(c.stream && c.include_usage);
    assert_eq!(c.stop, vec!["END".to_string(), "\n\n".to_string()]);

    assert_eq!(ok(json!({"max_tokens": 7})).max_tokens, Some(7));
    assert_eq!(ok(json!({"max_tokens": 1_u64 << 40})).max_tokens, Some(u32::MAX));
    assert_eq!(ok(json!({"stop": "STOP"})).stop, vec!["STOP".to_string()]);
    assert!(ok(json!({"stop": ""})).stop.is_empty());
    assert!(!ok(json!({"stream": true, "stream_options": {"include_usage": false}})).include_usage);
    // top_logprobs: 0 with logprobs is fine.
    assert_eq!(ok(json!({"logprobs": true, "top_logprobs": 0})).top_logprobs, 0);
}

#[test]
fn content_parts_and_images() {
    let png = data_url("image/png", PNG);
    let c = ok(json!({"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": [
            {"type": "text", "text": "what is "},
            {"type": "image_url", "image_url": {"url": png, "detail": "low"}},
            {"type": "text", "text": "this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
        ]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "nope"}]},
        {"role": "assistant", "content": null},
    ]}));
    assert_eq!(c.messages[0].role, Role::Developer);
    assert_eq!(c.messages[0].content.as_deref(), Some("be brief"));
    assert!(c.messages[0].image_offsets.is_empty());
    assert_eq!(c.messages[1].content.as_deref(), Some("what is this?"));
    assert_eq!(c.messages[1].image_offsets, vec![8, 13]);
    assert_eq!(
        c.messages[1].to_template_value_marking_images(Some("<img>"))["content"],
        json!("what is <img>this?<img>")
    );
    assert_eq!(c.messages[1].to_template_value()["content"], json!("what is this?"));
    assert_eq!(c.messages[2].content.as_deref(), Some("nope"));
    assert_eq!(c.messages[3].content, None);
    assert_eq!(
        c.images,
        vec![
            ImagePart {
                source: ImageRef::Data { mime: "image/png".into(), bytes: PNG.to_vec() },
                param: "messages[1].content[1].image_url".into(),
                detail: ImageDetail::Low,
            },
            ImagePart {
                source: ImageRef::Remote {
                    url: "https://example.com/a.jpg".into(),
                    param: "messages[1].content[3].image_url".into()
                },
                param: "messages[1].content[3].image_url".into(),
                detail: ImageDetail::Auto,
            },
        ]
    );
}

#[test]
fn tool_messages_and_tools() {
    let c = ok(json!({
        "messages": [
            {"role": "user", "content": "add"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "2", "name": "add"},
        ],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
    }));
    assert_eq!(c.messages[2].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(c.messages[2].name.as_deref(), Some("add"));
    assert!(c.messages[1].tool_calls.is_some());
    let t = c.messages[1].to_template_value();
    assert_eq!(t["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
    assert_eq!(c.tools.as_ref().map(Vec::len), Some(1));
    assert_eq!(c.tools.as_ref().unwrap()[0].name, "add");
    assert_eq!(c.tools.as_ref().unwrap()[0].parameters, Some(json!({"type": "object"})));
    assert_eq!(c.tools.as_ref().unwrap()[0].definition["function"]["name"], "add");
    assert_eq!(c.tool_choice, Some(crate::ToolChoice::Function("add".into())));
    assert_eq!(
        c.response_format,
        Some(crate::ResponseFormat::JsonSchema { name: "r".into(), schema: json!({"type": "object"}), strict: false })
    );
    assert_eq!(ok(json!({"tool_choice": "none"})).tool_choice, Some(crate::ToolChoice::None));
}

fn tool(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": parameters}})
}

/// A schema object of about `bytes` bytes as JSON.
fn schema_of(bytes: usize) -> Value {
    json!({"type": "object", "description": "x".repeat(bytes)})
}

fn refused(body: Vec<u8>) -> ApiError {
    parse_chat_request(&body).err().unwrap_or_else(|| panic!("accepted: {}", String::from_utf8_lossy(&body)))
}

#[test]
fn hostile_sizes_are_refused_naming_their_param() {
    let tools =
        |n: usize| with(json!({"tools": (0..n).map(|i| tool(&format!("f{i}"), json!({}))).collect::<Vec<_>>()}));
    assert!(parse_chat_request(&tools(MAX_TOOLS)).is_ok());
    let e = refused(tools(MAX_TOOLS + 1));
    assert_eq!(e.param.as_deref(), Some("tools"));
    assert_eq!(e.code.as_deref(), Some("array_above_max_length"));
    assert!(e.message.contains("maximum length 128, but got an array with length 129"), "{}", e.message);
    let e = refused(with(json!({"stop": ["a", "b", "c", "d", "e"]})));
    assert_eq!((e.param.as_deref(), e.code.as_deref()), (Some("stop"), Some("array_above_max_length")));

    // Few tools, each under the schema limit, but too many bytes together.
    let big = MAX_SCHEMA_BYTES - 100;
    let n = MAX_TOOLS_BYTES / big + 1;
    let e = refused(with(json!({"tools": (0..n).map(|i| tool(&format!("f{i}"), schema_of(big))).collect::<Vec<_>>()})));
    assert_eq!(e.param.as_deref(), Some("tools"));
    assert!(e.message.contains("more than this server's limit of 524288 bytes"), "{}", e.message);

    assert!(parse_chat_request(&with(json!({"tools": [tool("f", schema_of(big))]}))).is_ok());
    let e = refused(with(json!({"tools": [tool("f", json!({})), tool("g", schema_of(MAX_SCHEMA_BYTES))]})));
    assert_eq!(e.param.as_deref(), Some("tools[1].function.parameters"));
    assert!(e.message.contains("limit of 131072 bytes"), "{}", e.message);

    let format = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "r", "schema": schema}});
    assert!(parse_chat_request(&with(json!({"response_format": format(schema_of(big))}))).is_ok());
    let e = refused(with(json!({"response_format": format(schema_of(MAX_SCHEMA_BYTES))})));
    assert_eq!(e.param.as_deref(), Some("response_format.json_schema.schema"));

    let messages = |n: usize| msgs(Value::Array(vec![json!({"role": "user", "content": "hi"}); n]));
    assert!(parse_chat_request(&messages(MAX_MESSAGES)).is_ok());
    let e = refused(messages(MAX_MESSAGES + 1));
    assert_eq!(e.param.as_deref(), Some("messages"));
    assert_eq!(e.code.as_deref(), Some("array_above_max_length"));
}

#[test]
fn inputs_openai_refuses_are_refused() {
    let e = refused(with(json!({"tools": [tool("ok", json!({})), tool(&"a".repeat(10_000), json!({}))]})));
    assert_eq!(e.param.as_deref(), Some("tools[1].function.name"));
    assert_eq!(e.code.as_deref(), Some("string_above_max_length"));
    assert!(e.message.contains("maximum length 64, but got a string with length 10000"), "{}", e.message);
    assert!(parse_chat_request(&with(json!({"tools": [tool(&"a".repeat(64), json!({}))]}))).is_ok());
    assert!(parse_chat_request(&with(json!({"tools": [tool("get_weather-2", json!({}))]}))).is_ok());
    for name in ["get weather", "f.g", "naïve", "f\"}", "<tool_call>"] {
        let e = refused(with(json!({"tools": [tool(name, json!({}))]})));
        assert_eq!(e.param.as_deref(), Some("tools[0].function.name"), "{name}");
        assert!(e.message.contains("does not match pattern"), "{name}: {}", e.message);
    }
    let cases = [
        (json!({"store": "yes"}), "store", "expected a boolean, but got a string"),
        (json!({"store": 1}), "store", "expected a boolean, but got an integer"),
        (json!({"service_tier": 5}), "service_tier", "expected a string, but got an integer"),
        (json!({"service_tier": {"a": 1}}), "service_tier", "expected a string, but got an object"),
        (json!({"functions": {"name": "f"}}), "functions", "expected an array, but got an object"),
        (json!({"functions": "f"}), "functions", "expected an array, but got a string"),
    ];
    for (patch, param, needle) in cases {
        let e = refused(with(patch.clone()));
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{patch}");
        assert!(e.message.contains(needle), "{patch}: {}", e.message);
    }
    ok(json!({"store": false, "service_tier": "auto", "functions": [], "modalities": ["text"]}));
    let function = json!({"name": "f", "parameters": {"type": "object"}});
    for (patch, param) in [
        (json!({"functions": [function]}), "functions"),
        (json!({"functions": [function], "function_call": "auto"}), "function_call"),
        (json!({"modalities": ["text", "audio"]}), "modalities"),
        (json!({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}), "audio"),
        (json!({"web_search_options": {}}), "web_search_options"),
    ] {
        let e = refused(with(patch.clone()));
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{patch}: {}", e.message);
        assert!(e.message.contains("not supported"), "{patch}: {}", e.message);
    }
}

#[path = "validate_turns_tests.rs"]
mod turns;

#[test]
fn ignore_eos_is_read_as_llama_server_and_vllm_take_it() {
    assert!(!ok(json!({})).ignore_eos);
    assert!(ok(json!({"ignore_eos": true})).ignore_eos);
    assert!(crate::parse_chat_request(
        br#"{"model":"m","messages":[{"role":"user","content":"x"}],"ignore_eos":"yes"}"#
    )
    .is_err());
}
