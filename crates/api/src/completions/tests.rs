//! `/v1/completions` and `/infill` parsing: the prompt's shapes, OpenAI's defaults and refusals.

use serde_json::json;

use super::*;

fn parse(body: serde_json::Value) -> Result<ValidatedCompletion, ApiError> {
    parse_completion_request(body.to_string().as_bytes())
}

fn refused(body: serde_json::Value) -> ApiError {
    parse(body).expect_err("refused")
}

#[test]
fn a_string_prompt_gets_openais_defaults() {
    let c = parse(json!({"model": "m", "prompt": "def f("})).unwrap();
    assert_eq!(c.prompts, vec![PromptInput::Text("def f(".into())]);
    assert_eq!(c.chat.max_tokens, Some(DEFAULT_MAX_TOKENS));
    assert_eq!(c.chat.n, 1);
    assert!(c.chat.messages.is_empty() && !c.echo && c.logprobs.is_none() && !c.is_fim());
    assert!(c.fim_stop_rule, "the FIM stop rule is on by default");
}

#[test]
fn every_prompt_shape_is_read() {
    let strings = parse(json!({"model": "m", "prompt": ["a", "b"]})).unwrap().prompts;
    assert_eq!(strings, vec![PromptInput::Text("a".into()), PromptInput::Text("b".into())]);
    let tokens = parse(json!({"model": "m", "prompt": [1, 2, 3]})).unwrap().prompts;
    assert_eq!(tokens, vec![PromptInput::Tokens(vec![1, 2, 3])]);
    let arrays = parse(json!({"model": "m", "prompt": [[1], [2, 3]]})).unwrap().prompts;
    assert_eq!(arrays, vec![PromptInput::Tokens(vec![1]), PromptInput::Tokens(vec![2, 3])]);
    for (bad, param) in [
        (json!([]), "prompt"),
        (json!(5), "prompt"),
        (json!([-1]), "prompt"),
        (json!([[1], []]), "prompt[1]"),
        (json!(["a", {"x": 1}]), "prompt[1]"),
    ] {
        let e = refused(json!({"model": "m", "prompt": bad}));
        assert_eq!(e.param.as_deref(), Some(param), "{bad}: {e:?}");
    }
    let e = refused(json!({"model": "m"}));
    assert_eq!(e.param.as_deref(), Some("prompt"));
}

#[test]
fn fields_are_validated_as_openai_does() {
    let c = parse(json!({
        "model": "m", "prompt": "x", "max_tokens": 5, "temperature": 0, "n": 2, "best_of": 2,
        "logprobs": 3, "stop": ["\n"], "seed": 7, "logit_bias": {"5": -100}, "user": "u",
        "stream": true, "stream_options": {"include_usage": true}, "suffix": "y", "fim_stop_rule": false,
    }))
    .unwrap();
    assert_eq!((c.chat.max_tokens, c.chat.n, c.logprobs), (Some(5), 2, Some(3)));
    assert!(c.chat.logprobs && c.chat.top_logprobs == 3 && c.chat.include_usage);
    assert_eq!(c.chat.stop, vec!["\n"]);
    assert_eq!(c.suffix.as_deref(), Some("y"));
    assert!(!c.fim_stop_rule && c.fim_stop().is_none());
    // An empty suffix is no FIM.
    assert!(!parse(json!({"model": "m", "prompt": "x", "suffix": ""})).unwrap().is_fim());

    for (body, param) in [
        (json!({"model": "m", "prompt": "x", "logprobs": 6}), "logprobs"),
        (json!({"model": "m", "prompt": "x", "best_of": 3}), "best_of"),
        (json!({"model": "m", "prompt": "x", "n": 2, "best_of": 3}), "best_of"),
        (json!({"model": "m", "prompt": "x", "echo": true, "logprobs": 1}), "echo"),
        (json!({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"model": "m", "prompt": "x", "max_tokens": 0}), "max_tokens"),
        (json!({"model": "m", "prompt": "x", "temperature": 3}), "temperature"),
        (json!({"model": "m", "prompt": ["a", "b"], "suffix": "y"}), "suffix"),
        (json!({"model": "m", "prompt": ["a", "b"], "n": 65}), "n"),
    ] {
        let e = refused(body.clone());
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        assert_eq!(e.status, 400);
    }
}

