//! No request waits forever: floods of short prompts of one cache scope beside a running stream,
//! on a few sequences, with clients that give up mid-prompt, every request ends, and none
//! ends because the scheduler found it stuck (`EngineError::Stalled`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::tests::engine::{drain, eos, tiny_model};
use crate::{CacheScope, ChatInput, Engine, EngineConfig, EngineError, Event, Generator, SamplingParams};

const SYSTEM: &str = "You are a careful assistant who answers questions about code, briefly and exactly, \
                      and who says so when a question cannot be answered from what was given.";

fn start(parallel: u32) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (1024, parallel, Some(1));
    Engine::start(config).unwrap()
}

/// An engine whose steps can be held at their decode (`EngineConfig::decode_turns`), with
/// 64 prompt rows a step while a stream decodes.
fn start_held(parallel: u32) -> (Engine, Arc<Mutex<()>>) {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.batch_size) = (1024, parallel, Some(1), 128);
    let turns = Arc::new(Mutex::new(()));
    config.decode_turns = Some(turns.clone());
    (Engine::start(config).unwrap(), turns)
}

/// A chat with the shared system prompt; `bias` keeps the end token away when given.
fn ask(text: &str, max_tokens: u32, bias: Option<i32>) -> ChatInput {
    ChatInput {
        messages: vec![json!({"role": "system", "content": SYSTEM}), json!({"role": "user", "content": text})],
        tools: None,
        n: 1,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            logit_bias: bias.map(|eos| vec![(eos, -100.0)]).unwrap_or_default(),
            ..SamplingParams::default()
        },
        logprobs: None,
        constraint: None,
        lazy_tools: None,
        cache_scope: CacheScope(7),
        answer_constraint: None,
        thinking: Default::default(),
    }
}

/// A fresh question of about 200 tokens; questions of one `topic` share their opening, so
/// prompts arriving together find each other's prefixes while they are being read.
fn question(topic: usize, n: usize) -> String {
    let opening = ["Explain this function", "Review this diff", "Write a test for"][topic % 3];
    format!("{opening} number {n}: {}", "fn f(x: u32) -> u32 { x.wrapping_mul(31) ^ 7 } ".repeat(3))
}

/// Ends with an error naming the request when the engine never answers it.
async fn finish(engine: &Engine, input: ChatInput, give_up_after: Option<Duration>) -> Option<Vec<Event>> {
    let handle = engine.submit(engine.prepare(input).unwrap()).unwrap();
    if let Some(after) = give_up_after {
        tokio::time::sleep(after).await;
        drop(handle);
        return None;
    }
    let (events, _) = tokio::time::timeout(Duration::from_secs(60), drain(handle))
        .await
        .expect("a request was never answered: the scheduler left it without rows");
    Some(events)
}

fn stalled(events: &[Event]) -> bool {
    events.iter().any(|e| matches!(e, Event::Error(EngineError::Stalled(_))))
}

/// Three loops of fresh prompts (`max_tokens: 1`, some given up mid-prompt) beside one long
/// stream, on four sequences: every request ends, none of them stalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_prompts_of_one_scope_beside_a_stream_all_finish() {
    let engine = start(4);
    let eos = eos(&engine);
    let stream = {
        let engine = engine.clone();
        tokio::spawn(async move { finish(&engine, ask("Count slowly to a thousand.", 600, Some(eos)), None).await })
    };
    let mut loops = Vec::new();
    for l in 0..3 {
        let engine = engine.clone();
        loops.push(tokio::spawn(async move {
            let mut answered = 0;
            for n in 0..40 {
                // Every fifth client gives up while its prompt may still be read.
                let give_up = (n % 5 == 4).then(|| Duration::from_micros(200 * (l as u64 + 1)));
                if let Some(events) = finish(&engine, ask(&question(n + l, n), 1, None), give_up).await {
                    assert!(!stalled(&events), "loop {l} request {n} stalled: {events:?}");
                    assert!(matches!(events.last(), Some(Event::Done(_))), "loop {l} request {n}: {events:?}");
                    answered += 1;
                }
            }
            answered
        }));
    }
    for l in loops {
        assert_eq!(l.await.unwrap(), 32);
    }
    let events = stream.await.unwrap().unwrap();
    assert!(matches!(events.last(), Some(Event::Done(_))), "{:?}", events.last());
    assert_eq!(engine.stalled_requests(), 0);
    engine.shutdown();
}

/// One user message of `text`.
fn user(text: &str, max_tokens: u32, bias: Option<i32>) -> ChatInput {
    ChatInput { messages: vec![json!({"role": "user", "content": text})], ..ask("", max_tokens, bias) }
}

/// The wait cycle slot reuse made: X waits to copy the prefix R is reading; R's client leaves
/// mid-prompt, and in that step Z takes R's sequence (it holds the most of Z's prompt) and
/// waits to copy from X, which shares more with Z than R's sequence holds, while X waits on
/// the sequence that is now Z's. Neither read a row again. Both must finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_a_prefix_whose_reader_left_is_not_stuck() {
    let (engine, turns) = start_held(4);
    let eos = eos(&engine);
    let base: String = (0..850).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect();
    let (r, x, z) = (
        format!("{base}{}", "R".repeat(50)),
        format!("{base}{}{}", "Q".repeat(20), "X".repeat(30)),
        format!("{base}{}{}", "Q".repeat(20), "Z".repeat(30)),
    );
    // A stream decodes throughout, so R's long prompt reads 64 rows a step.
    let mut stream = engine.submit(engine.prepare(user("count", 400, Some(eos))).unwrap()).unwrap();
    assert!(matches!(stream.events.recv().await, Some(Event::Cached { .. })));
    let (r, x, z) = (
        engine.prepare(user(&r, 1, None)).unwrap(),
        engine.prepare(user(&x, 1, None)).unwrap(),
        engine.prepare(user(&z, 1, None)).unwrap(),
    );
    let held = turns.lock().unwrap();
    let r = engine.submit(r).unwrap();
    let x = engine.submit(x).unwrap();
    drop(held);
    // A step or two: R has read at most a few chunks of its 900 tokens.
    std::thread::sleep(Duration::from_millis(2));
    let held = turns.lock().unwrap();
    drop(r);
    let z = engine.submit(z).unwrap();
    drop(held);
    let both = async { tokio::join!(drain(x), drain(z)) };
    let ((x, _), (z, _)) = tokio::time::timeout(Duration::from_secs(30), both)
        .await
        .expect("two requests waited on each other's prefix for good");
    for events in [x, z] {
        assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    }
    drop(stream);
    assert_eq!(engine.stalled_requests(), 0);
    engine.shutdown();
}
