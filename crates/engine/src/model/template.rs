//! Chat templates: the model's own `tokenizer.chat_template` (Jinja, written for Hugging Face
//! transformers) rendered with minijinja, configured the way transformers configures Jinja so
//! the prompt matches what the model was trained on.

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

/// A compiled chat template plus the special-token strings templates refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether the template reads `tools`; if not, tools go in through the generic tool prompt.
    handles_tools: bool,
    /// The template walks `content` as a list of typed parts (`{"type": "text", "text": …}`),
    /// as vision-language templates (SmolVLM, Gemma 3) do; a plain string would render as nothing.
    typed_content: bool,
    bos_token: String,
    eos_token: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template itself is broken: an operator problem, reported at load time.
    #[error("the model's chat template does not compile: {0}")]
    Compile(String),
    /// Rendering failed for these messages (e.g. the template's `raise_exception`): a client problem.
    #[error("{0}")]
    Render(String),
    /// The model's GGUF has no `tokenizer.chat_template` (a base model): no chat can be rendered,
    /// and none is made up, since a guessed format would be silently wrong.
    #[error("the model has no chat template (its GGUF has no tokenizer.chat_template)")]
    Missing,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned()).map_err(|e| TemplateError::Compile(describe(&e)))?;
        let handles_tools = source.contains("tools");
        let mut template = Self {
            env,
            handles_tools,
            typed_content: false,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        };
        template.typed_content = template.needs_typed_content();
        Ok(template)
    }

    /// Whether a user message's text only reaches the prompt when it comes as a typed text part
    /// (as llama.cpp's server detects it): rendered as a string it goes missing, as a part it is
    /// there.
    fn needs_typed_content(&self) -> bool {
        const PROBE: &str = "gantry-template-probe-7f3a";
        let probe = [serde_json::json!({"role": "user", "content": PROBE})];
        let shows = |typed: bool| self.render_as(&probe, None, typed, None).is_ok_and(|out| out.contains(PROBE));
        !shows(false) && shows(true)
    }

    /// Renders `messages` (objects with `role`, `content`, optional `tool_calls`, `tool_call_id`,
    /// `name`) and optional `tools` into the prompt text, ending with the assistant's turn.
    /// Templates that do not read `tools` get them through the generic tool prompt.
    pub fn render(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<String, TemplateError> {
        self.render_as(messages, tools, self.typed_content, None)
    }

    /// This template with its thinking switch (`enable_thinking`, as Qwen3's templates read it)
    /// set, where `thinking` is given.
    pub fn with_thinking(&self, thinking: Option<bool>) -> Switched<'_> {
        Switched { template: self, thinking }
    }

    fn render_as(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        typed_content: bool,
        thinking: Option<bool>,
    ) -> Result<String, TemplateError> {
        // A template without tool support would drop `tools` (and tool turns) silently.
        let tmpl = self.env.get_template(TEMPLATE_NAME).expect("template was added in new()");
        let rewritten;
        let (messages, tools) = match tools {
            Some(t) if !t.is_empty() && !self.handles_tools => {
                rewritten = crate::tools::with_generic_tool_prompt(messages, t);
                (rewritten.as_slice(), None)
            }
            _ => (messages, tools),
        };
        let messages: Vec<Json> = messages.iter().map(|m| normalise_message(m, typed_content)).collect();
        let ctx = minijinja::context! {
            messages => Value::from_serialize(&messages),
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        // Left undefined unless set: a template may read a defined `none` as "off".
        let ctx = match thinking {
            Some(on) => minijinja::context! { enable_thinking => on, ..ctx },
            None => ctx,
        };
        tmpl.render(ctx).map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// A template with its thinking switch set (see [`ChatTemplate::with_thinking`]).
pub struct Switched<'a> {
    template: &'a ChatTemplate,
    thinking: Option<bool>,
}

impl Switched<'_> {
    pub fn render(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<String, TemplateError> {
        self.template.render_as(messages, tools, self.template.typed_content, self.thinking)
    }
}

/// Most templates know only system/user/assistant/tool: a developer message is OpenAI's newer
/// name for a system message, so it is rendered as one.
///
/// OpenAI sends a tool call's `arguments` as a JSON string; chat templates (written for
/// transformers) expect the object and print it with `tojson`, so a string would reach the model
/// double-encoded, unlike anything it was trained on. Arguments that parse are passed as objects.
///
/// For a template that reads typed content parts, string content becomes one text part (images
/// stay where the server marked them inside that text, as llama.cpp's server does it).
fn normalise_message(m: &Json, typed_content: bool) -> Json {
    let mut m = m.clone();
    if typed_content {
        if let Some(text) = m.get("content").and_then(Json::as_str) {
            m["content"] = serde_json::json!([{"type": "text", "text": text}]);
        }
    }
    if m.get("role").and_then(Json::as_str) == Some("developer") {
        m["role"] = Json::from("system");
    }
    if let Some(calls) = m.get_mut("tool_calls").and_then(Json::as_array_mut) {
        for call in calls {
            if let Some(args) = call.pointer_mut("/function/arguments") {
                if let Some(parsed) =
                    args.as_str().and_then(|s| serde_json::from_str::<Json>(s).ok()).filter(Json::is_object)
                {
                    *args = parsed;
                }
            }
        }
    }
    m
}

fn describe(e: &Error) -> String {
    let mut msg = match e.kind() {
        ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_string(),
        _ => e.to_string(),
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(fmt)`, used by Llama 3 templates for the current date.
fn strftime_now(format: String) -> String {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (y, m, d) = civil_from_days(now.div_euclid(86_400));
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    format
        .replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", MONTHS[(m - 1) as usize])
        .replace("%b", &MONTHS[(m - 1) as usize][..3])
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).expect("a day of the month");
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).expect("a month");
    (if m <= 2 { era * 400 + yoe + 1 } else { era * 400 + yoe }, m, d)
}

/// Python's `json.dumps(x, ensure_ascii=False)` (what transformers' `tojson` does): `", "` and
/// `": "` separators, no HTML escaping, key order preserved. `indent` is honoured.
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json: Json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_python_json(v: &Json, indent: Option<usize>, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_python_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                out.push_str(&Json::from(k.as_str()).to_string());
                out.push_str(": ");
                write_python_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// SmolVLM's template (ggml-org/SmolVLM-256M-Instruct-GGUF) walks content as typed parts.
    const SMOLVLM: &str = "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

    #[test]
    fn templates_that_read_typed_parts_get_the_text_as_one() {
        let t = ChatTemplate::new(SMOLVLM, "", "").unwrap();
        assert!(t.typed_content);
        let out = t.render(&[json!({"role": "user", "content": "What is in<IMG> this?"})], None).unwrap();
        assert_eq!(out, "<|im_start|>User: What is in<IMG> this?<end_of_utterance>\nAssistant:");
        let chatml = ChatTemplate::new("{% for m in messages %}{{ m['content'] }}{% endfor %}", "", "").unwrap();
        assert!(!chatml.typed_content);
    }

    #[test]
    fn chatml_renders_with_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let out = t
            .render(&[json!({"role":"system","content":"Be brief."}), json!({"role":"user","content":"Hi"})], None)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn developer_is_rendered_as_system() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t.render(&[json!({"role":"developer","content":"x"})], None).unwrap();
        assert!(out.starts_with("<|im_start|>system\nx"), "{out}");
    }

    #[test]
    fn python_string_methods_and_raise_exception() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0]['content'].strip().upper() }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&[json!({"role":"user","content":"  hi "})], None).unwrap(), "HI");
        let err = t.render(&[json!({"role":"system","content":"x"})], None).unwrap_err();
        assert!(matches!(err, TemplateError::Render(ref m) if m.contains("first must be user")), "{err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let src = "{% for t in tools %}{{ t | tojson }}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let tools =
            [json!({"type":"function","function":{"name":"get_weather","parameters":{"z":1,"a":["<b>", "é"]}}})];
        let out = t.render(&[], Some(&tools)).unwrap();
        assert_eq!(
            out,
            r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"z": 1, "a": ["<b>", "é"]}}}"#
        );
    }

    #[test]
    fn tojson_indent() {
        let t = ChatTemplate::new("{{ tools[0] | tojson(indent=2) }}", "", "").unwrap();
        let out = t.render(&[], Some(&[json!({"a":[1,2]})])).unwrap();
        assert_eq!(out, "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
    }

    #[test]
    fn loop_controls_and_trim_blocks() {
        let src =
            "{% for m in messages %}\n{% if loop.index > 1 %}{% break %}{% endif %}\n{{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out =
            t.render(&[json!({"role":"user","content":"a"}), json!({"role":"user","content":"b"})], None).unwrap();
        assert_eq!(out, "a\n");
    }

    #[test]
    fn broken_template_is_a_compile_error() {
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TemplateError::Compile(_))));
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = strftime_now("%d %B %Y".into());
        assert_eq!(s.len(), "01 January 2026".len().max(s.len()));
        assert!(s.split(' ').count() == 3);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
    }

    #[test]
    fn templates_without_tool_support_get_the_generic_tool_prompt() {
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        let t = ChatTemplate::new(chatml, "", "").unwrap();
        let tools = [json!({"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}})];
        let out = t.render(&[json!({"role": "user", "content": "hi"})], Some(&tools)).unwrap();
        assert!(out.starts_with("<|im_start|>system\nYou can call these functions:"), "{out}");
        assert!(out.contains("\"name\":\"lookup\""), "{out}");
        // Without tools nothing changes.
        let plain = t.render(&[json!({"role": "user", "content": "hi"})], None).unwrap();
        assert_eq!(plain, "<|im_start|>user\nhi<|im_end|>\n");
    }

    #[test]
    fn tool_call_arguments_reach_the_template_as_objects() {
        let t = ChatTemplate::new("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}", "", "").unwrap();
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Paris\"}"}}]});
        assert_eq!(t.render(&[call], None).unwrap(), r#"{"city": "Paris"}"#);
    }
}
