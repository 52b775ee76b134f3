//! One request's bad output or failure stays that request's: bytes that are not UTF-8 before a
//! fenced tool call, and a panic in one request's step, end at most that request.

use tokio::sync::mpsc::error::TryRecvError;

use crate::scheduler::request::{ActiveRequest, Phase};
use crate::tests::engine::{drain, eos, tiny_model};
use crate::tests::kv_layout::greedy;
use crate::{
    ChatInput, Constraint, Engine, EngineConfig, EngineError, Event, GenerationHandle, Generator, Health, LazyTools,
    Outcome, SpeculationConfig,
};

fn start(parallel: u32) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    config.ctx_size = 256;
    config.parallel = parallel;
    config.threads = Some(1);
    Engine::start(config).unwrap()
}

/// `tool_choice: "auto"` with one function, `get_weather`.
fn lazy_tools() -> LazyTools {
    let rules = "fenced_calls: \"```\" /[a-z]*/ \"\\n\" body \"\\n```\"\n\
                 body: %json {\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, \
                 \"arguments\": {\"type\": \"object\"}}, \"required\": [\"name\", \"arguments\"]}\n";
    LazyTools {
        bare: Constraint::JsonObject,
        tagged: Constraint::JsonObject,
        fenced_calls_rules: rules.to_string(),
        names: vec!["get_weather".to_string()],
    }
}

/// One greedy choice of `text`.
fn chat(text: &str, max_tokens: u32) -> ChatInput {
    greedy(text, 1, max_tokens)
}

/// A request on `engine`'s model as the scheduler holds it once admitted into sequence 0.
fn admitted(engine: &Engine, input: ChatInput) -> ActiveRequest {
    let request = engine.prepare(input).unwrap();
    let (events, _) = tokio::sync::mpsc::unbounded_channel();
    let spec = SpeculationConfig::default();
    let seqs = vec![crate::kv::seq_id::SeqId::new(0)];
    ActiveRequest::new(request, events, std::time::Instant::now(), seqs, engine.model(), 256, spec)
        .unwrap_or_else(|rejected| panic!("{rejected}"))
}

/// The tiny model's first 256 tokens are the bytes (id == byte), so any output can be fed.
fn feed(req: &mut ActiveRequest, engine: &Engine, output: &[u8]) {
    for &b in output {
        req.watch_for_tool_call(0, i32::from(b), &[b], engine.model());
    }
}

#[test]
fn bytes_that_are_not_utf8_before_a_fenced_call_do_not_keep_it_from_its_grammar() {
    let engine = start(1);
    let call = b"```json\n{\"name\": \"get_weather\", \"arguments\": {";
    // A lone lead byte, then the fence: the grammar starts at the fence's token, so what came
    // before it, text or not, does not matter.
    for before in [&b"caf\xC3 "[..], &b"caf\xC3\xA9 "[..]] {
        let mut req = admitted(&engine, ChatInput { lazy_tools: Some(lazy_tools()), ..chat("weather?", 8) });
        feed(&mut req, &engine, &[before, &call[..]].concat());
        assert!(req.choices[0].constrained, "{before:?}: the call is held to its grammar");
        assert!(req.choices[0].tool_watch.is_none(), "{before:?}");
    }
    engine.shutdown();
}

/// The fenced call's grammar is compiled by `prepare`, whatever text comes before the fence: the
/// scheduler only instantiates it when a fence opens (a compile on the scheduler thread would
/// stall every other stream meanwhile).
#[test]
fn a_fenced_call_starts_its_grammar_without_compiling_on_the_scheduler() {
    let engine = start(1);
    let call = b"```json\n{\"name\": \"get_weather\", \"arguments\": {";
    for before in ["", "Let me check the weather: ", "Code:\n```python\nprint(1)\n```\nThen:\n"] {
        let mut req = admitted(&engine, ChatInput { lazy_tools: Some(lazy_tools()), ..chat("weather?", 8) });
        let compiles = engine.model().grammar_compiles();
        feed(&mut req, &engine, &[before.as_bytes(), &call[..]].concat());
        assert!(req.choices[0].constrained, "{before:?}: the call is held to its grammar");
        assert_eq!(engine.model().grammar_compiles(), compiles, "{before:?}: a grammar was compiled at the fence");
    }
    engine.shutdown();
}

/// A request's phase follows its prompt and its choices: reading, waiting for a prefix with what
/// it read kept, decoding once all is read, finished once every choice is.
#[test]
fn a_requests_phase_follows_its_prompt_and_its_choices() {
    let engine = start(1);
    let mut req = admitted(&engine, chat("a prompt of a few tokens", 4));
    let len = req.prompt.len();
    assert_eq!((req.phase, req.read()), (Phase::Prefilling { read: 0 }, 0));
    req.set_read(3);
    req.await_prefix(crate::kv::seq_id::SeqId::new(0), len - 1);
    assert_eq!(req.awaited_prefix(), Some((crate::kv::seq_id::SeqId::new(0), len - 1)));
    assert!(req.is_prefilling() && req.read() == 3);
    req.set_read(len - 1);
    assert_eq!((req.phase, req.awaited_prefix()), (Phase::Prefilling { read: len - 1 }, None));
    req.set_read(len);
    assert_eq!((req.phase, req.read(), req.is_prefilling()), (Phase::Decoding, len, false));
    req.finish_choice(0, crate::FinishReason::Stop);
    assert!(req.all_finished());
    engine.shutdown();
}

