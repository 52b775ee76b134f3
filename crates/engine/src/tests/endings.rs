//! Every way a request ends goes through `Scheduler::end`, once: one test per kind of ending,
//! each checking what the owner is sent (the last event, the usage report), that the end is
//! counted once (`endings_log`, beside `gantry_requests_total`), and what its sequences keep.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::scheduler::end::EndingRecord;
use crate::tests::engine::{drain, eos, input, tiny_model};
use crate::{ChatInput, Engine, EngineConfig, EngineError, Event, GenerationHandle, Generator, Outcome};

type Endings = Arc<Mutex<Vec<EndingRecord>>>;

/// An engine on the tiny model with `parallel` sequences that logs every request's end.
fn start(parallel: u32, panic_after_tokens: Option<u32>) -> (Engine, Endings) {
    start_taking_turns(parallel, panic_after_tokens, None)
}

/// [`start`], each decode step taking its turn of `turns`.
fn start_taking_turns(
    parallel: u32,
    panic_after_tokens: Option<u32>,
    turns: Option<Arc<Mutex<()>>>,
) -> (Engine, Endings) {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (256, parallel, Some(1));
    config.panic_after_tokens = panic_after_tokens;
    config.decode_turns = turns;
    let endings = Endings::default();
    config.endings_log = Some(endings.clone());
    (Engine::start(config).unwrap(), endings)
}

/// `text` as a user message, answered greedily for exactly `max_tokens` tokens (the end token
/// is banned).
fn ask(engine: &Engine, text: &str, max_tokens: u32) -> ChatInput {
    let mut input = input(max_tokens, vec![(eos(engine), -100.0)]);
    input.messages = vec![json!({"role": "user", "content": text})];
    input
}

fn submit(engine: &Engine, input: ChatInput) -> GenerationHandle {
    engine.submit(engine.prepare(input).unwrap()).unwrap()
}

/// The ends logged once `count` are there (or what is there after 30 s).
fn ends(endings: &Endings, count: usize) -> Vec<EndingRecord> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while endings.lock().unwrap().len() < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    endings.lock().unwrap().clone()
}

fn record(started: bool, ending: &'static str, outcome: Outcome) -> EndingRecord {
    EndingRecord { started, ending, outcome }
}

#[tokio::test]
async fn a_request_that_runs_its_course_ends_once_and_its_sequence_keeps_the_prefix() {
    let (engine, endings) = start(1, None);
    let text = "a prompt long enough to be worth keeping in the cache for the next turn";
    let (events, usage) = drain(submit(&engine, ask(&engine, text, 6))).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!((usage.outcome, usage.completion_tokens, usage.cached_tokens), (Outcome::Length, 6, 0));
    assert_eq!(ends(&endings, 1), [record(true, "finished", Outcome::Length)]);
    // The same prompt again reads its prefix from the sequence the first one left.
    let (_, again) = drain(submit(&engine, ask(&engine, text, 6))).await;
    assert!(again.cached_tokens > 0, "{again:?}");
    engine.shutdown();
}

#[tokio::test]
async fn a_running_request_whose_client_left_ends_cancelled_and_billed() {
    let (engine, endings) = start(1, None);
    let mut handle = submit(&engine, ask(&engine, "a long answer please", 200));
    while !matches!(handle.events.recv().await, Some(Event::Delta { .. })) {}
    drop(handle);
    assert_eq!(ends(&endings, 1), [record(true, "finished", Outcome::Cancelled)]);
    // Its sequence came back: the next request runs on the only one.
    let (events, _) = drain(submit(&engine, ask(&engine, "next", 2))).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    engine.shutdown();
}

#[tokio::test]
async fn a_waiting_request_whose_client_left_ends_unbilled() {
    let (engine, endings) = start(1, None);
    let running = submit(&engine, ask(&engine, "the one running", 120));
    drop(submit(&engine, ask(&engine, "the one waiting", 4)));
    let (_, usage) = drain(running).await;
    assert_eq!(usage.outcome, Outcome::Length);
    let mut logged = ends(&endings, 2);
    logged.sort_by_key(|r| r.started);
    assert_eq!(logged, [record(false, "finished", Outcome::Cancelled), record(true, "finished", Outcome::Length)]);
    engine.shutdown();
}

