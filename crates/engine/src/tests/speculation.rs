//! Speculative decoding on the tiny random-weight model: the output, usage and logprobs are
//! exactly those of decoding one token at a time, while draft tokens are verified and accepted.

use serde_json::json;

use crate::tests::engine::{drain, eos, logprob_entries, tiny_model};
use crate::{
    ChatInput, Engine, EngineConfig, Event, FinishReason, Generator, SamplingParams, Speculate, SpeculationConfig,
    Usage,
};

fn start(parallel: u32, mode: Speculate) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    config.ctx_size = 512;
    config.parallel = parallel;
    config.threads = Some(1);
    config.speculation = SpeculationConfig { mode, draft_max: 8 };
    Engine::start(config).unwrap()
}

/// A prompt that repeats itself, so the random model's output tends to repeat (it mostly
/// loops) and drafts copied from it get accepted.
fn input(text: &str, max_tokens: u32, sampling: SamplingParams, stop: Vec<String>, eos: i32) -> ChatInput {
    ChatInput {
        messages: vec![json!({"role": "user", "content": text})],
        tools: None,
        n: 1,
        max_tokens: Some(max_tokens),
        stop,
        // The end token is banned so every run is long enough to draft in.
        sampling: SamplingParams {
            logit_bias: [vec![(eos, -100.0)], sampling.logit_bias.clone()].concat(),
            ..sampling
        },
        logprobs: Some(1),
        constraint: None,
        lazy_tools: None,
        cache_scope: crate::CacheScope::default(),
        answer_constraint: None,
        thinking: Default::default(),
    }
}

fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, ..SamplingParams::default() }
}

#[derive(Debug, PartialEq)]
struct Output {
    text: String,
    tokens: Vec<String>,
    finish: Option<FinishReason>,
    usage: Usage,
}

fn output(events: &[Event], mut usage: Usage) -> Output {
    assert_eq!(usage.completion_tokens as usize, logprob_entries(events), "one logprobs entry per billed token");
    // What came from the prefix cache depends on what ran before on that engine, not on
    // speculation.
    usage.cached_tokens = 0;
    let mut out = Output { text: String::new(), tokens: Vec::new(), finish: None, usage };
    for e in events {
        match e {
            Event::Delta { text, logprobs, .. } => {
                out.text.push_str(text);
                out.tokens.extend(logprobs.iter().map(|l| l.token.clone()));
            }
            Event::Finished { reason, .. } => out.finish = Some(*reason),
            _ => {}
        }
    }
    out
}

/// Runs the inputs concurrently on `engine` and returns their outputs in order.
async fn run(engine: &Engine, inputs: Vec<ChatInput>) -> Vec<Output> {
    let handles: Vec<_> = inputs.into_iter().map(|i| engine.submit(engine.prepare(i).unwrap()).unwrap()).collect();
    let mut outs = Vec::new();
    for h in handles {
        let (events, usage) = drain(h).await;
        outs.push(output(&events, usage));
    }
    outs
}

const PROMPTS: [&str; 3] = [
    "one two three four five one two three four five one two three four five one two three",
    "the cat sat on the mat and the cat sat on the mat and the cat sat on the",
    "fn main() { let x = 1; let y = 2; let x = 1; let y = 2; let x = 1; let y",
];

/// Outputs of `inputs` decoded one token at a time, each alone.
async fn reference(inputs: impl Fn() -> Vec<ChatInput>) -> Vec<Output> {
    let engine = start(1, Speculate::Off);
    let mut outs = Vec::new();
    for i in inputs() {
        outs.extend(run(&engine, vec![i]).await);
    }
    assert_eq!(engine.speculation_stats().drafted(), 0, "off drafts nothing");
    engine.shutdown();
    outs
}