#[test]
fn response_format_tools_and_unknown_fields_are_refused_by_name() {
    for field in ["response_format", "tools", "tool_choice", "messages", "frobnicate"] {
        let e = refused(json!({"model": "m", "prompt": "x", field: {"type": "json_object"}}));
        assert_eq!(e.param.as_deref(), Some(field));
        assert_eq!(e.message, format!("Unrecognized request argument supplied: {field}"));
    }
    // null is absent.
    assert!(parse(json!({"model": "m", "prompt": "x", "tools": null})).is_ok());
}

#[test]
fn the_fim_stop_rule_reads_the_prompt_as_the_prefix() {
    let c = parse(json!({"model": "m", "prompt": "def f():\n", "suffix": "    return 1\n"})).unwrap();
    let rule = c.fim_stop().unwrap();
    assert_eq!(rule.stops[0], "\n    return 1");
    assert_eq!(rule.tail, "\n");
    // The prompt's `def` line opens the block: a line starting at its indentation left it.
    assert!(rule.stops.contains(&"\n#".to_string()) && rule.stops.contains(&"\nd".to_string()));
}

#[test]
fn an_infill_request_as_llama_vim_sends_it() {
    let body = json!({
        "input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n",
        "input_extra": [{"text": "x = 1\n", "time": 3, "filename": "other.py"}, {"text": "y"}],
        "prompt": "    return ", "n_predict": 128, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": false,
        "samplers": ["top_k", "top_p", "infill"], "cache_prompt": true, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    });
    let c = parse_infill_request(body.to_string().as_bytes()).unwrap();
    assert_eq!(c.chat.model, "", "no model: the server's default");
    assert_eq!(c.prompts, vec![PromptInput::Text("def add(a, b):\n    return ".into())]);
    assert_eq!(c.suffix.as_deref(), Some("\n\nprint(add(1, 2))\n"));
    assert_eq!(c.extra[0], ExtraFile { filename: "other.py".into(), text: "x = 1\n".into() });
    assert_eq!(c.extra[1].filename, "tmp");
    assert_eq!((c.chat.max_tokens, c.chat.top_k, c.chat.n), (Some(128), Some(40), 1));

    // n_predict -1 (or none) runs to the context's end; llama.vim's warm-up has empty parts.
    let warm = json!({"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_predict": -1});
    let c = parse_infill_request(warm.to_string().as_bytes()).unwrap();
    assert_eq!((c.chat.max_tokens, c.suffix.as_deref()), (None, Some("")));
    let named = json!({"model": "qwen", "input_prefix": "a"});
    assert_eq!(parse_infill_request(named.to_string().as_bytes()).unwrap().chat.model, "qwen");

    let bad = json!({"input_prefix": "a", "input_extra": [{"filename": "f"}]});
    let e = parse_infill_request(bad.to_string().as_bytes()).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input_extra[0].text"));
    let bad = json!({"input_prefix": 5});
    assert_eq!(parse_infill_request(bad.to_string().as_bytes()).unwrap_err().param.as_deref(), Some("input_prefix"));
}

#[test]
fn infill_n_probs_asks_for_each_tokens_alternatives() {
    let parse = |extra: serde_json::Value| {
        let mut body = json!({"input_prefix": "a"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        parse_infill_request(body.to_string().as_bytes())
    };
    assert_eq!(parse(json!({})).unwrap().logprobs, None);
    assert_eq!(parse(json!({"n_probs": 0})).unwrap().logprobs, None, "0: none, as llama.cpp");
    assert_eq!(parse(json!({"n_probs": 5, "post_sampling_probs": false})).unwrap().logprobs, Some(5));
    for (bad, param) in [
        (json!({"n_probs": 21}), "n_probs"),
        (json!({"n_probs": "3"}), "n_probs"),
        (json!({"n_probs": 3, "post_sampling_probs": true}), "post_sampling_probs"),
    ] {
        assert_eq!(parse(bad.clone()).unwrap_err().param.as_deref(), Some(param), "{bad}");
    }
}
