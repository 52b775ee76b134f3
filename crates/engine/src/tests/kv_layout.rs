//! Both KV layouts (see `kv_layout`) end to end on the tiny model: what one sequence computed
//! reaches the others, by copy (per sequence) or by shared cells (unified).

use serde_json::json;

use std::sync::{Arc, Mutex};

use crate::kv::cache::StreamCopies;
use crate::tests::engine::{drain, logging_moves, submit_together, tiny_model};
use crate::{ChatInput, Engine, EngineConfig, Event, Generator, KvLayout, Outcome, SamplingParams, Usage};

/// Each layout, and per sequence both ways of copying between streams (a GPU copies on the
/// device; the CPU backend here runs the same llama.cpp path).
const LAYOUTS: [(KvLayout, StreamCopies); 3] = [
    (KvLayout::PerSequence, StreamCopies::ThroughHost),
    (KvLayout::PerSequence, StreamCopies::OnDevice),
    (KvLayout::Unified, StreamCopies::ThroughHost),
];

/// Both ways of copying between streams, for the tests of moves.
const COPIES: [StreamCopies; 2] = [StreamCopies::ThroughHost, StreamCopies::OnDevice];

fn start((layout, copies): (KvLayout, StreamCopies), parallel: u32) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.kv_layout) = (512, parallel, Some(1), layout);
    config.kv_copies = Some(copies);
    Engine::start(config).unwrap()
}

pub(crate) fn greedy(text: &str, n: u32, max_tokens: u32) -> ChatInput {
    ChatInput {
        messages: vec![json!({"role": "user", "content": text})],
        tools: None,
        n,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        logprobs: None,
        constraint: None,
        lazy_tools: None,
        cache_scope: crate::CacheScope::default(),
        answer_constraint: None,
        thinking: Default::default(),
    }
}

/// Each choice's text, by index.
fn texts(events: &[Event], n: usize) -> Vec<String> {
    let mut out = vec![String::new(); n];
    for e in events {
        if let Event::Delta { choice, text, .. } = e {
            out[*choice as usize].push_str(text);
        }
    }
    out
}

async fn run(engine: &Engine, input: ChatInput) -> (Vec<String>, Usage) {
    let n = input.n as usize;
    let (events, usage) = drain(engine.submit(engine.prepare(input).unwrap()).unwrap()).await;
    assert!(!events.iter().any(|e| matches!(e, Event::Error(_))), "{events:?}");
    (texts(&events, n), usage)
}

/// The prompt is computed in the first choice's sequence and copied to the others once read:
/// every greedy choice then decodes from the same KV entries and writes the same text, whether
/// the prompt was computed from scratch or partly found in the cache.
#[tokio::test]
async fn every_choice_continues_the_prompt_computed_once() {
    for layout in LAYOUTS {
        let engine = start(layout, 4);
        for text in ["several choices of one prompt, computed from scratch", "count the stars"] {
            let (choices, usage) = run(&engine, greedy(text, 3, 12)).await;
            assert!(!choices[0].is_empty(), "{layout:?}: {choices:?}");
            assert!(choices.iter().all(|c| c == &choices[0]), "{layout:?} {text}: {choices:?}");
            assert_eq!(usage.completion_tokens % 3, 0, "{layout:?}: {usage:?}");
            assert!(usage.completion_tokens >= 3);
        }
        // The same prompt again: all of it but the last token comes from the cache.
        let (choices, usage) = run(&engine, greedy("count the stars", 2, 12)).await;
        assert_eq!(usage.cached_tokens, usage.prompt_tokens - 1, "{layout:?}");
        assert_eq!(choices[0], choices[1], "{layout:?}");
        engine.shutdown();
    }
}

/// Requests arriving together with one long prompt: the first computes it, the others wait and
/// copy it (per sequence: a state copy between streams). Copied entries must be the computed
/// ones at the same positions, so the greedy answers are the same text.
#[tokio::test]
async fn a_burst_sharing_a_prompt_computes_it_once_and_answers_alike() {
    let long = "the same long opening for every request of the burst, ".repeat(8);
    for layout in LAYOUTS {
        let engine = start(layout, 4);
        let handles: Vec<_> =
            (0..3).map(|_| engine.submit(engine.prepare(greedy(&long, 1, 10)).unwrap()).unwrap()).collect();
        let mut answers = Vec::new();
        for h in handles {
            let (events, usage) = drain(h).await;
            assert!(matches!(usage.outcome, Outcome::Completed | Outcome::Length), "{layout:?}: {usage:?}");
            answers.push((texts(&events, 1).remove(0), usage));
        }
        let copied = answers.iter().filter(|(_, u)| u.cached_tokens >= u.prompt_tokens / 2).count();
        assert!(copied >= 2, "{layout:?}: {:?}", answers.iter().map(|a| &a.1).collect::<Vec<_>>());
        assert!(!answers[0].0.is_empty(), "{layout:?}");
        assert!(answers.iter().all(|(t, _)| t == &answers[0].0), "{layout:?}: {answers:?}");
        engine.shutdown();
    }
}

