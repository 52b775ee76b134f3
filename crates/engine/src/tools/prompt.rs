//! The generic tool prompt for models whose chat template has no tool support (SmolLM2, many
//! Llama and Mistral fine-tunes): the tool list goes into the system message as plain
//! instructions, earlier calls and their results become ordinary turns, and the model answers a
//! call with a bare JSON object, which [`super::parse_tool_calls`] reads (and which the grammar
//! enforces when `tool_choice` forces a call).

use serde_json::{json, Value as Json};

/// Rewrites `messages` so a template that ignores `tools` still shows them to the model.
pub fn with_generic_tool_prompt(messages: &[Json], tools: &[Json]) -> Vec<Json> {
    let functions: Vec<String> =
        tools.iter().map(|t| serde_json::to_string(t.get("function").unwrap_or(t)).unwrap_or_default()).collect();
    let instructions = format!(
        "You can call these functions:\n{}\n\nTo call a function, reply with only a JSON object \
         {{\"name\": <function name>, \"arguments\": <arguments object>}} (a JSON array of such \
         objects for several calls) and nothing else. Otherwise answer normally.",
        functions.join("\n")
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut names_by_id = std::collections::HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Json::as_str).unwrap_or("");
        match role {
            "system" | "developer" if i == 0 => {
                let text = content_text(m);
                out.push(json!({"role": "system", "content": format!("{text}\n\n{instructions}")}));
            }
            "assistant" if m.get("tool_calls").and_then(Json::as_array).is_some_and(|c| !c.is_empty()) => {
                let calls: Vec<Json> = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let name = c.pointer("/function/name").cloned().unwrap_or(Json::Null);
                        if let (Some(id), Some(n)) = (c.get("id").and_then(Json::as_str), name.as_str()) {
                            names_by_id.insert(id.to_string(), n.to_string());
                        }
                        // Arguments travel as a JSON string; the model sees the object.
                        let args = c.pointer("/function/arguments").map(|a| match a.as_str() {
                            Some(s) => serde_json::from_str(s).unwrap_or_else(|_| Json::String(s.to_string())),
                            None => a.clone(),
                        });
                        json!({"name": name, "arguments": args.unwrap_or_else(|| json!({}))})
                    })
                    .collect();
                let call_text = if calls.len() == 1 { calls[0].to_string() } else { Json::Array(calls).to_string() };
                let text = content_text(m);
                let content = if text.is_empty() { call_text } else { format!("{text}\n{call_text}") };
                out.push(json!({"role": "assistant", "content": content}));
            }
            "tool" => {
                let id = m.get("tool_call_id").and_then(Json::as_str).unwrap_or("");
                let name =
                    m.get("name").and_then(Json::as_str).map(str::to_string).or_else(|| names_by_id.get(id).cloned());
                let label = name.unwrap_or_else(|| id.to_string());
                out.push(json!({"role": "user", "content": format!("Result of {label}: {}", content_text(m))}));
            }
            _ => out.push(m.clone()),
        }
    }
    let has_system = messages
        .first()
        .and_then(|m| m.get("role"))
        .and_then(Json::as_str)
        .is_some_and(|r| r == "system" || r == "developer");
    if !has_system {
        out.insert(0, json!({"role": "system", "content": instructions}));
    }
    out
}

/// The text of a message whose content is a string, text parts, or null.
fn content_text(m: &Json) -> String {
    match m.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Json::as_str)).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Json> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
        ]
    }

    #[test]
    fn tools_join_the_system_message_or_make_one() {
        let with_system = with_generic_tool_prompt(
            &[json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": "Hi"})],
            &tools(),
        );
        assert_eq!(with_system.len(), 2);
        let sys = with_system[0]["content"].as_str().unwrap();
        assert!(sys.starts_with("Be brief.") && sys.contains("\"name\":\"get_weather\""), "{sys}");
        let without = with_generic_tool_prompt(&[json!({"role": "user", "content": "Hi"})], &tools());
        assert_eq!(without.len(), 2);
        assert_eq!(without[0]["role"], "system");
        assert_eq!(without[1]["content"], "Hi");
    }

    #[test]
    fn calls_and_results_become_plain_turns() {
        let messages = [
            json!({"role": "user", "content": "Weather in Paris?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "18C"}),
        ];
        let out = with_generic_tool_prompt(&messages, &tools());
        assert_eq!(out[2]["content"], r#"{"name":"get_weather","arguments":{"city":"Paris"}}"#);
        assert_eq!(out[3]["role"], "user");
        assert_eq!(out[3]["content"], "Result of get_weather: 18C");
    }
}
