//! Recorded-looking outputs of every format, good and broken, checked for the parse result and
//! for the streamer giving the same result under any chunking.

use super::*;

const KNOWN: &[&str] = &["get_weather", "search", "calculate"];

/// (name, model output, expected content, expected calls as (name, compact arguments)).
type Fixture = (&'static str, &'static str, Option<&'static str>, &'static [(&'static str, &'static str)]);

const PARIS: (&str, &str) = ("get_weather", r#"{"city":"Paris"}"#);
const RUST: (&str, &str) = ("search", r#"{"query":"rust"}"#);

const FIXTURES: &[Fixture] = &[
    // Qwen / Hermes tags.
    ("qwen_single", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", None, &[PARIS]),
    ("qwen_multiple", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n</tool_call>", None, &[PARIS, RUST]),
    ("qwen_text_before", "Let me check the weather for you.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", Some("Let me check the weather for you."), &[PARIS]),
    ("qwen_text_after", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\nDone.", Some("Done."), &[PARIS]),
    ("qwen_missing_close_at_end", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n", None, &[PARIS]),
    ("qwen_missing_close_between", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n</tool_call>", None, &[PARIS, RUST]),
    ("qwen_extra_brace", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}\n</tool_call>", None, &[PARIS]),
    ("qwen_args_as_string", "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"rust\\\"}\"}\n</tool_call>", None, &[RUST]),
    ("qwen_unknown_function", "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {\"count\": 3}}\n</tool_call>", Some("<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {\"count\": 3}}\n</tool_call>"), &[]),
    ("qwen_truncated", "I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", Some("I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"), &[]),
    ("qwen_python_dict", "<tool_call>\n{'name': 'get_weather', 'arguments': {'city': 'Paris'}}\n</tool_call>", Some("<tool_call>\n{'name': 'get_weather', 'arguments': {'city': 'Paris'}}\n</tool_call>"), &[]),
    ("qwen_one_good_one_broken", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": ", Some("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\":"), &[PARIS]),
    ("nested_braces_in_strings", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"fn main() { println!(\\\"}}{{\\\"); } [x]\"}}\n</tool_call>", None, &[("search", r#"{"query":"fn main() { println!(\"}}{{\"); } [x]"}"#)]),
    ("unicode", "Voyons la météo 🌦️\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"São Paulo\", \"note\": \"東京 \\u00e9\"}}\n</tool_call>", Some("Voyons la météo 🌦️"), &[("get_weather", r#"{"city":"São Paulo","note":"東京 \u00e9"}"#)]),
    // Bare JSON (Qwen2.5-Coder's favourite).
    ("bare_object", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", None, &[PARIS]),
    ("bare_with_whitespace", "\n\n  {\"name\": \"get_weather\",\n   \"arguments\": {\"city\": \"Paris\"}}\n", None, &[PARIS]),
    ("bare_array", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}]", None, &[PARIS, RUST]),
    ("bare_two_objects", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}", None, &[PARIS, RUST]),
    ("bare_args_string", "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}", None, &[PARIS]),
    ("bare_openai_shape", "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"rust\\\"}\"}}", None, &[RUST]),
    ("bare_openai_array", "[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]", None, &[PARIS]),
    ("bare_key_order_kept", "{\"name\": \"search\", \"arguments\": {\"query\": \"rust\", \"limit\": 5, \"after\": null, \"tags\": [\"a\", \"b\"]}}", None, &[("search", r#"{"query":"rust","limit":5,"after":null,"tags":["a","b"]}"#)]),
    // Qwen2.5's template shows the call format with doubled braces; its models copy them.
    ("bare_doubled_braces", "{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}", None, &[PARIS]),
    ("fenced_doubled_braces", "```json\n{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}\n```", None, &[PARIS]),
    ("bare_doubled_not_closed_twice", "{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} x", Some("{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} x"), &[]),
    ("bare_doubled_echo_with_result", "{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"result\": 1}}", Some("{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"result\": 1}}"), &[]),
    ("bare_in_prose", "Sure! You can call {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} to get it.", Some("Sure! You can call {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} to get it."), &[]),
    ("bare_then_prose", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} I will now check.", Some("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} I will now check."), &[]),
    ("bare_unknown", "{\"name\": \"delete_everything\", \"arguments\": {}}", Some("{\"name\": \"delete_everything\", \"arguments\": {}}"), &[]),
    ("bare_array_one_unknown", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"format_disk\", \"arguments\": {}}]", Some("[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"format_disk\", \"arguments\": {}}]"), &[]),
    ("bare_call_echo_with_result", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"result\": \"sunny\"}", Some("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"result\": \"sunny\"}"), &[]),
    ("bare_array_one_with_extra_key", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}, \"id\": 2}]", Some("[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}, \"id\": 2}]"), &[]),
    ("bare_openai_shape_extra_key", "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"arguments\": {}}, \"output\": 1}", Some("{\"type\": \"function\", \"function\": {\"name\": \"search\", \"arguments\": {}}, \"output\": 1}"), &[]),
    ("bare_not_a_call", "{\"city\": \"Paris\", \"temperature\": 21}", Some("{\"city\": \"Paris\", \"temperature\": 21}"), &[]),
    ("bare_missing_arguments", "{\"name\": \"search\"}", Some("{\"name\": \"search\"}"), &[]),
    ("bare_args_not_object", "{\"name\": \"search\", \"arguments\": [1, 2]}", Some("{\"name\": \"search\", \"arguments\": [1, 2]}"), &[]),
    ("bare_truncated", "{\"name\": \"get_weather\", \"arguments\": {\"city\": ", Some("{\"name\": \"get_weather\", \"arguments\": {\"city\":"), &[]),
    ("citation_list", "[1] Paris is the capital.\n[2] It rains.", Some("[1] Paris is the capital.\n[2] It rains."), &[]),
    ("markdown_link", "[docs](https://example.com) say {hi}", Some("[docs](https://example.com) say {hi}"), &[]),
    // Fenced JSON.
    ("fenced_json", "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```", None, &[PARIS]),
    ("fenced_plain_text_before", "I'll look that up.\n```\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```", Some("I'll look that up."), &[PARIS]),
    ("fenced_text_around", "Calling:\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```\nLet me know.", Some("Calling:\n\nLet me know."), &[PARIS]),
    ("fenced_array", "```json\n[\n  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}},\n  {\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n]\n```", None, &[PARIS, RUST]),
    ("fenced_two_objects", "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n```", None, &[PARIS, RUST]),
    ("fenced_missing_close", "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n", None, &[PARIS]),
    ("fenced_python_code", "```python\nprint({\"name\": \"get_weather\"})\n```", Some("```python\nprint({\"name\": \"get_weather\"})\n```"), &[]),
    ("fenced_call_echo_with_result", "```json\n{\"name\": \"calculate\", \"arguments\": {\"a\": 17, \"b\": 25}, \"result\": 42}\n```", Some("```json\n{\"name\": \"calculate\", \"arguments\": {\"a\": 17, \"b\": 25}, \"result\": 42}\n```"), &[]),
    ("qwen_call_with_extra_key", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}, \"result\": 1}\n</tool_call>", Some("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}, \"result\": 1}\n</tool_call>"), &[]),
    ("fenced_not_a_call", "Here is JSON:\n```json\n{\"city\": \"Paris\"}\n```", Some("Here is JSON:\n```json\n{\"city\": \"Paris\"}\n```"), &[]),
    ("fenced_call_and_prose_inside", "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\nthat's it\n```", Some("```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\nthat's it\n```"), &[]),
    ("fenced_truncated", "```json\n{\"name\": \"get_weather\", \"arguments\": {\"ci", Some("```json\n{\"name\": \"get_weather\", \"arguments\": {\"ci"), &[]),
    ("inline_code", "Use `x` and ``y`` here.", Some("Use `x` and ``y`` here."), &[]),
    // Llama 3.
    ("llama_python_tag", "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"rust\"}}", None, &[RUST]),
    ("llama_python_tag_multi", "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"search\", \"parameters\": {\"query\": \"rust\"}};", None, &[PARIS, RUST]),
    ("llama_python_code", "<|python_tag|>print(2 + 2)", Some("<|python_tag|>print(2 + 2)"), &[]),
    ("llama_plain_parameters", "{\"name\": \"calculate\", \"parameters\": {\"expression\": \"2 * (3 + 4)\", \"precision\": -1.5e3, \"n\": -7}}", None, &[("calculate", r#"{"expression":"2 * (3 + 4)","precision":-1.5e3,"n":-7}"#)]),
    ("llama_function_tag", "<function=get_weather>{\"city\": \"Paris\"}</function>", None, &[PARIS]),
    ("llama_function_tag_text", "Looking it up. <function=search>{\"query\": \"rust\"}</function> One moment.", Some("Looking it up.  One moment."), &[RUST]),
    ("llama_function_unknown", "<function=rm_rf>{\"path\": \"/\"}</function>", Some("<function=rm_rf>{\"path\": \"/\"}</function>"), &[]),
    ("llama_function_broken", "<function=get_weather>{city: Paris}</function>", Some("<function=get_weather>{city: Paris}</function>"), &[]),
    // Mistral.
    ("mistral_array", "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}]", None, &[PARIS, RUST]),
    ("mistral_no_space", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", None, &[PARIS]),
    ("mistral_args_form", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", None, &[PARIS]),
    ("mistral_args_form_multi", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]search[ARGS]{\"query\": \"rust\"}", None, &[PARIS, RUST]),
    ("mistral_call_id", "[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{\"query\": \"rust\"}", None, &[RUST]),
    ("mistral_unknown", "[TOOL_CALLS]shutdown[ARGS]{}", Some("[TOOL_CALLS]shutdown[ARGS]{}"), &[]),
    ("mistral_truncated", "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": ", Some("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\":"), &[]),
    // Plain text and edge cases.
    ("plain", "The weather in Paris is sunny, 21°C.", Some("The weather in Paris is sunny, 21°C."), &[]),
    ("near_tags", "a < b, <tools> and <function> and [TOOL] are text", Some("a < b, <tools> and <function> and [TOOL] are text"), &[]),
    ("empty", "", None, &[]),
    ("whitespace", "  \n\t ", None, &[]),
    ("tag_only", "<tool_call>", Some("<tool_call>"), &[]),
];

fn expected(fixture: &Fixture) -> ParsedOutput {
    let (_, _, content, calls) = fixture;
    ParsedOutput {
        content: content.map(str::to_string),
        calls: calls.iter().map(|(n, a)| ParsedCall { name: n.to_string(), arguments: a.to_string() }).collect(),
    }
}

/// Streams `text` in chunks of `size` characters and gathers the pieces as a `ParsedOutput`.
fn stream(text: &str, known: &[&str], size: usize) -> (ParsedOutput, Vec<StreamPiece>) {
    stream_with(ToolCallStreamer::new(known), text, size)
}

fn stream_with(mut streamer: ToolCallStreamer, text: &str, size: usize) -> (ParsedOutput, Vec<StreamPiece>) {
    let chars: Vec<char> = text.chars().collect();
    let mut pieces = Vec::new();
    for chunk in chars.chunks(size.max(1)) {
        pieces.extend(streamer.push(&chunk.iter().collect::<String>()));
    }
    pieces.extend(streamer.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in &pieces {
        match piece {
            StreamPiece::Content(c) => content.push_str(c),
            StreamPiece::Call { index, name, arguments } => {
                assert_eq!(*index, calls.len(), "call indices count from 0");
                calls.push(ParsedCall { name: name.clone(), arguments: arguments.clone() });
            }
            StreamPiece::CallStart { index, name } => {
                assert_eq!(*index, calls.len(), "call indices count from 0");
                calls.push(ParsedCall { name: name.clone(), arguments: String::new() });
            }
            StreamPiece::CallArguments { index, fragment } => {
                assert_eq!(*index + 1, calls.len(), "arguments follow their call's start");
                calls[*index].arguments.push_str(fragment);
            }
        }
    }
    (ParsedOutput { content: (!content.is_empty()).then_some(content), calls }, pieces)
}

#[test]
fn fixtures_parse_as_expected() {
    for fixture in FIXTURES {
        assert_eq!(parse_tool_calls(fixture.1, KNOWN), expected(fixture), "fixture {}", fixture.0);
    }
}

#[test]
fn streaming_matches_parsing_for_every_chunk_size() {
    for fixture in FIXTURES {
        let whole = parse_tool_calls(fixture.1, KNOWN);
        for size in [1, 2, 3, 5, 7, 16, usize::MAX] {
            // Equal concatenations: no tag or call JSON ever leaked as content.
            assert_eq!(stream(fixture.1, KNOWN, size).0, whole, "fixture {} in chunks of {size}", fixture.0);
        }
    }
}

#[test]
fn streaming_concatenations_of_fixtures_match_parsing() {
    // Pairs of fixtures joined by prose exercise content between and around calls.
    for a in FIXTURES {
        for b in FIXTURES.iter().step_by(3) {
            let text = format!("{}\nand then\n{}", a.1, b.1);
            let whole = parse_tool_calls(&text, KNOWN);
            for size in [1, 4, usize::MAX] {
                assert_eq!(stream(&text, KNOWN, size).0, whole, "{} + {} in chunks of {size}", a.0, b.0);
            }
        }
    }
}

#[test]
fn every_prefix_streams_like_it_parses() {
    // A truncated generation (max_tokens) must also agree: each prefix is a text of its own.
    for fixture in FIXTURES {
        let bounds: Vec<usize> = fixture.1.char_indices().map(|(i, _)| i).collect();
        for &end in &bounds {
            let text = &fixture.1[..end];
            assert_eq!(stream(text, KNOWN, 2).0, parse_tool_calls(text, KNOWN), "{} cut at {end}", fixture.0);
        }
    }
}

#[test]
fn unknown_everything_without_tools() {
    for fixture in FIXTURES {
        let parsed = parse_tool_calls(fixture.1, &[]);
        assert!(parsed.calls.is_empty());
        let trimmed = fixture.1.trim();
        assert_eq!(parsed.content.as_deref(), (!trimmed.is_empty()).then_some(trimmed), "{}", fixture.0);
        assert_eq!(stream(fixture.1, &[], 3).0, parsed, "{}", fixture.0);
    }
}

#[test]
fn tagged_calls_stream_before_the_text_ends() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n";
    let mut streamer = ToolCallStreamer::new(KNOWN);
    let pieces = streamer.push(text);
    assert_eq!(
        pieces,
        vec![StreamPiece::Call { index: 0, name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]
    );
    let fenced = "Sure.\n```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n```";
    let mut streamer = ToolCallStreamer::new(KNOWN);
    let pieces = streamer.push(fenced);
    assert_eq!(pieces.len(), 2, "{pieces:?}");
    assert!(matches!(&pieces[1], StreamPiece::Call { name, .. } if name == "search"));
}

/// Fixtures whose every `<tool_call>` holds a well-formed call: what the call grammar lets through.
const CONSTRAINED_TAGGED: &[&str] = &[
    "qwen_single",
    "qwen_multiple",
    "qwen_text_before",
    "qwen_text_after",
    "qwen_missing_close_at_end",
    "qwen_missing_close_between",
    "qwen_extra_brace",
    "nested_braces_in_strings",
    "unicode",
    "plain",
    "tag_only",
];

#[test]
fn tagged_call_arguments_stream_as_written_and_add_up_to_the_parse() {
    for fixture in FIXTURES.iter().filter(|f| CONSTRAINED_TAGGED.contains(&f.0)) {
        let whole = parse_tool_calls(fixture.1, KNOWN);
        for size in [1, 2, 3, 7, usize::MAX] {
            let (got, pieces) = stream_with(ToolCallStreamer::new(KNOWN).stream_arguments(false), fixture.1, size);
            assert_eq!(got, whole, "fixture {} in chunks of {size}", fixture.0);
            if size == 1 && !whole.calls.is_empty() {
                // Name first, then the arguments a few characters at a time, not in one piece.
                assert!(
                    matches!(
                        pieces.iter().find(|p| !matches!(p, StreamPiece::Content(_))),
                        Some(StreamPiece::CallStart { .. })
                    ),
                    "{pieces:?}"
                );
                let fragments = pieces.iter().filter(|p| matches!(p, StreamPiece::CallArguments { .. })).count();
                assert!(fragments >= 5, "fixture {}: {fragments} fragments", fixture.0);
            }
        }
    }
}

#[test]
fn forced_call_arguments_stream_and_a_cut_call_keeps_what_was_written() {
    let text = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"São Paulo\", \"days\": [1, 2]}}";
    let whole = parse_tool_calls(text, KNOWN);
    for size in [1, 4, usize::MAX] {
        let (got, _) = stream_with(ToolCallStreamer::new(KNOWN).stream_arguments(true), text, size);
        assert_eq!(got, whole, "chunks of {size}");
    }
    let cut = &text[..text.find("Paulo").unwrap()];
    let mut streamer = ToolCallStreamer::new(KNOWN).stream_arguments(true);
    let mut pieces = streamer.push(cut);
    pieces.extend(streamer.finish_cut());
    let expected = ParsedOutput {
        content: None,
        calls: vec![ParsedCall { name: "get_weather".into(), arguments: r#"{"city":"São "#.into() }],
    };
    assert_eq!(parse_cut_output(cut, KNOWN), expected);
    let mut args = String::new();
    for piece in &pieces {
        match piece {
            StreamPiece::CallStart { name, .. } => assert_eq!(name, "get_weather"),
            StreamPiece::CallArguments { fragment, .. } => args.push_str(fragment),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(args, expected.calls[0].arguments);
}

#[test]
fn call_ids_look_like_openai_ids_and_differ() {
    let ids: std::collections::HashSet<String> = (0..2000).map(|_| new_call_id()).collect();
    assert_eq!(ids.len(), 2000);
    for id in &ids {
        let tail = id.strip_prefix("call_").expect("call_ prefix");
        assert_eq!(tail.len(), 24);
        assert!(tail.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    }
}