#[tokio::test]
async fn a_request_refused_when_queued_ends_with_its_error_unbilled() {
    let (engine, endings) = start(2, None);
    let mut request = engine.prepare(ask(&engine, "three choices", 2)).unwrap();
    request.n = 3;
    let (events, usage) = drain(engine.submit(request).unwrap()).await;
    assert!(matches!(events.as_slice(), [Event::Error(EngineError::Rejected(_))]), "{events:?}");
    assert_eq!((usage.outcome, usage.prompt_tokens), (Outcome::Error, 0));
    assert_eq!(ends(&endings, 1), [record(false, "failed", Outcome::Error)]);
    engine.shutdown();
}

#[tokio::test]
async fn a_request_that_fails_to_start_gives_its_sequences_back() {
    let (engine, endings) = start(2, None);
    let mut faulty = ask(&engine, "gantry-fault:starting@0 two choices", 4);
    faulty.n = 2;
    let (events, usage) = drain(submit(&engine, faulty)).await;
    match events.as_slice() {
        [Event::Error(EngineError::RequestFailed(why))] => assert!(why.contains("injected fault"), "{why}"),
        other => panic!("the request that failed to start ended with {other:?}"),
    }
    assert_eq!((usage.outcome, usage.completion_tokens), (Outcome::Error, 0));
    assert_eq!(ends(&endings, 1), [record(false, "failed", Outcome::Error)]);
    // Both sequences came back: a request needing both runs.
    let mut both = ask(&engine, "both sequences", 3);
    both.n = 2;
    let (events, usage) = drain(submit(&engine, both)).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(usage.completion_tokens, 6);
    engine.shutdown();
}

#[tokio::test]
async fn a_request_that_fails_running_is_billed_and_its_sequence_emptied() {
    let (engine, endings) = start(1, None);
    let text = "gantry-fault:sampling@3 a prompt that would otherwise be cached for the next one";
    let (events, usage) = drain(submit(&engine, ask(&engine, text, 12))).await;
    assert!(matches!(events.last(), Some(Event::Error(EngineError::RequestFailed(_)))), "{events:?}");
    assert_eq!((usage.outcome, usage.completion_tokens), (Outcome::Error, 3));
    assert_eq!(ends(&endings, 1), [record(true, "failed", Outcome::Error)]);
    // The same prompt again finds nothing cached: the failed request's sequence was emptied.
    let (_, again) = drain(submit(&engine, ask(&engine, text, 12))).await;
    assert_eq!(again.cached_tokens, 0, "{again:?}");
    engine.shutdown();
}

#[tokio::test]
async fn shutdown_past_its_grace_ends_running_and_waiting_requests_with_an_error() {
    let (engine, endings) = start(1, None);
    let mut running = submit(&engine, ask(&engine, "the one running", 200));
    let waiting = submit(&engine, ask(&engine, "the one waiting", 4));
    while !matches!(running.events.recv().await, Some(Event::Delta { .. })) {}
    engine.abort_all();
    let (events, usage) = drain(running).await;
    assert!(matches!(events.last(), Some(Event::Error(EngineError::ShuttingDown))), "{events:?}");
    assert!(usage.outcome == Outcome::Error && usage.completion_tokens > 0, "{usage:?}");
    let (events, usage) = drain(waiting).await;
    assert!(matches!(events.as_slice(), [Event::Error(EngineError::ShuttingDown)]), "{events:?}");
    assert_eq!((usage.outcome, usage.completion_tokens), (Outcome::Error, 0));
    let mut logged = ends(&endings, 2);
    logged.sort_by_key(|r| r.started);
    assert_eq!(logged, [record(false, "failed", Outcome::Error), record(true, "failed", Outcome::Error)]);
    engine.shutdown();
}

