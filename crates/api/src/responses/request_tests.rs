//! OpenAI Responses requests read as the chat request they mean: input items, tool loops, text
//! format, continued conversations, reasoning, and what this server refuses by field.

use serde_json::{json, Value};

use super::*;
use crate::{ResponseFormat, Role, ToolChoice};

fn parse(v: Value) -> Result<ResponsesRequest, ApiError> {
    parse_responses_request(v.to_string().as_bytes())
}

#[test]
fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
    let r = parse(
        json!({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 20, "stream": true}),
    )
    .unwrap();
    let roles: Vec<Role> = r.chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::User]);
    assert_eq!(r.chat.max_tokens, Some(20));
    assert!(r.chat.stream && r.chat.include_usage);
    assert_eq!(r.echo["instructions"], "Be brief.");
    assert!(r.store, "OpenAI's default");
    assert_eq!(r.items, [json!({"type": "message", "role": "user", "content": "Hi"})]);
    assert_eq!(r.echo["tool_choice"], "auto");
}

#[test]
fn a_tool_loop_in_items_becomes_calls_and_tool_messages() {
    let r = parse(json!({"model": "m", "tools": [{"type": "function", "name": "get_weather", "description": "w",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_2", "output": "21C"},
        ]}))
    .unwrap();
    let roles: Vec<Role> = r.chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool, Role::Tool]);
    let assistant = r.chat.messages[1].to_template_value();
    assert_eq!(assistant["content"], "Checking.");
    assert_eq!(assistant["tool_calls"].as_array().map(Vec::len), Some(2), "{assistant}");
    assert_eq!(r.chat.tool_choice, Some(ToolChoice::Function("get_weather".into())));
    // An output must answer a call made earlier: OpenAI's words and param.
    let orphan = json!({"model": "m", "input": [{"role": "user", "content": "Hi"},
        {"type": "function_call_output", "call_id": "call_9", "output": "18C"}]});
    let e = parse(orphan).unwrap_err();
    assert_eq!(e.message, "No tool call found for function call output with call_id call_9.");
    assert_eq!(e.param.as_deref(), Some("input"));
}

#[test]
fn text_format_is_the_response_format() {
    let r = parse(json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "answer", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}}}}))
    .unwrap();
    assert!(matches!(r.chat.response_format, Some(ResponseFormat::JsonSchema { .. })));
    let r = parse(json!({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}})).unwrap();
    assert_eq!(r.chat.response_format, Some(ResponseFormat::JsonObject));
    let r = parse(json!({"model": "m", "input": "x", "text": {"format": {"type": "text"}}})).unwrap();
    assert_eq!(r.chat.response_format, None);
}

#[test]
fn what_this_server_cannot_do_is_a_400_naming_the_field() {
    let cases = [
        (json!({"input": "x"}), "model"),
        (json!({"model": "m"}), "input"),
        (json!({"model": "m", "input": "x", "store": "yes"}), "store"),
        (json!({"model": "m", "input": "x", "background": true}), "background"),
        (json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
        (json!({"model": "m", "input": [{"role": "tool", "content": "x"}]}), "input[0].role"),
        (json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}), "text.format.type"),
        (json!({"model": "m", "input": "x", "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"model": "m", "input": []}), "input"),
    ];
    for (body, param) in cases {
        let e = parse(body.clone()).unwrap_err();
        assert_eq!(e.status.as_u16(), 400, "{body}");
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
    }
}

#[test]
fn a_continued_conversation_comes_before_the_new_input_and_its_turn_is_kept() {
    let prior = [
        json!({"type": "message", "role": "user", "content": "My name is Ada."}),
        json!({"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
               "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}]}),
    ];
    let body = json!({"model": "m", "input": "What is my name?", "previous_response_id": "resp_1", "store": false});
    let r = parse(body).unwrap();
    assert_eq!(r.continues(), Some("resp_1"));
    let r = r.continuing(&prior).unwrap();
    assert_eq!(r.continues(), None, "read once");
    let texts: Vec<Value> = r.chat.messages.iter().map(|m| m.to_template_value()["content"].clone()).collect();
    assert_eq!(texts, [json!("My name is Ada."), json!("Hello Ada."), json!("What is my name?")]);
    assert!(!r.store);
    assert_eq!(r.echo["previous_response_id"], "resp_1");
    let response = json!({"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Ada."}]}]});
    assert_eq!(turn_items(&r.items, &response).as_array().map(Vec::len), Some(2));
}

