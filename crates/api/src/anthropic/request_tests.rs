//! Anthropic Messages requests read as the chat request they mean: tools, images, prefill,
//! thinking, output format, and the SDK's other parameters taken or refused by name.

use serde_json::{json, Value};

use super::*;
use crate::{Role, ToolChoice};

fn parse(v: Value) -> Result<ValidatedChat, ApiError> {
    parse_messages_request(v.to_string().as_bytes())
}

fn base() -> Value {
    json!({"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]})
}

#[test]
fn a_plain_request_is_the_chat_request_it_means() {
    let mut v = base();
    v["system"] = json!([{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]);
    v["stop_sequences"] = json!(["a", "b", "c", "d", "e"]);
    v["temperature"] = json!(0.5);
    v["top_k"] = json!(40);
    v["stream"] = json!(true);
    let chat = parse(v).unwrap();
    assert_eq!(chat.max_tokens, Some(32));
    assert_eq!(chat.messages.len(), 2);
    assert_eq!(chat.messages[0].role, Role::System);
    assert_eq!(chat.messages[0].to_template_value()["content"], "Be brief.\nBe kind.");
    assert_eq!(chat.stop, ["a", "b", "c", "d", "e"], "more than Chat Completions' four");
    assert_eq!((chat.temperature, chat.top_k), (Some(0.5), Some(40)));
    assert!(chat.stream && chat.include_usage, "a translated stream always gets its usage");
}

#[test]
fn tool_turns_become_calls_and_tool_messages() {
    let mut v = base();
    v["tools"] = json!([{"name": "get_weather", "description": "Weather", "input_schema":
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    v["tool_choice"] = json!({"type": "any", "disable_parallel_tool_use": true});
    v["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "text", "text": "And tomorrow?"}]},
    ]);
    let chat = parse(v.clone()).unwrap();
    let roles: Vec<Role> = chat.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool, Role::User]);
    let call = &chat.messages[1].to_template_value()["tool_calls"][0];
    assert_eq!(call["id"], "toolu_1");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(chat.messages[2].to_template_value()["content"], "18C");
    assert_eq!(chat.tool_choice, Some(ToolChoice::Required));
    assert_eq!(chat.parallel_tool_calls, Some(false));
    assert_eq!(chat.tools.as_ref().map(Vec::len), Some(1));
    assert!(!chat.tools.as_ref().unwrap()[0].strict);
    let mut strict = v.clone();
    strict["tools"][0]["strict"] = json!(true);
    assert!(parse(strict).unwrap().tools.unwrap()[0].strict, "Anthropic's strict tool use is kept");
    // A result must answer a call of the assistant message right before it.
    v["messages"][2]["content"][0]["tool_use_id"] = json!("toolu_9");
    let e = parse(v.clone()).unwrap_err();
    assert!(
        e.message.starts_with("messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9."),
        "{}",
        e.message
    );
    v["messages"] =
        json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]);
    assert!(parse(v).unwrap_err().message.contains("corresponding `tool_use` block"));
}

#[test]
fn images_come_as_data_urls_and_errors_name_the_field() {
    let mut v = base();
    v["messages"] = json!([{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "What is this?"}]}]);
    let chat = parse(v).unwrap();
    assert_eq!(chat.images.len(), 1);
    let cases = [
        (json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}), "max_tokens: Field required"),
        (json!({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
        (json!({"model": "m", "max_tokens": 5, "messages": []}), "at least one message"),
        (json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}), "messages.0.role"),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "foo": 1}),
            "foo: Extra inputs",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}),
            "temperature",
        ),
        (json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": 0}), "top_k"),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "enabled", "budget_tokens": 1024}}),
            "`max_tokens` must be greater than `thinking.budget_tokens`",
        ),
        (
            json!({"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "enabled", "budget_tokens": 1000}}),
            "greater than or equal to 1024",
        ),
        (
            json!({"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "sometimes"}}),
            "thinking.type",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "server tools",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}),
            "messages.0.content.0",
        ),
        (
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                "stop_sequences": [" "]}),
            "non-whitespace",
        ),
    ];
    for (body, needle) in cases {
        let e = parse(body.clone()).unwrap_err();
        assert_eq!(e.status.as_u16(), 400, "{body}");
        assert!(e.message.contains(needle), "{body}: {}", e.message);
    }
}