#[tokio::test]
async fn a_scheduler_panic_ends_every_request_it_held_once() {
    // The scheduler's first decode waits for this turn, so both are queued before the
    // running one can reach its 5 tokens (a second submitted after that would be refused).
    let turns = Arc::new(Mutex::new(()));
    let (engine, endings) = start_taking_turns(1, Some(5), Some(turns.clone()));
    let turn = turns.lock().unwrap();
    let running = submit(&engine, ask(&engine, "the one running", 50));
    let waiting = submit(&engine, ask(&engine, "the one waiting", 4));
    drop(turn);
    let (events, usage) = drain(running).await;
    assert!(matches!(events.last(), Some(Event::Error(EngineError::Crashed(_)))), "{events:?}");
    assert!(usage.outcome == Outcome::Error && usage.completion_tokens >= 5, "{usage:?}");
    let (events, _) = drain(waiting).await;
    assert!(matches!(events.as_slice(), [Event::Error(EngineError::Crashed(_))]), "{events:?}");
    let mut logged = ends(&endings, 2);
    logged.sort_by_key(|r| r.started);
    assert_eq!(logged, [record(false, "crashed", Outcome::Error), record(true, "crashed", Outcome::Error)]);
}

#[tokio::test]
async fn batch_lines_and_unstreamed_flex_requests_give_their_sequences_and_end_preempted() {
    let (engine, endings) = start(1, None);
    let submit_in = |text: &str, max_tokens, tier, streamed| {
        let mut request = engine.prepare(ask(&engine, text, max_tokens)).unwrap();
        (request.tier, request.streamed) = (tier, streamed);
        engine.submit(request).unwrap()
    };
    // A streamed flex request is not stopped (its client reads it): the default one waits.
    let mut flex = submit_in("a flex answer", 30, crate::ServiceTier::Flex, true);
    while !matches!(flex.events.recv().await, Some(Event::Delta { .. })) {}
    let (events, _) = drain(submit_in("an interactive one", 2, crate::ServiceTier::Default, true)).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(drain(flex).await.1.outcome, Outcome::Length);
    // A batch line and an unstreamed flex request are: each ends preempted, told so, while the
    // default request runs.
    for (text, tier) in
        [("a long batch answer", crate::ServiceTier::Batch), ("a long flex one", crate::ServiceTier::Flex)]
    {
        let mut held = submit_in(text, 200, tier, false);
        while !matches!(held.events.recv().await, Some(Event::Delta { .. })) {}
        let interactive = submit_in("an interactive one", 3, crate::ServiceTier::Default, false);
        let (events, usage) = drain(held).await;
        assert!(matches!(events.last(), Some(Event::Error(EngineError::Preempted))), "{tier:?}: {events:?}");
        assert_eq!(usage.outcome, Outcome::Preempted);
        assert!(usage.completion_tokens < 200, "{usage:?}");
        let (events, usage) = drain(interactive).await;
        assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
        assert_eq!(usage.completion_tokens, 3);
    }
    let logged = ends(&endings, 6);
    assert_eq!(logged.iter().filter(|r| r.ending == "preempted").count(), 2, "{logged:?}");
    assert!(logged.contains(&record(true, "preempted", Outcome::Preempted)), "{logged:?}");
    engine.shutdown();
}

#[tokio::test]
async fn batch_lines_are_preempted_before_flex_requests() {
    let (engine, _endings) = start(2, None);
    let submit_in = |text: &str, tier| {
        let mut request = engine.prepare(ask(&engine, text, 200)).unwrap();
        request.tier = tier;
        engine.submit(request).unwrap()
    };
    // The line starts first, so "the most recently started first" alone would not pick it.
    let mut line = submit_in("a long batch answer", crate::ServiceTier::Batch);
    while !matches!(line.events.recv().await, Some(Event::Delta { .. })) {}
    let mut flex = submit_in("a long flex answer", crate::ServiceTier::Flex);
    while !matches!(flex.events.recv().await, Some(Event::Delta { .. })) {}
    let mut interactive = engine.prepare(ask(&engine, "an interactive one", 3)).unwrap();
    interactive.tier = crate::ServiceTier::Default;
    let interactive = engine.submit(interactive).unwrap();
    let (events, _) = drain(line).await;
    assert!(matches!(events.last(), Some(Event::Error(EngineError::Preempted))), "{events:?}");
    let (events, usage) = drain(interactive).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(usage.completion_tokens, 3);
    // One sequence was enough: the flex request runs on to its length.
    assert_eq!(drain(flex).await.1.outcome, Outcome::Length);
    engine.shutdown();
}