/// An engine with a KV stream per sequence that logs its moves (`compact`), and its decode turns
/// (for `submit_together`).
fn start_logging_moves(
    parallel: u32,
    copies: StreamCopies,
    host_cache_bytes: usize,
) -> (Engine, crate::scheduler::step::compact::MovesLog, Arc<Mutex<()>>) {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (512, parallel, Some(1));
    (config.kv_copies, config.host_cache_bytes) = (Some(copies), host_cache_bytes);
    let (moves, turns) = logging_moves(&mut config);
    (Engine::start(config).unwrap(), moves, turns)
}

/// A sequence moved down into a gap (`scheduler/step/compact.rs`) decodes on from the entries it had.
/// A two-token request takes sequence 0 and a three-choice request 1–3; when the first ends, the
/// choice on 3 moves into 0 while the others stay. The three greedy choices decode in the same
/// batches, so a move that lost or misplaced an entry would make the moved one's text differ.
/// Both ways of moving: through host memory, and llama.cpp's copy of the stream at the next
/// decode (what a GPU uses; on the CPU backend here it copies the same way).
#[tokio::test]
async fn a_sequence_moved_into_a_gap_answers_as_if_it_had_stayed() {
    for way in COPIES {
        moved_sequence_answers_as_if_it_had_stayed(way, 64 << 20).await;
    }
}

/// Without host memory (`--cache-ram 0`) a finished sequence keeps its entries in its slot, and
/// the gap is taken all the same (its entries dropped): otherwise the running sequences would
/// stay apart, a pass over the weights each, for the rest of their answers.
#[tokio::test]
async fn without_host_memory_a_gap_holding_an_idle_sequence_is_taken() {
    for way in COPIES {
        moved_sequence_answers_as_if_it_had_stayed(way, 0).await;
    }
}

async fn moved_sequence_answers_as_if_it_had_stayed(way: StreamCopies, host_cache_bytes: usize) {
    let (engine, moves, turns) = start_logging_moves(4, way, host_cache_bytes);
    let inputs = vec![greedy("two tokens only", 1, 2), greedy("three choices that decode on", 3, 24)];
    let [short, long] = <[_; 2]>::try_from(submit_together(&engine, &turns, inputs)).ok().unwrap();
    let (short_events, _) = drain(short).await;
    assert!(!short_events.iter().any(|e| matches!(e, Event::Error(_))), "{short_events:?}");
    let (events, usage) = drain(long).await;
    assert!(!events.iter().any(|e| matches!(e, Event::Error(_))), "{events:?}");
    assert_eq!(*moves.lock().unwrap(), [vec![(3, 0)]], "{way:?}: the highest choice moves into the gap, once");
    let choices = texts(&events, 3);
    assert!(usage.completion_tokens > 3, "{usage:?}");
    assert!(!choices[0].is_empty() && choices.iter().all(|c| c == &choices[0]), "{way:?}: {choices:?}");
    engine.shutdown();
}

/// Several answers ending in one step leave several gaps: they are closed in that step, the
/// highest sequence into the lowest gap first, not one a step.
#[tokio::test]
async fn gaps_left_together_are_closed_together() {
    for way in COPIES {
        gaps_closed_together(way).await;
    }
}

async fn gaps_closed_together(way: StreamCopies) {
    let (engine, moves, turns) = start_logging_moves(6, way, 64 << 20);
    let inputs = vec![greedy("three short answers", 3, 2), greedy("three long answers", 3, 16)];
    let [short, long] = <[_; 2]>::try_from(submit_together(&engine, &turns, inputs)).ok().unwrap();
    drain(short).await;
    let (events, usage) = drain(long).await;
    assert!(!events.iter().any(|e| matches!(e, Event::Error(_))), "{events:?}");
    assert_eq!(*moves.lock().unwrap(), [vec![(5, 0), (4, 1), (3, 2)]], "{way:?}: in one step");
    let choices = texts(&events, 3);
    assert!(usage.completion_tokens > 3, "{usage:?}");
    assert!(!choices[0].is_empty() && choices.iter().all(|c| c == &choices[0]), "{way:?}: {choices:?}");
    engine.shutdown();
}
