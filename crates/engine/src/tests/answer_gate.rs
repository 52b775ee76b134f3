//! `auto` tools beside a `response_format`, on a model with a `<tool_call>` token (tiny, random
//! weights, a template that prints the tools): the model's own first pick decides between answer and call, a held output that
//! turns out to be no call is dropped unbilled and the answer restarts under its format.

use serde_json::{json, Value};

use crate::tests::engine::{drain, eos, start_on};
use crate::tests::typed_text::tagged_model;
use crate::tools::{answer_or_call, call_schema, lazy_grammars};
use crate::{ChatInput, Constraint, Engine, Event, Generator, SamplingParams};

fn start() -> Engine {
    start_on(tagged_model(), 512, 1)
}

fn answer_schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
           "additionalProperties": false})
}

/// The request the server makes of "auto" tools (one function) with a json_schema format, the
/// model's first token pushed towards `first` by a logit bias.
fn gated(engine: &Engine, first: i32) -> ChatInput {
    let args = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let calls = vec![call_schema("get_weather", &args)];
    let names = vec!["get_weather".to_string()];
    let answer = Constraint::JsonSchema(answer_schema());
    let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": args}});
    ChatInput {
        messages: vec![json!({"role": "user", "content": "hello there"})],
        tools: Some(vec![tool]),
        n: 1,
        max_tokens: Some(48),
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            logit_bias: vec![(first, 100.0), (eos(engine), -100.0)],
            ..SamplingParams::default()
        },
        logprobs: Some(0),
        constraint: Some((answer_or_call(answer.clone(), &calls, &Default::default()), "response_format")),
        lazy_tools: Some(lazy_grammars(&calls, &names, false, &Default::default())),
        answer_constraint: Some(answer),
        cache_scope: crate::CacheScope::default(),
        thinking: Default::default(),
    }
}

/// The text streamed, the logprobs entries streamed, and the completion tokens billed.
async fn run(engine: &Engine, input: ChatInput) -> (String, usize, u32) {
    let (events, usage) = drain(engine.submit(engine.prepare(input).unwrap()).unwrap()).await;
    let (mut text, mut entries) = (String::new(), 0);
    for event in events {
        if let Event::Delta { text: t, logprobs, .. } = event {
            text.push_str(&t);
            entries += logprobs.len();
        }
    }
    (text, entries, usage.completion_tokens)
}

#[tokio::test]
async fn an_output_that_opens_no_call_restarts_as_the_formatted_answer() {
    let engine = start();
    // The bias makes the model's own output `{{{…`: it may open a call, is held, is no call.
    let brace = i32::from(b'{');
    let (text, entries, billed) = run(&engine, gated(&engine, brace)).await;
    assert!(!text.contains("{{"), "the held output never reaches the client: {text:?}");
    assert!(text.trim_start().starts_with('{') && text.contains("\"answer\""), "{text:?}");
    assert_eq!(billed as usize, entries, "only delivered tokens are billed");
    engine.shutdown();
}

#[tokio::test]
async fn the_tag_first_is_a_call_and_prose_first_is_the_formatted_answer() {
    let engine = start();
    let tag = engine.model().tokenize("<tool_call>");
    assert_eq!(tag.len(), 1);
    let (text, entries, billed) = run(&engine, gated(&engine, tag[0])).await;
    assert!(text.starts_with("<tool_call>") && text.contains("\"get_weather\""), "{text:?}");
    assert_eq!(billed as usize, entries);
    let (text, _, _) = run(&engine, gated(&engine, i32::from(b'H'))).await;
    assert!(text.starts_with('{') && !text.contains("get_weather"), "{text:?}");
    engine.shutdown();
}
