//! `tools` and `tool_choice`: which functions the model may call, how its output is read back as
//! `tool_calls`, and when the call is forced with a grammar.

use gantry_api::{tool_choice_not_offered, ApiError, ResponseFormat, ToolChoice, ValidatedChat};
use gantry_engine::tools::{
    answer_or_call, call_schema, close_objects, hoist_definitions, lazy_grammars, CallRoots, ToolCallStreamer,
};
use gantry_engine::{Constraint, LazyTools};
use serde_json::{json, Value};

/// The tool set-up of one request.
#[derive(Debug, Clone)]
pub(crate) struct ToolPlan {
    /// The `tools` array, handed to the chat template.
    pub tools: Vec<Value>,
    /// Function names the output may call.
    pub names: Vec<String>,
    /// Read calls out of the output (`false` for `tool_choice: "none"`).
    pub parse: bool,
    /// `required` or a named function: the output is forced to be a call.
    pub forced: Option<Constraint>,
    /// The functions a forced call may name: all offered for `required`, else the one named.
    forced_names: Vec<String>,
    /// `parallel_tool_calls: false` keeps the first call only.
    pub single: bool,
    /// `auto`: grammars that take over once the model starts a call on its own.
    pub lazy: Option<LazyTools>,
    /// `auto` with a `response_format`: the call objects the output may be instead of the answer.
    answer_calls: Vec<Value>,
    /// What every grammar of calls carries at its root: the argument schemas' definitions, and
    /// leniency when any tool was sent without `strict`.
    roots: CallRoots,
    /// `auto` with a `response_format`: the grammars of a call the model starts on its own,
    /// for an engine that lets the model choose between answer and call (`answer_gate`).
    answer_lazy: Option<LazyTools>,
}

impl ToolPlan {
    pub(crate) fn from_request(chat: &ValidatedChat) -> Result<Option<Self>, ApiError> {
        let offered = match &chat.tools {
            Some(t) if !t.is_empty() => t,
            _ => return Ok(None),
        };
        let tools: Vec<Value> = offered.iter().map(|t| t.definition.clone()).collect();
        let names: Vec<String> = offered.iter().map(|t| t.name.clone()).collect();
        let mut schemas: Vec<Value> = offered
            .iter()
            .map(|t| {
                // No `parameters` is a function that takes none, as OpenAI reads it: `{}`.
                let mut schema = t.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
                close_objects(&mut schema);
                schema
            })
            .collect();
        let roots = CallRoots { defs: hoist_definitions(&mut schemas), lenient: offered.iter().any(|t| !t.strict) };
        let call_of = |i: usize| call_schema(&names[i], &schemas[i]);
        let rooted = |root: Value| Constraint::JsonSchema(roots.root(root));
        let (parse, forced, forced_names) = match &chat.tool_choice {
            None | Some(ToolChoice::Auto) => (true, None, Vec::new()),
            Some(ToolChoice::None) => (false, None, Vec::new()),
            Some(ToolChoice::Required) => {
                let any: Vec<Value> = (0..names.len()).map(call_of).collect();
                (true, Some(rooted(json!({"anyOf": any}))), names.clone())
            }
            Some(ToolChoice::Function(name)) => {
                // Parsing refuses a name that is not offered; a request built in code gets the
                // same refusal.
                let i = names.iter().position(|n| n == name).ok_or_else(|| tool_choice_not_offered(name))?;
                (true, Some(rooted(call_of(i))), vec![name.clone()])
            }
        };
        let has_format = chat.response_format.as_ref().is_some_and(ResponseFormat::is_json);
        if forced.is_some() && has_format {
            return Err(ApiError::invalid_value(
                "response_format",
                "'response_format' cannot be combined with a 'tool_choice' that forces a tool call.",
            ));
        }
        let single = chat.parallel_tool_calls == Some(false);
        let calls: Vec<Value> = (0..names.len()).map(call_of).collect();
        let auto = parse && forced.is_none();
        // With a response_format the output is JSON from its first token: `answer_or_call` decides
        // between answer and call, and there is no free text to watch.
        let lazy = (auto && !has_format).then(|| lazy_grammars(&calls, &names, single, &roots));
        let answer_lazy = (auto && has_format).then(|| lazy_grammars(&calls, &names, single, &roots));
        let answer_calls = if auto && has_format { calls } else { Vec::new() };
        Ok(Some(Self { tools, names, parse, forced, forced_names, single, lazy, answer_calls, answer_lazy, roots }))
    }