#[test]
fn reasoning_items_go_with_their_turn_and_the_effort_is_the_chats() {
    let r = parse(json!({"model": "m", "reasoning": {"effort": "low"}, "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "Say it."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18C."}]},
        {"role": "user", "content": "Thanks"},
    ]}))
    .unwrap();
    let roles: Vec<Role> = r.chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool, Role::Assistant, Role::User]);
    let call_turn = r.chat.messages[1].to_template_value();
    assert_eq!(
        (call_turn["reasoning_content"].as_str(), call_turn["tool_calls"][0]["id"].as_str()),
        (Some("Call it."), Some("call_1"))
    );
    let answer = r.chat.messages[3].to_template_value();
    assert_eq!((answer["reasoning_content"].as_str(), answer["content"].as_str()), (Some("Say it."), Some("18C.")));
    assert_eq!(r.chat.thinking_budget(), Some(1024));
    assert_eq!(r.echo["reasoning"], json!({"effort": "low"}));
    let e = parse(json!({"model": "m", "input": "x", "reasoning": {"effort": "max"}})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("reasoning.effort"));
}

/// A stored Response keeps what its request echoes and its items for weeks: fields the model
/// never reads are held to the API's limits, and items to their defined keys.
#[test]
fn fields_a_stored_response_keeps_are_held_to_the_apis_limits() {
    let with = |field: &str, v: Value| {
        let mut body = json!({"model": "m", "input": "x"});
        body[field] = v;
        parse(body)
    };
    let pairs = |n: usize| Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect());
    assert!(with("metadata", pairs(16)).is_ok());
    let refused = [
        ("metadata", pairs(17), "metadata"),
        ("metadata", json!({"k": "v".repeat(513)}), "metadata.k"),
        (
            "metadata",
            json!({"k".repeat(65): "v"}),
            "metadata.kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…",
        ),
        ("metadata", json!({"k": 1}), "metadata.k"),
        ("metadata", json!("v"), "metadata"),
        ("truncation", json!("x".repeat(100)), "truncation"),
        ("text", json!({"format": {"type": "text"}, "junk": "v"}), "text.junk"),
        ("text", json!({"verbosity": "loud"}), "text.verbosity"),
        ("reasoning", json!({"effort": "low", "junk": 1}), "reasoning.junk"),
        ("reasoning", json!({"summary": "all"}), "reasoning.summary"),
        ("stream", json!("yes"), "stream"),
        ("stream", json!(1), "stream"),
        ("user", json!("u".repeat(3_500_000)), "user"),
        ("user", json!("u".repeat(65)), "user"),
        ("user", json!(7), "user"),
        ("safety_identifier", json!("s".repeat(65)), "safety_identifier"),
        ("text", json!({"format": {"type": "json_schema", "name": "n".repeat(65), "schema": {}}}), "text.format.name"),
        ("text", json!({"format": {"type": "json_schema", "name": "a b", "schema": {}}}), "text.format.name"),
        (
            "text",
            json!({"format": {"type": "json_schema", "name": "n", "description": "d".repeat(1025), "schema": {}}}),
            "text.format.description",
        ),
        ("text", json!({"format": {"type": "json_object", "junk": "v"}}), "text.format.junk"),
        ("tools", json!([{"type": "function", "name": "f", "junk": "v"}]), "tools[0].junk"),
        ("tool_choice", json!({"type": "function", "name": "f", "junk": "v"}), "tool_choice.junk"),
    ];
    for (field, value, param) in refused {
        let e = with(field, value.clone()).expect_err(&format!("{field}: {value}"));
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{field}: {}", e.message);
        assert!(e.message.len() < 300, "an error quotes little of what it refuses: {}", e.message);
    }
    for (field, value) in [
        ("truncation", json!("auto")),
        ("truncation", json!("disabled")),
        ("text", json!({"format": {"type": "text"}, "verbosity": "low"})),
        ("reasoning", json!({"effort": null, "summary": "auto"})),
        ("stream", json!(false)),
        ("user", json!("u".repeat(64))),
        ("safety_identifier", json!("s".repeat(64))),
        (
            "text",
            json!({"format": {"type": "json_schema", "name": "n", "description": "d".repeat(1024),
                   "schema": {"type": "object"}}}),
        ),
    ] {
        assert!(with(field, value.clone()).is_ok(), "{field}: {value}");
    }
}