/// Submits `input` as a request of API key `key`.
fn submit(engine: &Engine, input: ChatInput, key: u64) -> GenerationHandle {
    let mut request = engine.prepare(input).unwrap();
    request.owner = crate::Owner::key(key);
    engine.submit(request).unwrap()
}

/// A request that runs `max_tokens` tokens: the end token is banned.
fn long(engine: &Engine, text: &str, max_tokens: u32) -> ChatInput {
    let mut input = chat(text, max_tokens);
    input.sampling.logit_bias = vec![(eos(engine), -100.0)];
    input
}

/// Whether the request's events so far include its end, without waiting.
fn ended(handle: &mut GenerationHandle) -> bool {
    let mut ended = false;
    while let Ok(event) = handle.events.try_recv() {
        ended |= matches!(event, Event::Done(_) | Event::Error(_));
    }
    ended
}

/// A fault in one request's step, at each point where a request's own processing runs, ends that
/// request with an error and its usage (billed); the requests beside it finish normally, its
/// sequences are freed, and the engine stays up and serves the next requests.
#[tokio::test]
async fn a_panic_in_one_requests_step_ends_that_request_alone() {
    let engine = start(3);
    for point in ["sampling", "drafting", "watching", "producing"] {
        let mut faulty = long(&engine, &format!("gantry-fault:{point}@3 please"), 12);
        faulty.lazy_tools = Some(lazy_tools());
        let before = submit(&engine, long(&engine, "the first neighbour", 24), 1);
        let faulty = submit(&engine, faulty, 2);
        let after = submit(&engine, long(&engine, "the second neighbour", 24), 3);
        let (events, usage) = drain(faulty).await;
        match events.last() {
            Some(Event::Error(EngineError::RequestFailed(why))) => assert!(why.contains("injected fault"), "{why}"),
            other => panic!("{point}: the faulty request ended with {other:?}"),
        }
        assert_eq!((usage.outcome, usage.completion_tokens), (Outcome::Error, 3), "{point}: the tokens it computed");
        assert!(usage.prompt_tokens > 0, "{point}");
        for neighbour in [before, after] {
            let (events, usage) = drain(neighbour).await;
            assert!(matches!(events.last(), Some(Event::Done(_))), "{point}: {events:?}");
            assert_eq!((usage.outcome, usage.completion_tokens), (Outcome::Length, 24), "{point}");
        }
        assert_eq!(engine.health(), Health::Ready, "{point}");
        // Every sequence came back: a request needing all three runs.
        let mut all = long(&engine, "all the sequences", 4);
        all.n = 3;
        let (events, usage) = drain(submit(&engine, all, 4)).await;
        assert!(matches!(events.last(), Some(Event::Done(_))), "{point}: {events:?}");
        assert_eq!(usage.completion_tokens, 12, "{point}");
    }
    engine.shutdown();
}

/// Key A queues 40 requests before key B sends one, with one sequence: B's request starts after
/// at most one more of A's (it waits one round), not after all 40.
#[tokio::test]
async fn a_key_flooding_the_queue_delays_another_keys_request_by_one_round() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (256, 1, Some(1));
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    config.admission_log = Some(log.clone());
    let engine = Engine::start(config).unwrap();
    let prepared = |text: &str, key| {
        let mut request = engine.prepare(long(&engine, text, 2)).unwrap();
        request.owner = crate::Owner::key(key);
        request
    };
    let flood: Vec<_> = (0..40).map(|i| prepared(&format!("flood {i}"), 1)).collect();
    let one = prepared("one request", 2);
    let flood: Vec<_> = flood.into_iter().map(|r| engine.submit(r).unwrap()).collect();
    let admitted_before = log.lock().unwrap().len();
    let (events, usage) = drain(engine.submit(one).unwrap()).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(usage.completion_tokens, 2);
    for handle in flood {
        assert_eq!(handle.usage.await.unwrap().completion_tokens, 2);
    }
    // Those of A's requests admitted after B came and before B: the one running, one more.
    let order = log.lock().unwrap().clone();
    assert_eq!(order.len(), 41);
    let b = order.iter().position(|&k| k == 2).unwrap();
    assert!(b <= admitted_before + 2, "B was admitted {b}th, {admitted_before} had been when it came: {order:?}");
    assert!(admitted_before < 38, "B came once A's requests had nearly all started: {admitted_before}");
    engine.shutdown();
}