#[tokio::test]
async fn greedy_output_is_unchanged_alone_and_beside_other_sequences() {
    let eos = eos(&start(1, Speculate::Off));
    let inputs = || PROMPTS.iter().map(|p| input(p, 80, greedy(), vec![], eos)).collect::<Vec<_>>();
    let expected = reference(inputs).await;

    let engine = start(1, Speculate::Always);
    for (i, want) in inputs().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    let alone = engine.speculation_stats().accepted();
    assert!(alone > 0, "drafts were accepted (drafted {})", engine.speculation_stats().drafted());
    engine.shutdown();

    // Two sequences decoding together (both may draft), then three (one more than drafts are
    // allowed beside: drafting stops and resumes as the batch shrinks).
    let engine = start(3, Speculate::Always);
    assert_eq!(run(&engine, inputs()[..2].to_vec()).await, expected[..2]);
    assert!(engine.speculation_stats().accepted() > 0);
    assert_eq!(run(&engine, inputs()).await, expected);
    engine.shutdown();
}

/// Drafts across requests: a request whose answer repeats an earlier one's copies from it
/// (`SharedDrafts`), and its output is still exactly one-token-at-a-time decoding's. A request
/// that was cancelled leaves nothing to copy.
#[tokio::test]
async fn answers_are_drafted_from_earlier_answers_and_unchanged() {
    let eos = eos(&start(1, Speculate::Off));
    let inputs = || PROMPTS.iter().map(|p| input(p, 60, greedy(), vec![], eos)).collect::<Vec<_>>();
    let expected = reference(inputs).await;
    let engine = start(1, Speculate::Always);
    for (i, want) in inputs().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    let first = (engine.speculation_stats().shared(), engine.speculation_stats().shared_accepted());
    // The same requests again: each finds its own earlier answer.
    for (i, want) in inputs().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    let stats = engine.speculation_stats();
    assert!(
        stats.shared_accepted() - first.1 >= 20,
        "copied from the earlier answers: {stats:?} (first run {first:?})"
    );
    assert!(stats.shared() <= stats.drafted() && stats.shared_accepted() <= stats.accepted(), "{stats:?}");
    engine.shutdown();
}

#[tokio::test]
async fn a_seeded_sampled_output_is_unchanged() {
    let eos = eos(&start(1, Speculate::Off));
    // The random model's distribution is nearly flat; a few favoured tokens make its sampled
    // output repeat (drafts get accepted) while other tokens still get drawn (drafts rejected).
    let favoured = (50..54).map(|t| (t, 6.0)).collect();
    let sampling =
        SamplingParams { temperature: 0.8, seed: Some(7), logit_bias: favoured, ..SamplingParams::default() };
    let inputs = || PROMPTS.iter().map(|p| input(p, 80, sampling.clone(), vec![], eos)).collect::<Vec<_>>();
    let expected = reference(inputs).await;
    let engine = start(1, Speculate::Always);
    for (i, want) in inputs().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    let stats = engine.speculation_stats();
    assert!(stats.accepted() > 0 && stats.drafted() > stats.accepted(), "{stats:?}");
    engine.shutdown();

    // Under `auto` the same seeded requests feed nothing ahead: where a verification batch's
    // rounding could flip a draw, reproducibility wins.
    let engine = start(1, Speculate::Auto);
    for (i, want) in inputs().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    let stats = engine.speculation_stats();
    assert_eq!((stats.drafted(), stats.forced()), (0, 0), "{stats:?}");
    engine.shutdown();
}

#[tokio::test]
async fn rejected_drafts_are_not_billed_and_limits_cut_where_they_would() {
    let eos = eos(&start(1, Speculate::Off));
    let long = || PROMPTS.iter().map(|p| input(p, 80, greedy(), vec![], eos)).collect::<Vec<_>>();
    let expected = reference(long).await;
    let engine = start(1, Speculate::Always);
    for (i, want) in long().into_iter().zip(&expected) {
        let got = run(&engine, vec![i]).await.remove(0);
        assert_eq!(got.usage.completion_tokens as usize, got.tokens.len());
        assert_eq!(got, *want);
    }
    let stats = engine.speculation_stats();
    assert!(stats.drafted() > stats.accepted() && stats.accepted() > 0, "{stats:?}");

    // Cut by max_tokens and by a stop string somewhere inside what the longer runs produced
    // (from the second half on, where drafts are accepted in runs).
    let mut cut = Vec::new();
    for (p, want) in PROMPTS.iter().zip(&expected) {
        for max in [41, 57, 63] {
            cut.push(input(p, max, greedy(), vec![], eos));
        }
        let stop: String = want.tokens[45..47].concat();
        cut.push(input(p, 80, greedy(), vec![stop], eos));
    }
    let make = || cut.clone();
    let expected = reference(make).await;
    for (i, want) in make().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    assert!(expected.iter().any(|o| o.finish == Some(FinishReason::Stop)), "a stop string cut: {expected:?}");
    engine.shutdown();
}