#[test]
fn items_are_kept_with_their_defined_keys_only() {
    let r = parse(json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi", "junk": "x"}], "junk": "y"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello.", "annotations": [], "logprobs": [{"token": "x"}]}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "extra": [1, 2, 3]},
        {"type": "function_call_output", "call_id": "c1", "output": "ok", "extra": {"a": 1}},
    ]}))
    .unwrap();
    assert_eq!(
        r.items,
        [
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}),
            json!({"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}),
            json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
        ]
    );
    let long_id =
        json!({"model": "m", "input": [{"type": "function_call_output", "call_id": "c".repeat(257), "output": "ok"}]});
    let e = parse(long_id).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input[0].call_id"), "{}", e.message);
}

#[test]
fn parts_keep_what_their_type_defines_and_a_reasoning_summary_is_not_kept() {
    let big = "x".repeat(100_000);
    let r = parse(json!({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi", "detail": big, "image_url": big}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": big}],
         "content": [{"type": "reasoning_text", "text": "Think.", "junk": big}]},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No.", "text": big}]},
    ]}))
    .unwrap();
    assert_eq!(
        r.items,
        [
            json!({"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}),
            json!({"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Think."}]}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}),
        ]
    );
    assert!(r.echo["safety_identifier"].is_null());
}

/// A body is checked whole before the response it continues is read: a bad one is refused
/// without it, and an output answering the stored response's call passes until it is read.
#[test]
fn a_continuing_body_is_checked_before_its_conversation_is_read() {
    let bad = json!({"model": "m", "input": "x", "previous_response_id": "resp_1", "temperature": "hot"});
    assert_eq!(parse(bad).unwrap_err().param.as_deref(), Some("temperature"));
    let answer = json!({"model": "m", "previous_response_id": "resp_1",
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "18C"}]});
    let r = parse(answer.clone()).unwrap();
    assert_eq!(r.continues(), Some("resp_1"));
    let prior = [
        json!({"type": "message", "role": "user", "content": "Weather?"}),
        json!({"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}),
    ];
    let r = r.continuing(&prior).unwrap();
    let roles: Vec<Role> = r.chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool]);
    assert_eq!(r.chat.messages[1].to_template_value()["tool_calls"][0]["function"]["name"], "get_weather");
    // The stored conversation decides: a call it never made is still refused.
    let e = parse(answer).unwrap().continuing(&prior[..1]).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input"), "{}", e.message);
}

#[test]
fn included_logprobs_are_the_chat_logprobs() {
    let r = parse(json!({"model": "m", "input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 3}))
        .unwrap();
    assert_eq!((r.chat.logprobs, r.chat.top_logprobs), (true, 3));
    let r = parse(json!({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"], "top_logprobs": 3}))
        .unwrap();
    assert!(!r.chat.logprobs, "top_logprobs alone returns none, as OpenAI's");
    assert_eq!(
        parse(json!({"model": "m", "input": "x", "include": "all"})).unwrap_err().param.as_deref(),
        Some("include")
    );
}
