//! The engine end to end on a tiny random-weight model: prepare, logprobs accounting, and
//! what happens when the scheduler thread dies.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::json;

use crate::{
    ChatInput, Constraint, Engine, EngineConfig, EngineError, Event, Generator, Health, Outcome, PrepareError,
    SamplingParams, SubmitError, Usage,
};

/// The tiny model `spec` makes, written once per test process into `cell` as `<name>.gguf`.
pub(crate) fn written_once(
    cell: &'static OnceLock<PathBuf>,
    name: &str,
    spec: impl FnOnce() -> tiny_gguf::TinyModelSpec,
) -> &'static PathBuf {
    cell.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-engine-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.gguf"));
        tiny_gguf::write_tiny_model(&path, &spec()).unwrap();
        path
    })
}

pub(crate) fn tiny_model() -> &'static PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    written_once(&MODEL, "tiny", tiny_gguf::TinyModelSpec::default)
}

/// An engine on `model`: `ctx_size` tokens a sequence, `parallel` sequences, one thread.
pub(crate) fn start_on(model: &std::path::Path, ctx_size: u32, parallel: u32) -> Engine {
    let mut config = EngineConfig::new(model);
    (config.ctx_size, config.parallel, config.threads) = (ctx_size, parallel, Some(1));
    Engine::start(config).unwrap()
}

pub(crate) fn start(parallel: u32, panic_after_tokens: Option<u32>) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    config.ctx_size = 256;
    config.parallel = parallel;
    config.threads = Some(1);
    config.panic_after_tokens = panic_after_tokens;
    Engine::start(config).unwrap()
}

pub(crate) fn input(max_tokens: u32, logit_bias: Vec<(i32, f32)>) -> ChatInput {
    ChatInput {
        messages: vec![json!({"role": "user", "content": "hello there"})],
        tools: None,
        n: 1,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        sampling: SamplingParams { temperature: 0.0, logit_bias, ..SamplingParams::default() },
        logprobs: Some(2),
        constraint: None,
        lazy_tools: None,
        cache_scope: crate::CacheScope::default(),
        answer_constraint: None,
        thinking: Default::default(),
    }
}

/// The tiny vocabulary ends with `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (the EOS).
pub(crate) fn eos(engine: &Engine) -> i32 {
    let id = engine.model_info().n_vocab - 1;
    assert!(engine.model().is_end_of_generation(id), "token {id} ends generation");
    id
}

/// Every event of a request until its last one, and its usage report.
pub(crate) async fn drain(mut handle: crate::GenerationHandle) -> (Vec<Event>, Usage) {
    let mut events = Vec::new();
    while let Some(event) = handle.events.recv().await {
        let last = matches!(event, Event::Done(_) | Event::Error(_));
        events.push(event);
        if last {
            break;
        }
    }
    (events, handle.usage.await.expect("the engine reports usage"))
}

/// Submits `inputs` so that the scheduler has them all before its next decode: each prepared
/// first, then all sent while `turns` (the engine's `decode_turns`) is held. A test that needs
/// requests running side by side on known sequences uses this: the tiny model's steps are
/// faster than preparing a request, so one sent after another could find the first finished.
pub(crate) fn submit_together(
    engine: &Engine,
    turns: &std::sync::Mutex<()>,
    inputs: Vec<crate::ChatInput>,
) -> Vec<crate::GenerationHandle> {
    let prepared: Vec<_> = inputs.into_iter().map(|i| engine.prepare(i).unwrap()).collect();
    let _held = turns.lock().unwrap();
    prepared.into_iter().map(|p| engine.submit(p).unwrap()).collect()
}

/// Makes `config`'s engine log its moves (`compact`) and hand out its decode turns (for
/// `submit_together`).
pub(crate) fn logging_moves(
    config: &mut crate::EngineConfig,
) -> (crate::scheduler::step::compact::MovesLog, std::sync::Arc<std::sync::Mutex<()>>) {
    let (moves, turns) = (crate::scheduler::step::compact::MovesLog::default(), std::sync::Arc::default());
    (config.moves_log, config.decode_turns) = (Some(moves.clone()), Some(std::sync::Arc::clone(&turns)));
    (moves, turns)
}

pub(crate) fn logprob_entries(events: &[Event]) -> usize {
    events.iter().map(|e| if let Event::Delta { logprobs, .. } = e { logprobs.len() } else { 0 }).sum()
}

