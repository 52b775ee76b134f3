//! Validation of what a turn carries beyond its text: an assistant prefix to continue, and how much
//! a reasoning model may think before it answers.

use serde_json::{json, Value};

use super::*;

#[test]
fn only_a_last_assistant_message_with_text_can_be_a_prefix() {
    let msgs = |m: Value| json!({"messages": m});
    let c =
        ok(msgs(json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure", "prefix": true}])));
    assert!(c.messages[1].prefix);
    assert_eq!(c.messages[1].to_template_value()["prefix"], true);
    for (m, param) in [
        (json!([{"role": "user", "content": "hi", "prefix": true}]), "messages[0].prefix"),
        (
            json!([{"role": "assistant", "content": "a", "prefix": true}, {"role": "user", "content": "hi"}]),
            "messages[0].prefix",
        ),
        (
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "prefix": "yes"}]),
            "messages[1].prefix",
        ),
    ] {
        let e = parse_chat_request(&with(msgs(m.clone()))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{m}");
    }
}

#[test]
fn reasoning_effort_and_thinking_budget() {
    assert_eq!(ok(json!({})).thinking_budget(), None);
    assert_eq!(ok(json!({"reasoning_effort": "none"})).thinking_budget(), Some(0));
    assert_eq!(ok(json!({"reasoning_effort": "low"})).thinking_budget(), Some(1024));
    assert_eq!(ok(json!({"reasoning_effort": "xhigh"})).thinking_budget(), None);
    assert_eq!(ok(json!({"thinking_token_budget": 77})).thinking_budget(), Some(77));
    assert_eq!(ok(json!({"reasoning_effort": "minimal", "thinking_token_budget": 900})).thinking_budget(), Some(256));
    let err = |patch: Value| parse_chat_request(&with(patch)).unwrap_err();
    let e = err(json!({"reasoning_effort": "extreme"}));
    assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
    assert!(e.message.contains("'none', 'minimal', 'low', 'medium', 'high', 'xhigh'"), "{}", e.message);
    assert_eq!(err(json!({"thinking_token_budget": -1})).param.as_deref(), Some("thinking_token_budget"));
}

#[test]
fn a_tool_message_answers_a_call_of_the_assistant_message_before_it() {
    let msgs = |m: Value| json!({"messages": m});
    let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}});
    let asked = json!({"role": "assistant", "content": null, "tool_calls": [call("c1"), call("c2")]});
    let answer = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "ok"});
    let user = json!({"role": "user", "content": "hi"});
    // Parallel calls answered in any order; a later turn calls again.
    let c = ok(msgs(json!([user, asked, answer("c2"), answer("c1"), {"role": "assistant", "content": "Done."}, user,
        {"role": "assistant", "content": null, "tool_calls": [call("c3")]}, answer("c3")])));
    assert_eq!(c.messages.len(), 8);
    for (m, param) in [
        (json!([user, answer("c1")]), "messages[1].role"),
        (json!([user, asked, answer("nope")]), "messages[2].tool_call_id"),
        (json!([user, asked, answer("c1"), user, answer("c2")]), "messages[4].role"),
        (json!([user, {"role": "assistant", "content": "no calls"}, answer("c1")]), "messages[2].role"),
    ] {
        let e = parse_chat_request(&with(msgs(m.clone()))).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{m}: {}", e.message);
    }
}
