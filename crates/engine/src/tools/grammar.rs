//! The grammars of tool calls: the call objects a forced `tool_choice` allows, the lazy grammars
//! that take over once a model starts a call on its own, and the answer-or-call union of `auto`
//! with a `response_format`. They sit beside the parsers that read the same calls back.

use serde_json::{json, Value};

use super::definitions::CallRoots;
use crate::{Constraint, LazyTools};

/// The strict call object of one function: `{"name": <name>, "arguments": <its schema>}` and
/// nothing else.
pub fn call_schema(name: &str, arguments: &Value) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

/// Grammars for a call the model starts by itself under `tool_choice: "auto"`: a bare object
/// (or, when parallel calls are allowed, an array), a ```json fence around one, or the
/// Qwen/Hermes `<tool_call>` block. Whitespace inside the JSON follows the model's own layout (one
/// line, or indented) but is bounded, so it cannot pad forever.
///
/// `calls` are the strict call objects (`{"name", "arguments"}` and nothing else), used after the
/// native `<tool_call>` tag. Bare and fenced JSON is only constrained once it has started a call
/// (see `call_commitment`) and may still go on with other keys after the
/// arguments: models write such objects as answers (the call echoed with its `"result"`), and they
/// are read back as content. `roots` is what each JSON grammar's root carries ([`CallRoots`]).
pub fn lazy_grammars(calls: &[Value], names: &[String], single: bool, roots: &CallRoots) -> LazyTools {
    // Between two JSON tokens: one space, or a line break and an indent (one-line or indented).
    let layout = json!({"whitespace_pattern": "(\\x20|\\x0A\\x20{0,12})"});
    // Bare and fenced calls commit at `"arguments"` or Llama's `"parameters"`, plain or in
    // OpenAI's `{"type": "function", "function": …}` wrapper (see
    // `call_commitment`): the grammar takes over whichever was written.
    let open_calls: Vec<Value> = calls
        .iter()
        .flat_map(|c| {
            let mut c = c.clone();
            c["additionalProperties"] = json!(true);
            let mut params = c.clone();
            let args = params["properties"].as_object_mut().and_then(|p| p.remove("arguments"));
            params["properties"]["parameters"] = args.unwrap_or(json!({}));
            params["required"] = json!(["name", "parameters"]);
            let wrap = |call: &Value| {
                json!({"type": "object", "properties": {"type": {"const": "function"}, "function": call},
                       "required": ["type", "function"], "additionalProperties": true})
            };
            let (wrapped_c, wrapped_params) = (wrap(&c), wrap(&params));
            [c, params, wrapped_c, wrapped_params]
        })
        .collect();
    let call = roots.root(json!({"anyOf": calls, "x-guidance": layout}));
    let body = if single {
        json!({"anyOf": open_calls, "x-guidance": layout})
    } else {
        json!({"anyOf": [{"anyOf": open_calls}, {"type": "array", "items": {"anyOf": open_calls}, "minItems": 1}], "x-guidance": layout})
    };
    let body = roots.root(body);
    let terminals = "NL: /\\n/\nWS: /[ \\t\\r\\n]+/\nLANG: /[A-Za-z]+/\n";
    // `{{ call }}`: Qwen2.5's template shows calls with doubled braces, and its models copy them.
    let bare = format!("start: WS? outer\nouter: body | \"{{\" WS? body WS? \"}}\"\n{terminals}body: %json {body}\n");
    let more_fences = if single { "" } else { " (WS? fence)*" };
    let fenced_calls_rules = format!(
        "fenced_calls: fence{more_fences}\nfence: \"```\" LANG? NL outer WS? \"```\"\nouter: body | \"{{\" WS? body WS? \"}}\"\n{terminals}body: %json {body}\n"
    );
    let more = if single { "" } else { " more*" };
    let tagged = format!(
        "start: NL? body NL? \"</tool_call>\"{more}\n\
         more: WS? \"<tool_call>\" NL? body NL? \"</tool_call>\"\n\
         {terminals}body: %json {call}\n"
    );
    LazyTools {
        bare: Constraint::Lark(bare),
        tagged: Constraint::Lark(tagged),
        fenced_calls_rules,
        names: names.to_vec(),
    }
}

/// With `tool_choice: "auto"` and a `response_format`, the whole output is one JSON value: either
/// the answer (the `response_format`'s grammar) or a call (`{"name", "arguments"}` of an offered
/// function), whichever the model starts. `roots`: as for [`lazy_grammars`].
pub fn answer_or_call(answer: Constraint, calls: &[Value], roots: &CallRoots) -> Constraint {
    let mut answer = match answer {
        Constraint::JsonObject => json!({"type": "object"}),
        Constraint::JsonSchema(s) => s,
        other @ Constraint::Lark(_) => return other,
    };
    let mut combined = json!({});
    // `$ref`s of the answer point at the root's definitions, and its grammar options apply to
    // the whole: keep them at the root.
    if let Some(obj) = answer.as_object_mut() {
        for key in ["$defs", "definitions", "x-guidance"] {
            if let Some(defs) = obj.remove(key) {
                combined[key] = defs;
            }
        }
    }
    let mut any = vec![answer];
    any.extend(calls.iter().cloned());
    combined["anyOf"] = Value::Array(any);
    Constraint::JsonSchema(roots.root(combined))
}

/// Argument schemas are closed unless they say otherwise: an object schema listing `properties`
/// without `additionalProperties` gets `additionalProperties: false`, so a constrained call never
/// carries keys the client's function does not take. Nested property, item and alternative schemas
/// are closed too; `allOf` parts are left alone (closing each part would refuse the others' keys).
pub fn close_objects(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else { return };
    if obj.contains_key("properties") && !obj.contains_key("additionalProperties") {
        obj.insert("additionalProperties".into(), json!(false));
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(children)) = obj.get_mut(key) {
            children.values_mut().for_each(close_objects);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = obj.get_mut(key) {
            close_objects(child);
        }
    }
    for key in ["anyOf", "oneOf", "prefixItems"] {
        if let Some(Value::Array(children)) = obj.get_mut(key) {
            children.iter_mut().for_each(close_objects);
        }
    }
}