    /// Whether the whole output's grammar comes from the tools (a forced call, or the
    /// answer-or-call union), so its schema errors name `tools`.
    pub(crate) fn shapes_output(&self) -> bool {
        self.forced.is_some() || !self.answer_calls.is_empty()
    }

    /// The engine's tool grammars: `auto`'s lazy ones; with a `response_format`, those of a call
    /// the model may start instead of answering (the engine uses them on a model with a
    /// `<tool_call>` token, and the answer-or-call union on others).
    pub(crate) fn engine_lazy(&self) -> Option<LazyTools> {
        self.lazy.clone().or_else(|| self.answer_lazy.clone())
    }

    /// Whether a `response_format` beside these tools makes the output the answer-or-call
    /// union (`auto`, not forced).
    pub(crate) fn answers_or_calls(&self) -> bool {
        self.forced.is_none() && !self.answer_calls.is_empty()
    }

    /// The grammar of the whole output, given the `response_format`'s: a forced call's, the
    /// answer-or-call union under `auto`, or the `response_format`'s own.
    pub(crate) fn constraint(&self, response_format: Option<Constraint>) -> Option<Constraint> {
        if let Some(forced) = &self.forced {
            return Some(forced.clone());
        }
        match response_format {
            Some(answer) if !self.answer_calls.is_empty() => {
                Some(answer_or_call(answer, &self.answer_calls, &self.roots))
            }
            other => other,
        }
    }

    /// The incremental reader of this request's output: calls the engine samples under the
    /// strict call grammar (forced, or after `<tool_call>`) stream their arguments as written.
    pub(crate) fn streamer(&self) -> ToolCallStreamer {
        let streamer = ToolCallStreamer::new(&self.known());
        if self.forced.is_some() {
            streamer.stream_arguments(true).forced_to(&self.callable())
        } else if self.lazy.is_some() {
            streamer.stream_arguments(false)
        } else {
            streamer
        }
    }