#[tokio::test]
async fn grammar_constrained_output_is_unchanged() {
    // Drafts are verified under the grammar too: a draft token the grammar forbids is simply
    // not the sampled token. A schema whose strings repeat gives drafts to verify.
    let eos = eos(&start(1, Speculate::Off));
    let schema = json!({
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string", "enum": ["one two", "one two three"]}}},
        "required": ["items"]
    });
    let inputs = || {
        let mut i = input(PROMPTS[0], 80, greedy(), vec![], eos);
        i.sampling.logit_bias.clear();
        i.constraint = Some((crate::Constraint::JsonSchema(schema.clone()), "response_format"));
        vec![i]
    };
    let expected = reference(inputs).await;
    let engine = start(1, Speculate::Always);
    assert_eq!(run(&engine, inputs()).await, expected);
    assert!(engine.speculation_stats().drafted() > 0, "drafts were verified under the grammar");
    engine.shutdown();
}

/// Jump-forward: under a schema the tokens the grammar forces (keys, punctuation, enum tails) are
/// fed ahead as drafts; the output is exactly what one-token-at-a-time constrained decoding
/// gives, alone and beside another sequence, greedy and seeded (which under `auto` decodes one
/// token at a time), and every forced draft is taken.
#[tokio::test]
async fn forced_tokens_are_fed_ahead_and_change_nothing() {
    let eos = eos(&start(1, Speculate::Off));
    let schema = json!({
        "type": "object",
        "properties": {
            "customer_name": {"type": "string", "maxLength": 12},
            "priority": {"enum": ["urgent escalation", "routine follow-up"]},
            "order_count": {"type": "integer"},
            "is_returning_customer": {"type": "boolean"},
            "shipping_region": {"enum": ["northern europe", "southern europe"]},
            "notes": {"type": "string", "maxLength": 8}
        },
        "required": ["customer_name", "priority", "order_count", "is_returning_customer", "shipping_region", "notes"]
    });
    let constrained = |sampling: SamplingParams| {
        let mut i = input(PROMPTS[2], 200, sampling, vec![], eos);
        // The random model may end the document wherever the grammar lets it, but would fill
        // every gap with as much layout whitespace as allowed: tab, line feed and space (byte
        // tokens 9, 10, 32) are banned where the grammar does not force them.
        i.sampling.logit_bias = vec![(9, -100.0), (10, -100.0), (32, -100.0)];
        i.constraint = Some((crate::Constraint::JsonSchema(schema.clone()), "response_format"));
        i
    };
    let seeded = SamplingParams { temperature: 0.9, seed: Some(11), ..SamplingParams::default() };
    let inputs = || vec![constrained(greedy()), constrained(seeded.clone())];
    let expected = reference(inputs).await;
    for out in &expected {
        let doc: serde_json::Value = serde_json::from_str(&out.text).expect("the reference is a complete document");
        assert_eq!(doc.as_object().unwrap().len(), 6, "{}", out.text);
    }

    let engine = start(2, Speculate::Auto);
    for (i, want) in inputs().into_iter().zip(&expected) {
        assert_eq!(&run(&engine, vec![i]).await[0], want);
    }
    assert_eq!(run(&engine, inputs()).await, expected, "both at once");
    let stats = engine.speculation_stats();
    // Six keys of 5-21 characters, the quotes, colons and commas around them and the enum tails
    // are forced, for the greedy document alone and beside the seeded one.
    assert!(stats.forced() >= 2 * 30, "forced drafts fed: {}", stats.forced());
    assert_eq!(stats.forced_accepted(), stats.forced(), "the sampler can only pick a forced token");
    engine.shutdown();
}
