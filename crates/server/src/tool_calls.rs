//! `tools` and `tool_choice`: which functions the model may call, how its output is read back as
//! `tool_calls`, and when the call is forced with a grammar.

use gantry_api::{ApiError, ValidatedChat};
use gantry_engine::tools::{new_call_id, parse_tool_calls, ParsedCall};
use gantry_engine::{Constraint, LazyTools};
use serde_json::{json, Value};

/// The tool set-up of one request.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The `tools` array, handed to the chat template.
    pub tools: Vec<Value>,
    /// Function names the output may call.
    pub names: Vec<String>,
    /// Read calls out of the output (`false` for `tool_choice: "none"`).
    pub parse: bool,
    /// `required` or a named function: the output is forced to be a call.
    pub forced: Option<Constraint>,
    /// `parallel_tool_calls: false` keeps the first call only.
    pub single: bool,
    /// `auto`: grammars that take over once the model starts a call on its own.
    pub lazy: Option<LazyTools>,
}

/// Grammars for a call the model starts by itself under `tool_choice: "auto"`: a bare object
/// (or, when parallel calls are allowed, an array), a ```json fence around one, or the
/// Qwen/Hermes `<tool_call>` block. Whitespace inside the JSON follows the model's own layout (one
/// line, or indented) but is bounded, so it cannot pad forever.
fn lazy_grammars(calls: &[Value], single: bool) -> LazyTools {
    // Between two JSON tokens: one space, or a line break and an indent (one-line or indented).
    let layout = json!({"whitespace_pattern": "(\\x20|\\x0A\\x20{0,12})"});
    let call = json!({"anyOf": calls, "x-guidance": layout});
    let body = if single {
        call.clone()
    } else {
        json!({"anyOf": [{"anyOf": calls}, {"type": "array", "items": {"anyOf": calls}, "minItems": 1}], "x-guidance": layout})
    };
    let terminals = "NL: /\\n/\nWS: /[ \\t\\r\\n]+/\nLANG: /[A-Za-z]+/\n";
    let bare = format!("start: WS? body\n{terminals}body: %json {body}\n");
    let fenced = format!("start: WS? \"```\" LANG? NL body WS? \"```\"\n{terminals}body: %json {body}\n");
    let more = if single { "" } else { " more*" };
    let tagged = format!(
        "start: NL? body NL? \"</tool_call>\"{more}\n\
         more: WS? \"<tool_call>\" NL? body NL? \"</tool_call>\"\n\
         {terminals}body: %json {call}\n"
    );
    LazyTools { bare: Constraint::Lark(bare), tagged: Constraint::Lark(tagged), fenced: Constraint::Lark(fenced) }
}

impl ToolPlan {
    pub fn from_request(chat: &ValidatedChat) -> Result<Option<Self>, ApiError> {
        let tools = match &chat.tools {
            Some(t) if !t.is_empty() => t.clone(),
            _ => return Ok(None),
        };
        let names: Vec<String> = tools
            .iter()
            .map(|t| t.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_string())
            .collect();
        let schemas: Vec<Value> = tools
            .iter()
            .map(|t| t.pointer("/function/parameters").cloned().unwrap_or_else(|| json!({"type": "object"})))
            .collect();
        let call_of = |i: usize| {
            json!({
                "type": "object",
                "properties": {"name": {"const": names[i]}, "arguments": schemas[i]},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        };
        let (parse, forced) = match &chat.tool_choice {
            None => (true, None),
            Some(Value::String(s)) if s == "auto" => (true, None),
            Some(Value::String(s)) if s == "none" => (false, None),
            Some(Value::String(s)) if s == "required" => {
                let any: Vec<Value> = (0..names.len()).map(call_of).collect();
                (true, Some(Constraint::JsonSchema(json!({"anyOf": any}))))
            }
            Some(choice) => {
                let name = choice.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
                let i = names.iter().position(|n| n == name).ok_or_else(|| {
                    ApiError::invalid_value(
                        "tool_choice",
                        format!("Invalid value for 'tool_choice': no function named '{name}' was specified in 'tools'."),
                    )
                })?;
                (true, Some(Constraint::JsonSchema(call_of(i))))
            }
        };
        if forced.is_some() && chat.response_format.as_ref().and_then(|f| f.get("type")).and_then(Value::as_str).is_some_and(|t| t != "text") {
            return Err(ApiError::invalid_value(
                "response_format",
                "'response_format' cannot be combined with a 'tool_choice' that forces a tool call.",
            ));
        }
        let single = chat.parallel_tool_calls == Some(false);
        let lazy = (parse && forced.is_none()).then(|| lazy_grammars(&(0..names.len()).map(call_of).collect::<Vec<_>>(), single));
        Ok(Some(Self { tools, names, parse, forced, single, lazy }))
    }

    pub fn known(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// Reads a finished choice: `(content, tool_calls)`.
    pub fn read(&self, text: String) -> (Option<String>, Option<Vec<Value>>) {
        if !self.parse {
            return (Some(text), None);
        }
        let parsed = parse_tool_calls(&text, &self.known());
        if parsed.calls.is_empty() {
            return (Some(text), None);
        }
        let calls = parsed.calls.into_iter().take(if self.single { 1 } else { usize::MAX });
        (parsed.content, Some(calls.map(|c| call_json(&c, None)).collect()))
    }
}

/// OpenAI's `tool_calls` entry; streamed deltas also carry their `index`.
pub fn call_json(call: &ParsedCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": new_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments}
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(extra: Value) -> ValidatedChat {
        let mut body = json!({
            "model": "m",
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "get_time"}}
            ]
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        gantry_api::parse_chat_request(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn auto_parses_without_forcing() {
        let plan = ToolPlan::from_request(&chat(json!({}))).unwrap().unwrap();
        assert!(plan.parse && plan.forced.is_none());
        let (content, calls) = plan.read(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#.into());
        assert_eq!(content, None);
        let calls = calls.unwrap();
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    }

    #[test]
    fn none_leaves_text_alone() {
        let plan = ToolPlan::from_request(&chat(json!({"tool_choice": "none"}))).unwrap().unwrap();
        let text = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#.to_string();
        assert_eq!(plan.read(text.clone()), (Some(text), None));
    }

    #[test]
    fn required_and_named_choices_force_a_call() {
        let plan = ToolPlan::from_request(&chat(json!({"tool_choice": "required"}))).unwrap().unwrap();
        let Some(Constraint::JsonSchema(s)) = plan.forced else { panic!() };
        assert_eq!(s["anyOf"].as_array().unwrap().len(), 2);
        let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}});
        let plan = ToolPlan::from_request(&chat(named)).unwrap().unwrap();
        let Some(Constraint::JsonSchema(s)) = plan.forced else { panic!() };
        assert_eq!(s["properties"]["name"]["const"], "get_time");
    }

    #[test]
    fn parallel_false_keeps_one_call() {
        let plan = ToolPlan::from_request(&chat(json!({"parallel_tool_calls": false}))).unwrap().unwrap();
        let text = r#"[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]"#;
        assert_eq!(plan.read(text.into()).1.unwrap().len(), 1);
    }
}