    pub(crate) fn known(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// The functions a forced call may name (none when the call is not forced).
    fn callable(&self) -> Vec<&str> {
        self.forced_names.iter().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::deltas::ChatDeltas;
    use gantry_api::{ChatAnswer, ToolCall};
    use gantry_engine::{Event, FinishReason, Usage};

    /// What a collected answer says for `text` ended by `reason`, `(content, tool_calls)`: the
    /// server's reader (fed the text in small pieces, as the engine sends it) and its fold.
    fn read(plan: &ToolPlan, text: &str, reason: FinishReason) -> (Option<String>, Option<Vec<ToolCall>>) {
        let mut reader = ChatDeltas::new(false, Vec::new()).with_tools(Some(plan.clone()).filter(|p| p.parse), 1);
        let mut answer = ChatAnswer::new(1, false);
        let chars: Vec<char> = text.chars().collect();
        let mut events: Vec<Event> = chars
            .chunks(3)
            .map(|piece| Event::Delta { choice: 0, text: piece.iter().collect(), logprobs: Vec::new() })
            .collect();
        events.extend([Event::Finished { choice: 0, reason }, Event::Done(Usage::default())]);
        for delta in events.into_iter().flat_map(|e| reader.on_event(e)) {
            answer.take(delta).unwrap();
        }
        let (mut choices, _) = answer.into_choices();
        let message = choices.remove(0).message;
        (message.content, message.tool_calls)
    }

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
        let (content, calls) =
            read(&plan, r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#, FinishReason::Stop);
        assert_eq!(content, None);
        let calls = calls.unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert!(calls[0].id.starts_with("call_"));
    }

    #[test]
    fn the_auto_grammars_compile_the_fence_after_prose_one_included() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        tiny_gguf::write_tiny_model(&path, &tiny_gguf::TinyModelSpec::default()).unwrap();
        let model = gantry_engine::LoadedModel::load(&path, None, 1, &gantry_engine::Offload::default()).unwrap();
        for extra in [json!({}), json!({"parallel_tool_calls": false})] {
            let lazy = ToolPlan::from_request(&chat(extra)).unwrap().unwrap().lazy.unwrap();
            let fenced =
                |prefix| Constraint::Lark(gantry_engine::tools::fenced_grammar(&lazy.fenced_calls_rules, prefix));
            let from_fence = Constraint::Lark(gantry_engine::tools::fenced_call_grammar(&lazy.fenced_calls_rules));
            for c in [&lazy.bare, &lazy.tagged, &from_fence, &fenced(""), &fenced("Sure: \"x\"\n")] {
                model.check_constraint(c).unwrap_or_else(|e| panic!("{e}: {c:?}"));
            }
        }
    }

    #[test]
    fn none_leaves_text_alone() {
        let plan = ToolPlan::from_request(&chat(json!({"tool_choice": "none"}))).unwrap().unwrap();
        let text = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#.to_string();
        assert_eq!(read(&plan, &text, FinishReason::Stop), (Some(text), None));
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
    fn argument_schemas_are_closed_unless_they_say_otherwise() {
        let mut schema = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "extra": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": true},
            "free": {"type": "object"}
        }});
        close_objects(&mut schema);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["where"]["additionalProperties"], false);
        assert_eq!(schema["properties"]["tags"]["items"]["additionalProperties"], false);
        assert_eq!(schema["properties"]["extra"]["additionalProperties"], true);
        assert!(schema["properties"]["free"].get("additionalProperties").is_none());
        let plan = ToolPlan::from_request(&chat(json!({"tool_choice": "required"}))).unwrap().unwrap();
        let Some(Constraint::JsonSchema(s)) = plan.forced else { panic!() };
        assert_eq!(s["anyOf"][0]["properties"]["arguments"]["additionalProperties"], false);
    }

    #[test]
    fn auto_with_a_response_format_is_answer_or_call_and_watches_nothing() {
        let answer =
            json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}});
        let format =
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": answer}}});
        let plan = ToolPlan::from_request(&chat(format)).unwrap().unwrap();
        assert!(plan.lazy.is_none());
        let Some(Constraint::JsonSchema(s)) = plan.constraint(Some(Constraint::JsonSchema(answer))) else { panic!() };
        assert_eq!(s["$defs"]["P"]["type"], "integer");
        let any = s["anyOf"].as_array().unwrap();
        assert_eq!(any.len(), 3);
        assert_eq!(any[0]["properties"]["p"]["$ref"], "#/$defs/P");
        assert_eq!(any[1]["properties"]["name"]["const"], "get_weather");
        // Without a response_format, the watch is on and the output free.
        let plan = ToolPlan::from_request(&chat(json!({}))).unwrap().unwrap();
        assert!(plan.lazy.is_some() && plan.constraint(None).is_none());
    }

    #[test]
    fn a_call_cut_by_max_tokens_is_read_with_its_partial_arguments() {
        let plan = ToolPlan::from_request(&chat(json!({}))).unwrap().unwrap();
        let cut = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
        let (content, calls) = read(&plan, cut, FinishReason::Length);
        assert_eq!(content, None);
        let calls = calls.unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, "{\"city\":\"Par");
        // Prose cut by max_tokens stays prose.
        let (content, calls) = read(&plan, "The weather in Par", FinishReason::Length);
        assert_eq!((content.as_deref(), calls), (Some("The weather in Par"), None));
    }

    #[test]
    fn a_forced_call_cut_before_its_name_closed_is_still_the_call() {
        let cut = r#"{"name": "get_weat"#;
        for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_weather"}})] {
            let plan = ToolPlan::from_request(&chat(json!({"tool_choice": choice}))).unwrap().unwrap();
            let (content, calls) = read(&plan, cut, FinishReason::Length);
            assert_eq!(content, None, "{choice}");
            let calls = calls.unwrap();
            assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", ""));
        }
        // Streamed: the same call at the end, and no content.
        let plan = ToolPlan::from_request(&chat(json!({"tool_choice": "required"}))).unwrap().unwrap();
        let mut streamer = plan.streamer();
        let mut pieces = streamer.push(cut);
        pieces.extend(streamer.finish_cut());
        assert_eq!(
            pieces,
            vec![gantry_engine::tools::StreamPiece::Call {
                index: 0,
                name: "get_weather".into(),
                arguments: String::new()
            }]
        );
        // Not forced, the same text is content, as prose cut short would be.
        let plan = ToolPlan::from_request(&chat(json!({}))).unwrap().unwrap();
        assert_eq!(read(&plan, cut, FinishReason::Length), (Some(cut.to_string()), None));
    }

    #[test]
    fn parallel_false_keeps_one_call() {
        let plan = ToolPlan::from_request(&chat(json!({"parallel_tool_calls": false}))).unwrap().unwrap();
        let text = r#"[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]"#;
        assert_eq!(read(&plan, text, FinishReason::Stop).1.unwrap().len(), 1);
    }
}
