//! `--deterministic-greedy` on the tiny random-weight model: one greedy (or seeded) request gives
//! the same tokens and bit-identical logprobs alone, after a cache fill, beside 7 other streams,
//! and with drafts on or off (see `deterministic`).

use serde_json::json;

use crate::tests::engine::{drain, eos};
use crate::{ChatInput, Engine, EngineConfig, Event, Generator, SamplingParams, Speculate, SpeculationConfig};

fn start(mode: Speculate, deterministic_greedy: bool) -> Engine {
    let mut config = EngineConfig::new(crate::tests::engine::tiny_model());
    config.ctx_size = 512;
    config.parallel = 8;
    config.threads = Some(1);
    config.speculation = SpeculationConfig { mode, draft_max: 8 };
    config.deterministic_greedy = deterministic_greedy;
    Engine::start(config).unwrap()
}

/// The request under test repeats itself, so drafts copied from it get fed under `always`.
const GREEDY: &str = "one two three four five one two three four five one two three four five one two";
const OTHERS: [&str; 7] = [
    "the cat sat on the mat and the cat sat on the mat and the cat sat",
    "fn main() { let x = 1; let y = 2; let x = 1; let y = 2; }",
    "a b c d e f g h i j k l m n o p",
    "write me a long story about a lighthouse keeper",
    "red green blue red green blue red green blue",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "hello hello hello hello",
];

fn input(text: &str, sampling: SamplingParams, eos: i32) -> ChatInput {
    ChatInput {
        messages: vec![json!({"role": "user", "content": text})],
        tools: None,
        n: 1,
        max_tokens: Some(48),
        stop: Vec::new(),
        // The end token is banned so every run is as long as asked.
        sampling: SamplingParams { logit_bias: vec![(eos, -100.0)], ..sampling },
        logprobs: Some(3),
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

/// The output's tokens with the bits of their logprobs and of their top alternatives'.
type Trace = Vec<(String, u32, Vec<(String, u32)>)>;

fn trace(events: &[Event]) -> Trace {
    let mut out = Vec::new();
    for e in events {
        if let Event::Delta { logprobs, .. } = e {
            for l in logprobs {
                let top = l.top.iter().map(|t| (t.token.clone(), t.logprob.to_bits())).collect();
                out.push((l.token.clone(), l.logprob.to_bits(), top));
            }
        }
    }
    out
}

/// Runs the greedy request beside `others` (all at once) and returns its trace and the prompt
/// tokens it took from the cache.
async fn run(engine: &Engine, sampling: &SamplingParams, others: &[ChatInput]) -> (Trace, u32) {
    let eos = eos(engine);
    let mine = engine.submit(engine.prepare(input(GREEDY, sampling.clone(), eos)).unwrap()).unwrap();
    let rest: Vec<_> = others.iter().map(|i| engine.submit(engine.prepare(i.clone()).unwrap()).unwrap()).collect();
    let (events, usage) = drain(mine).await;
    for h in rest {
        let (events, _) = drain(h).await;
        assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    }
    let t = trace(&events);
    assert_eq!(t.len(), 48);
    (t, usage.cached_tokens)
}

/// Seven other streams: greedy and sampled, some repeating themselves (they draft).
fn others(eos: i32) -> Vec<ChatInput> {
    OTHERS
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let sampling = if i % 2 == 0 {
                greedy()
            } else {
                SamplingParams { temperature: 0.8, seed: Some(i as u64), ..SamplingParams::default() }
            };
            input(text, sampling, eos)
        })
        .collect()
}

/// Every scenario of the issue, on engines with and without drafts, for a request sampling as
/// `sampling` says (greedy, or seeded); returns the traces.
async fn scenarios(deterministic_greedy: bool, sampling: SamplingParams) -> Vec<(String, Trace)> {
    let mut traces = Vec::new();
    for mode in [Speculate::Off, Speculate::Always] {
        let engine = start(mode, deterministic_greedy);
        let eos = eos(&engine);
        let (alone, _) = run(&engine, &sampling, &[]).await;
        let (again, cached) = run(&engine, &sampling, &[]).await;
        if deterministic_greedy {
            assert_eq!(cached, 0, "a deterministic request recomputes its prompt");
        } else {
            assert!(cached > 0, "the second request reads its prompt from the cache");
        }
        let (beside, _) = run(&engine, &sampling, &others(eos)).await;
        // Beside one stream that drafts (sampled without a seed: greedy and seeded ones do not
        // under the flag), while few enough streams decode for lookup drafts to be fed. Its
        // `top_k` of 1 makes its text, and so whether lookups find drafts in it, the same on
        // every run.
        let drafting = SamplingParams { temperature: 0.1, top_k: 1, ..SamplingParams::default() };
        let (beside_drafts, _) = run(&engine, &sampling, &[input(OTHERS[0], drafting, eos)]).await;
        // Once more after the others filled the cache and the draft statistics.
        let (after, _) = run(&engine, &sampling, &[]).await;
        traces.extend(
            [
                ("alone", alone),
                ("cached", again),
                ("beside 7", beside),
                ("beside drafts", beside_drafts),
                ("after", after),
            ]
            .map(|(what, t)| (format!("{mode:?} {what}"), t)),
        );
        if deterministic_greedy && mode == Speculate::Always {
            assert!(engine.speculation_stats().drafted() > 0, "the other stream drafted");
        }
        engine.shutdown();
    }
    traces
}

#[tokio::test]
async fn greedy_output_is_identical_whatever_the_cache_drafts_and_batch_did() {
    all_alike(&scenarios(true, greedy()).await);
}

/// The flag holds a seeded request to the same: the same seed, the same text, beside anything.
#[tokio::test]
async fn seeded_output_is_identical_whatever_the_cache_drafts_and_batch_did() {
    let seeded = SamplingParams { temperature: 0.9, seed: Some(42), ..SamplingParams::default() };
    all_alike(&scenarios(true, seeded).await);
}

fn all_alike(traces: &[(String, Trace)]) {
    let (first, want) = &traces[0];
    for (what, got) in &traces[1..] {
        let at = want.iter().zip(got).position(|(a, b)| a != b);
        assert!(
            at.is_none(),
            "{what} differs from {first} at token {at:?}: {:?} vs {:?}",
            want[at.unwrap()],
            got[at.unwrap()]
        );
    }
}