/// With `max_running_per_key` 1, a key's second request waits while its first runs, though a
/// sequence is free; another key's request runs beside the first.
#[tokio::test]
async fn a_key_at_its_running_cap_waits_while_other_keys_run() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (256, 3, Some(1));
    config.max_running_per_key = Some(1);
    let engine = Engine::start(config).unwrap();
    // B's request is queued first and is short; A's first one runs far longer than it.
    let other = submit(&engine, long(&engine, "key b", 2), 2);
    let mut first = submit(&engine, long(&engine, "key a, first", 200), 1);
    let mut second = submit(&engine, long(&engine, "key a, second", 2), 1);
    let (events, _) = drain(other).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert!(!ended(&mut first), "A's first request is still running");
    assert!(
        matches!(second.events.try_recv(), Err(TryRecvError::Empty)),
        "A's second request started beside its first"
    );
    let (_, usage) = drain(first).await;
    assert_eq!(usage.completion_tokens, 200);
    let (events, usage) = drain(second).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(usage.completion_tokens, 2);
    engine.shutdown();
}

/// A short prompt arriving while a long one is read in chunks is read at once beside it (the
/// long one reading what is left of each step), and answers long before the long one's first
/// token; both answer as they would alone.
#[tokio::test]
async fn a_short_prompt_is_not_held_behind_a_long_ones_prefill() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.batch_size) = (2048, 2, Some(1), 24);
    let engine = Engine::start(config).unwrap();
    let long_text = "tell me a story about the sea ".repeat(50);
    let alone_short = drain(engine.submit(engine.prepare(greedy("hello there", 1, 4)).unwrap()).unwrap()).await;
    let long = engine.submit(engine.prepare(greedy(&long_text, 1, 4)).unwrap()).unwrap();
    let short = engine.submit(engine.prepare(greedy("hello there", 1, 4)).unwrap()).unwrap();
    let started = std::time::Instant::now();
    let timed = |handle| async move {
        let out = drain(handle).await;
        (out, started.elapsed())
    };
    let ((long_out, long_done), (short_out, short_done)) = tokio::join!(timed(long), timed(short));
    for (events, usage) in [&long_out, &short_out] {
        assert!(!events.iter().any(|e| matches!(e, Event::Error(_))), "{events:?}");
        assert_ne!(usage.outcome, Outcome::Error);
    }
    assert!(long_out.1.prompt_tokens > 300, "the long prompt spans many 24-row steps: {:?}", long_out.1);
    let text = |events: &[Event]| -> String {
        events
            .iter()
            .filter_map(|e| if let Event::Delta { text, .. } = e { Some(text.clone()) } else { None })
            .collect()
    };
    assert_eq!(text(&short_out.0), text(&alone_short.0), "the short answer is its own");
    assert!(short_done * 3 < long_done, "short answered at {short_done:?}, long at {long_done:?}");
    engine.shutdown();
}

/// One key filling the queue does not shut the others out: a newcomer queues up to its share
/// past the bound, while the flooding key stays refused.
#[tokio::test]
async fn a_key_filling_the_queue_leaves_the_others_their_share() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.max_queue) = (256, 1, Some(1), 4);
    let engine = Engine::start(config).unwrap();
    let eos = eos(&engine);
    let submit = |key: u64| {
        let mut request = engine.prepare(greedy("hello there", 1, 200)).unwrap();
        request.sampling.logit_bias = vec![(eos, -100.0)];
        request.owner = crate::Owner::key(key);
        engine.submit(request)
    };
    let mut held = vec![submit(1).unwrap()];
    // The running one leaves the queue once the scheduler takes it.
    while engine.queued() > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for _ in 0..4 {
        held.push(submit(1).unwrap());
    }
    assert!(matches!(submit(1), Err(crate::SubmitError::QueueFull(4))));
    held.push(submit(2).expect("another key queues past a queue one key filled"));
    held.push(submit(2).unwrap());
    assert!(matches!(submit(2), Err(crate::SubmitError::QueueFull(6))), "its share: half");
    assert!(matches!(submit(1), Err(crate::SubmitError::QueueFull(6))));
    drop(held);
    engine.shutdown();
}

/// The jobs of one request (a completion's several prompts) are queued all or none: a part
/// refused leaves none of the others waiting or computing.
#[tokio::test]
async fn several_jobs_are_queued_all_or_none() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.max_queue) = (256, 1, Some(1), 3);
    let engine = Engine::start(config).unwrap();
    let eos = eos(&engine);
    let request = || {
        let mut request = engine.prepare(greedy("hello there", 1, 200)).unwrap();
        request.sampling.logit_bias = vec![(eos, -100.0)];
        request
    };
    let running = engine.submit(request()).unwrap();
    while engine.queued() > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let refused = engine.submit_all((0..4).map(|_| request()).collect());
    assert!(matches!(refused, Err(crate::SubmitError::QueueFull(3))), "{:?}", refused.map(|h| h.len()));
    assert_eq!(engine.queued(), 0, "none of the refused request's jobs waits");
    let taken = engine.submit_all((0..3).map(|_| request()).collect()).unwrap();
    assert_eq!((taken.len(), engine.queued()), (3, 3));
    drop((running, taken));
    engine.shutdown();
}
