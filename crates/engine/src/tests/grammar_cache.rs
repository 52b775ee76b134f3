//! Grammars compile in `prepare`, off the scheduler thread, once per source: the cache, the
//! hand-over to the scheduler, and the order of the checks. On the tiny random-weight model.

use serde_json::{json, Value};

use crate::tests::engine::{drain, eos, input, start};
use crate::tools::fenced_grammar;
use crate::{ChatInput, Constraint, Event, Generator, LazyTools, PrepareError};

fn schema() -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false})
}

fn constrained(schema: Value, max_tokens: u32) -> ChatInput {
    let mut i = input(max_tokens, vec![(9, -100.0), (10, -100.0), (32, -100.0)]);
    i.logprobs = None;
    i.constraint = Some((Constraint::JsonSchema(schema), "response_format"));
    i
}

#[tokio::test]
async fn a_schema_compiles_once_and_its_request_still_answers_valid_json() {
    let engine = start(1, None);
    let eos = eos(&engine);
    let model = engine.model().clone();
    let before = model.grammar_compiles();
    let first = engine.prepare(constrained(schema(), 60)).unwrap();
    assert!(first.grammars.output.is_some(), "prepare hands the compiled grammar over");
    assert_eq!(model.grammar_compiles(), before + 1);
    // The same schema, even built again: served from the cache.
    let again = engine.prepare(constrained(schema(), 60)).unwrap();
    assert_eq!(model.grammar_compiles(), before + 1, "the same schema is not compiled again");
    let mut other = schema();
    other["properties"]["ok"]["type"] = json!("integer");
    engine.prepare(constrained(other, 60)).unwrap();
    assert_eq!(model.grammar_compiles(), before + 2, "another schema is");

    // Admitting the requests to a slot compiles nothing: each instantiates its grammar.
    let compiles = model.grammar_compiles();
    for request in [first, again] {
        let (events, _) = drain(engine.submit(request).unwrap()).await;
        let text: String = events
            .iter()
            .filter_map(|e| if let Event::Delta { text, .. } = e { Some(text.as_str()) } else { None })
            .collect();
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(doc["ok"].is_boolean(), "{text}");
        assert_eq!(doc.as_object().unwrap().len(), 1, "{text}");
    }
    assert_eq!(model.grammar_compiles(), compiles, "the scheduler compiled a grammar");
    let _ = eos;
    engine.shutdown();
}

#[tokio::test]
async fn a_schema_compiled_for_one_cache_scope_is_compiled_again_for_another() {
    let engine = start(1, None);
    let model = engine.model().clone();
    let scoped = |scope: u64| ChatInput { cache_scope: crate::CacheScope(scope), ..constrained(schema(), 8) };
    let before = model.grammar_compiles();
    engine.prepare(scoped(1)).unwrap();
    engine.prepare(scoped(1)).unwrap();
    assert_eq!(model.grammar_compiles(), before + 1, "one scope reuses its compiled grammar");
    // A cache hit is faster than a compile: another tenant must not time what was used.
    engine.prepare(scoped(2)).unwrap();
    assert_eq!(model.grammar_compiles(), before + 2, "another scope compiles its own");
    engine.shutdown();
}

#[tokio::test]
async fn the_context_is_checked_before_any_grammar_compiles() {
    let engine = start(1, None);
    let model = engine.model().clone();
    // A schema llguidance refuses: a reference to nothing.
    let broken = json!({"$ref": "#/$defs/missing"});
    let e = engine.prepare(constrained(broken.clone(), 8)).unwrap_err();
    assert!(matches!(e, PrepareError::Grammar { param: "response_format", .. }), "{e:?}");
    let before = model.grammar_compiles();
    let e = engine.prepare(constrained(broken, 10_000)).unwrap_err();
    assert!(matches!(e, PrepareError::ContextLength { limit: 256, .. }), "{e:?}");
    assert_eq!(model.grammar_compiles(), before, "a request that cannot fit compiled a grammar");
    engine.shutdown();
}