#[tokio::test]
async fn every_billed_token_has_one_logprobs_entry_the_end_token_included() {
    let engine = start(1, None);
    let eos = eos(&engine);
    // Forced to end at once: one token, the end-of-generation token, billed and listed.
    let request = engine.prepare(input(8, vec![(eos, 100.0)])).unwrap();
    let (events, usage) = drain(engine.submit(request).unwrap()).await;
    assert_eq!(usage.completion_tokens, 1, "{events:?}");
    assert_eq!(logprob_entries(&events), 1, "{events:?}");
    // The cached part of the prompt is said first, then the text.
    let [Event::Cached { tokens }, Event::Delta { text, logprobs, .. }, ..] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(*tokens, usage.cached_tokens);
    assert_eq!((text.as_str(), logprobs[0].token.as_str()), ("", ""));
    // Cut by max_tokens with the end token forbidden: still one entry per billed token.
    let request = engine.prepare(input(5, vec![(eos, -100.0)])).unwrap();
    let (events, usage) = drain(engine.submit(request).unwrap()).await;
    assert_eq!(usage.completion_tokens, 5);
    assert_eq!(logprob_entries(&events), 5, "{events:?}");
    engine.shutdown();
}

#[tokio::test]
async fn prepare_refuses_what_the_engine_cannot_run() {
    let engine = start(2, None);
    let mut three = input(4, vec![]);
    three.n = 3;
    assert!(matches!(engine.prepare(three), Err(PrepareError::TooManyChoices { n: 3, slots: 2 })));
    let n_vocab = engine.model_info().n_vocab;
    assert!(matches!(engine.prepare(input(4, vec![(n_vocab, 1.0)])), Err(PrepareError::LogitBias { .. })));
    assert!(matches!(engine.prepare(input(300, vec![])), Err(PrepareError::ContextLength { limit: 256, .. })));
    let ok = engine.prepare(input(4, vec![])).unwrap();
    assert_eq!((ok.n, ok.max_tokens), (1, 4));
    assert!(!ok.prompt.tokens.is_empty());
    assert!(ok.sampling.logit_bias.is_empty());
    // `ignore_eos` bans every end-of-generation token, and only those.
    let mut endless = input(4, vec![(7, 2.0)]);
    endless.sampling.ignore_eos = true;
    let banned = engine.prepare(endless).unwrap().sampling.logit_bias;
    assert!(banned.contains(&(eos(&engine), -100.0)) && banned.contains(&(7, 2.0)), "{banned:?}");
    assert!(banned
        .iter()
        .filter(|(t, _)| *t != 7)
        .all(|&(t, b)| b == -100.0 && engine.model().is_end_of_generation(t)));
    engine.shutdown();
}

/// A base model's GGUF often has no chat template: the model loads (it can still complete text),
/// and a chat on it is refused as the client's to fix, with no template made up.
#[tokio::test]
async fn a_model_without_a_chat_template_loads_and_refuses_chats() {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    let path =
        written_once(&MODEL, "no-template", || tiny_gguf::TinyModelSpec { chat_template: None, ..Default::default() });
    let engine = start_on(path, 256, 1);
    assert_eq!(engine.model_info().chat_template, None);
    let refused = engine.prepare(input(4, vec![]));
    assert!(matches!(refused, Err(PrepareError::Template(crate::TemplateError::Missing))), "{refused:?}");
    engine.shutdown();
}

#[tokio::test]
async fn a_panicking_scheduler_fails_every_request_bills_what_ran_and_refuses_new_work() {
    // One slot: the first request runs (and trips the panic), the second waits in the queue.
    // The scheduler's first decode waits for this turn, so both are queued before the panic (a
    // request submitted after it would be refused).
    let turns = Arc::new(Mutex::new(()));
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (256, 1, Some(1));
    (config.panic_after_tokens, config.decode_turns) = (Some(3), Some(turns.clone()));
    let engine = Engine::start(config).unwrap();
    let eos = eos(&engine);
    let mut health = engine.watch_health();
    let turn = turns.lock().unwrap();
    let running = engine.submit(engine.prepare(input(50, vec![(eos, -100.0)])).unwrap()).unwrap();
    let queued = engine.submit(engine.prepare(input(50, vec![(eos, -100.0)])).unwrap()).unwrap();
    drop(turn);
    let (events, usage) = drain(running).await;
    assert!(matches!(events.last(), Some(Event::Error(EngineError::Crashed(_)))), "{events:?}");
    assert_eq!(usage.outcome, Outcome::Error);
    assert_eq!(usage.completion_tokens, 3, "the tokens generated before the panic are reported");
    assert_eq!(logprob_entries(&events), 3);
    let (events, usage) = drain(queued).await;
    assert!(matches!(events.as_slice(), [Event::Error(EngineError::Crashed(_))]), "{events:?}");
    assert_eq!((usage.completion_tokens, usage.outcome), (0, Outcome::Error));

    health.wait_for(|h| matches!(h, Health::Failed(_))).await.unwrap();
    assert!(matches!(engine.health(), Health::Failed(why) if why.contains("test-only panic")));
    let refused = engine.submit(engine.prepare(input(4, vec![])).unwrap());
    assert!(matches!(refused, Err(SubmitError::Failed(_))));
    engine.shutdown();
}

fn say(text: &str, max_tokens: u32) -> ChatInput {
    ChatInput { messages: vec![json!({"role": "user", "content": text})], ..input(max_tokens, vec![]) }
}