#[test]
fn shared_validation_speaks_of_messages_fields() {
    let mut v = base();
    v["tool_choice"] = json!({"type": "tool", "name": "missing"});
    v["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let e = parse(v).unwrap_err();
    assert_eq!(e.status.as_u16(), 400);
    assert!(e.message.contains("missing"), "{}", e.message);
}

#[test]
fn a_final_assistant_turn_is_a_prefill_the_answer_continues() {
    let mut v = base();
    v["messages"] = json!([{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{\"a\":"}]);
    let chat = parse(v.clone()).unwrap();
    assert!(chat.messages[1].prefix && !chat.messages[0].prefix);
    v["messages"][1]["content"] = json!("Sure, ");
    assert!(parse(v).unwrap_err().message.contains("trailing whitespace"));
}

#[test]
fn thinking_is_a_budget_or_off_and_earlier_thinking_reaches_the_template() {
    let parse = |v: Value| parse_messages_request(&serde_json::to_vec(&v).unwrap()).unwrap();
    let base = json!({"model": "m", "max_tokens": 4096, "messages": [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Add.", "signature": "s"},
                                          {"type": "text", "text": "4"}]},
        {"role": "user", "content": "And 3 + 3?"}]});
    let chat = parse(base.clone());
    assert_eq!(chat.thinking_budget(), Some(0), "no `thinking`: none, as Anthropic's");
    assert_eq!(chat.messages[1].reasoning.as_deref(), Some("Add."));
    let mut enabled = base;
    enabled["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    assert_eq!(parse(enabled).thinking_budget(), Some(2048));
}

#[test]
fn output_config_format_is_a_strict_json_schema() {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let mut body = base();
    body["output_config"] = json!({"format": {"type": "json_schema", "schema": schema}, "effort": "high"});
    let chat = parse(body).unwrap();
    assert_eq!(
        chat.response_format,
        Some(crate::ResponseFormat::JsonSchema { name: "output".into(), schema, strict: true })
    );
    for bad in [json!({"format": {"type": "text"}}), json!({"effort": "extreme"}), json!({"colour": 1}), json!(3)] {
        let mut body = base();
        body["output_config"] = bad.clone();
        assert_eq!(parse(body).unwrap_err().param.as_deref(), Some("output_config"), "{bad}");
    }
    let mut body = base();
    body["output_config"] = json!({"effort": "low"});
    assert_eq!(parse(body).unwrap().response_format, None);
}

#[test]
fn the_sdks_other_parameters_are_taken_and_server_features_refused() {
    let mut v = base();
    for (key, value) in [
        ("inference_geo", json!("us")),
        ("speed", json!("standard")),
        ("container", Value::Null),
        ("context_management", Value::Null),
        ("thinking", json!({"type": "adaptive"})),
    ] {
        v[key] = value;
    }
    let chat = parse(v.clone()).unwrap();
    assert_eq!(chat.reasoning_effort, None, "adaptive: the model's own default");
    v["container"] = json!("container_1");
    let e = parse(v).unwrap_err();
    assert!(e.message.contains("container: not supported"), "{}", e.message);
}

#[test]
fn a_tool_reads_as_on_the_chat_path() {
    let mut v = base();
    v["tools"] = json!([{"input_schema": {"type": "object"}, "description": "d", "name": "f"}]);
    let chat = parse(v).unwrap();
    let function = &chat.tools.unwrap()[0].definition["function"];
    let keys: Vec<&String> = function.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "description", "parameters"]);
}