#[tokio::test]
async fn lazy_tool_grammars_are_compiled_by_prepare() {
    let engine = start(1, None);
    let call = r#"%json {"type": "object", "properties": {"name": {"const": "f"}}, "required": ["name"]}"#;
    let mut i = input(8, vec![]);
    i.lazy_tools = Some(LazyTools {
        bare: Constraint::Lark(format!("start: {call}")),
        tagged: Constraint::Lark(format!("start: {call} \"</tool_call>\"")),
        fenced_calls_rules: format!("fenced_calls: \"```json\\n\" {call} \"\\n```\"\n"),
        names: vec!["f".into()],
    });
    assert!(fenced_grammar(&i.lazy_tools.as_ref().unwrap().fenced_calls_rules, "").contains("fenced_calls"));
    let request = engine.prepare(i).unwrap();
    assert!(request.grammars.bare_call.is_some() && request.grammars.tagged_call.is_some());
    assert!(request.grammars.output.is_none());
    engine.shutdown();
}

/// Some grammars start, then fail at a later token (llguidance's limits on one step's work:
/// an object of hundreds of optional properties, nested where the first steps do not reach).
/// The request ends with an error saying so, never going on without its constraint.
#[tokio::test]
async fn a_grammar_that_fails_mid_output_ends_its_request_with_an_error() {
    let engine = start(1, None);
    let wide = json!({"type": "object", "properties": wide_properties(), "additionalProperties": false});
    let nested =
        json!({"type": "object", "properties": {"inner": wide}, "required": ["inner"], "additionalProperties": false});
    let (events, usage) = drain(engine.submit(engine.prepare(constrained(nested, 30)).unwrap()).unwrap()).await;
    let text: String = events
        .iter()
        .filter_map(|e| if let Event::Delta { text, .. } = e { Some(text.as_str()) } else { None })
        .collect();
    let errors: Vec<String> =
        events.iter().filter_map(|e| if let Event::Error(e) = e { Some(e.to_string()) } else { None }).collect();
    assert_eq!(errors.len(), 1, "{text:?} {errors:?}");
    assert!(errors[0].contains("grammar") && errors[0].contains("max is 2000"), "{errors:?}");
    assert!(!errors[0].contains('\n'), "the reason's first line only: {errors:?}");
    // What came out before the failure is the grammar's.
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(r#"{"inner":{"#.starts_with(&compact), "{text:?}");
    assert_eq!(usage.outcome, crate::Outcome::Error);
    engine.shutdown();
}

fn wide_properties() -> serde_json::Map<String, Value> {
    (0..600).map(|i| (format!("field_{i}"), json!({"type": "string"}))).collect()
}

/// Some grammars compile, then fail at their first tokens (an object of hundreds of optional
/// properties, after its `{`). They are refused in `prepare`, as a client's schema error.
#[tokio::test]
async fn a_grammar_that_fails_at_its_first_tokens_is_refused_in_prepare() {
    let engine = start(1, None);
    let wide = json!({"type": "object", "properties": wide_properties(), "additionalProperties": false});
    match engine.prepare(constrained(wide, 8)) {
        Err(PrepareError::Grammar { reason, .. }) => assert!(reason.contains("max is 2000"), "{reason}"),
        other => panic!("expected a grammar refusal, got {:?}", other.map(|_| "a prepared request")),
    }
    engine.shutdown();
}

/// The widest object a schema within the size limit can spell (thousands of one-letter
/// properties) compiles on a deep stack: on a tokio or test thread's 2 MiB, llguidance's
/// compiler overflowed it and aborted the whole server.
#[tokio::test]
async fn the_widest_schema_within_the_size_limit_is_refused_not_a_crash() {
    let engine = start(1, None);
    let properties: serde_json::Map<String, Value> = (0..11_000).map(|i| (format!("f{i}"), json!({}))).collect();
    let wide = json!({"type": "object", "properties": properties, "additionalProperties": false});
    assert!(wide.to_string().len() < 128 * 1024);
    assert!(matches!(engine.prepare(constrained(wide, 8)), Err(PrepareError::Grammar { .. })));
    engine.shutdown();
}