async fn answer(engine: &Engine, input: ChatInput) -> (String, Usage) {
    let (events, usage) = drain(engine.submit(engine.prepare(input).unwrap()).unwrap()).await;
    let text = events.iter().filter_map(|e| if let Event::Delta { text, .. } = e { Some(text.as_str()) } else { None });
    (text.collect(), usage)
}

/// Greedy decoding without anything else in the sampling chain takes the highest logit directly
/// (see `sampling::Sampler`); a zero logit bias changes no logit but puts llama.cpp's own chain
/// (bias, then its greedy sampler) in charge. Both must pick the same tokens.
#[tokio::test]
async fn the_greedy_shortcut_picks_what_llama_cpps_greedy_chain_picks() {
    let engine = start(1, None);
    for text in ["hello there", "count the stars", "the quick brown fox"] {
        let shortcut = answer(&engine, say(text, 24)).await;
        let mut biased = say(text, 24);
        biased.sampling.logit_bias = vec![(3, 0.0)];
        let chained = answer(&engine, biased).await;
        assert_eq!(shortcut.1.completion_tokens, chained.1.completion_tokens, "{text}");
        assert!(shortcut.1.completion_tokens > 0, "{text}");
        assert_eq!(shortcut.0, chained.0, "{text}");
    }
    engine.shutdown();
}

/// A conversation whose slot was taken by another prompt (one slot), or whose idle slot was
/// emptied while another sequence decoded (two), comes back from host memory: all of its prompt
/// but the last token is reported cached, and the answer is the same. Without host memory only
/// the part the other prompt shares with it (the template's opening) is left.
#[tokio::test]
async fn a_conversation_pushed_out_of_the_kv_cache_comes_back_from_host_memory() {
    let long = "a long first message that the second request does not share, long enough to matter";
    for (parallel, host_bytes) in [(1, 64 << 20), (2, 64 << 20), (1, 0)] {
        let mut config = EngineConfig::new(tiny_model());
        (config.ctx_size, config.parallel, config.threads, config.host_cache_bytes) =
            (256, parallel, Some(1), host_bytes);
        let engine = Engine::start(config).unwrap();
        let (first, usage) = answer(&engine, say(long, 6)).await;
        assert_eq!(usage.cached_tokens, 0);
        let (_, other) = answer(&engine, say("something else entirely", 6)).await;
        let (again, usage) = answer(&engine, say(long, 6)).await;
        if host_bytes > 0 {
            assert_eq!(usage.cached_tokens, usage.prompt_tokens - 1, "parallel {parallel}");
            assert_eq!(again, first, "parallel {parallel}");
        } else {
            assert!(usage.cached_tokens > 0 && usage.cached_tokens <= other.prompt_tokens / 2, "{usage:?}");
        }
        engine.shutdown();
    }
}

#[tokio::test]
async fn a_call_fenced_after_prose_is_held_to_its_schema_from_the_fence_on() {
    use crate::tools::{fenced_grammar, CallStart, CallWatch};
    let engine = start(1, None);
    let model = engine.model();
    let rules = "fenced_calls: \"```\" /[a-z]*/ \"\\n\" body \"\\n```\"\n\
                 body: %json {\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, \
                 \"arguments\": {\"type\": \"object\", \"properties\": {\"unit\": {\"enum\": [\"celsius\", \"fahrenheit\"]}}, \
                 \"required\": [\"unit\"], \"additionalProperties\": false}}, \"required\": [\"name\", \"arguments\"], \
                 \"additionalProperties\": false}\n";
    // Prose with quotes, a backslash, a line break and a non-ASCII character, then the call.
    let output = "Let's see: \"Zürich\" \\ done.\n```json\n{\"name\": \"get_weather\", \"arguments\": {";
    let tokens = model.tokenize(output);
    let mut watch = CallWatch::new();
    let mut start = None;
    for t in &tokens {
        start = start.or(watch.push(&model.piece(*t), &["get_weather".to_string()], None));
    }
    let prefix = output.find("```").unwrap();
    assert_eq!(start, Some(CallStart::Fenced { prefix }));
    let grammar = Constraint::Lark(fenced_grammar(rules, &output[..prefix]));
    let mut matcher = model
        .constraint_matcher(&grammar, crate::CacheScope::default(), &tokens)
        .expect("the output so far fits the grammar");
    let as_u32 = |s: &str| model.tokenize(s).into_iter().map(|t| t as u32).collect::<Vec<_>>();
    let metric = as_u32("\"unit\": \"metric\"");
    assert!(matcher.try_consume_tokens(&metric).unwrap() < metric.len(), "the grammar let \"metric\" through");
    let mut matcher = model.constraint_matcher(&grammar, crate::CacheScope::default(), &tokens).unwrap();
    let celsius = as_u32("\"unit\": \"celsius\"}}\n```");
    assert_eq!(matcher.try_consume_tokens(&celsius).unwrap(), celsius.len());
    assert!(matcher.is_accepting().unwrap());
}
