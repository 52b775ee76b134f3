//! Prefix reuse stays inside one cache scope, on the tiny model, through every path a prompt
//! can find its prefix: an idle slot, host memory, and another request prefilling it right now.

use serde_json::json;

use crate::tests::engine::{drain, tiny_model};
use crate::{CacheScope, ChatInput, Engine, EngineConfig, Generator, KvLayout, SamplingParams, Usage};

const DOCUMENT: &str = "a confidential document that one tenant sends and another one would like to read back, \
                        long enough that its cached prefix is plain to see in the usage report";

fn start(parallel: u32, host_cache_bytes: usize, kv_layout: KvLayout) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.host_cache_bytes, config.kv_layout) =
        (256, parallel, Some(1), host_cache_bytes, kv_layout);
    Engine::start(config).unwrap()
}

fn ask(scope: u64, text: &str) -> ChatInput {
    ChatInput {
        messages: vec![json!({"role": "user", "content": text})],
        tools: None,
        n: 1,
        max_tokens: Some(4),
        stop: Vec::new(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        logprobs: None,
        constraint: None,
        lazy_tools: None,
        cache_scope: CacheScope(scope),
        answer_constraint: None,
        thinking: Default::default(),
    }
}

/// The request's usage; on every path to a prefix, the cached part it announced first
/// (`Event::Cached`) is the one its usage reports.
async fn usage(engine: &Engine, input: ChatInput) -> Usage {
    let (events, usage) = drain(engine.submit(engine.prepare(input).unwrap()).unwrap()).await;
    let announced: Vec<u32> = events
        .iter()
        .filter_map(|e| if let crate::Event::Cached { tokens } = e { Some(*tokens) } else { None })
        .collect();
    assert_eq!(announced, [usage.cached_tokens], "{events:?}");
    assert!(matches!(events.first(), Some(crate::Event::Cached { .. })), "{events:?}");
    usage
}

/// An idle slot (two slots, no host memory, least recently used slots taken first so the
/// victim's stays) and host memory (the victim's sequence is offloaded once idle): the other
/// scope reuses nothing, the victim's own scope still reuses all but the last prompt token.
#[tokio::test]
async fn a_prompt_cached_in_one_scope_is_not_reused_from_another() {
    for (parallel, host_bytes, layout) in
        [(2, 0, KvLayout::Unified), (1, 64 << 20, KvLayout::PerSequence), (2, 64 << 20, KvLayout::PerSequence)]
    {
        let engine = start(parallel, host_bytes, layout);
        let victim = usage(&engine, ask(1, DOCUMENT)).await;
        assert_eq!(victim.cached_tokens, 0);
        let attacker = usage(&engine, ask(2, DOCUMENT)).await;
        assert_eq!(attacker.cached_tokens, 0, "parallel {parallel}, host {host_bytes}: {attacker:?}");
        let attacker_again = usage(&engine, ask(2, &format!("{DOCUMENT} and more"))).await;
        assert!(attacker_again.cached_tokens > 0, "its own scope's prefix is reused: {attacker_again:?}");
        let same_scope = usage(&engine, ask(1, DOCUMENT)).await;
        assert_eq!(same_scope.cached_tokens, same_scope.prompt_tokens - 1, "parallel {parallel}, host {host_bytes}");
        engine.shutdown();
    }
}

/// A prompt submitted while another scope's request with the same prompt is queued or
/// prefilling computes its own prefix instead of waiting to copy the other's.
#[tokio::test]
async fn a_prompt_being_prefilled_is_not_shared_across_scopes() {
    let engine = start(2, 64 << 20, KvLayout::PerSequence);
    let victim = engine.submit(engine.prepare(ask(1, DOCUMENT)).unwrap()).unwrap();
    let attacker = engine.submit(engine.prepare(ask(2, DOCUMENT)).unwrap()).unwrap();
    let (victim, attacker) = tokio::join!(drain(victim), drain(attacker));
    assert_eq!((victim.1.cached_tokens, attacker.1.cached_tokens), (0, 0));
    // The same burst within one scope computes the prefix once.
    let first = engine.submit(engine.prepare(ask(3, &format!("{DOCUMENT}!"))).unwrap()).unwrap();
    let second = engine.submit(engine.prepare(ask(3, &format!("{DOCUMENT}!"))).unwrap()).unwrap();
    let (first, second) = tokio::join!(drain(first), drain(second));
    assert_eq!(first.1.cached_tokens, 0, "the other scopes' prefix is not reused");
    assert!(second.1.cached_tokens > 0, "{:?}", second.1);
    engine.shutdown();
}
