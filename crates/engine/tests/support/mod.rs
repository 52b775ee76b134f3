//! What the engine's end-to-end tests of the K-quant copies share: each level's test runs in a
//! process of its own (the kernels are put in place once a process, and copies are kept
//! process-wide, so any model freed in another test would drop them).

use std::time::{Duration, Instant};

use gantry_engine::{ChatInput, CpuKernels, Engine, EngineConfig, Event, Generator, SamplingParams};

/// With `kernels` (whose level is `level`): an engine on the pulled default model makes its
/// copies at start, as many bytes as its memory estimate counts, and ggml repacks nothing; it
/// answers a request of two choices (two activation rows a step) from them, and they go with its
/// model.
pub(crate) fn an_engine_answers_from_its_copies(kernels: CpuKernels, level: &str) {
    let Some(model) = tiny_gguf::pulled::default_model("the K-quant copies are not run end to end") else {
        return;
    };
    let mut config = EngineConfig::new(&model);
    (config.ctx_size, config.parallel, config.threads) = (1024, 2, Some(2));
    let without = config.estimate_memory().unwrap();
    // As `gantry serve` does: copies asked for before the kernels are put in place, which then
    // leave ggml nothing to repack (the 0.5B's Q4_K matrices are served from their copies).
    gantry_engine::serve_k_quant_copies(true);
    assert_eq!(gantry_engine::use_cpu_kernels(kernels, &[&model]), level);
    assert!(gantry_engine::k_quant_copies_served(), "every level of Gantry's kernels serves the copies");
    assert!(!gantry_engine::weights_repacked(), "Q4_K is served from its copies");
    let with = config.estimate_memory().unwrap();
    // The 0.5B's FFN down projections: 12 Q4_K and 12 Q6_K matrices of 896 rows.
    assert!(with.weights > without.weights, "{with:?} against {without:?}");
    assert_eq!(gantry_engine::k_quant_copies_made(), (0, 0));

    let engine = Engine::start(config).unwrap();
    let (bytes, matrices) = gantry_engine::k_quant_copies_made();
    assert_eq!(bytes, with.weights - without.weights, "the estimate counts what was made");
    assert_eq!(matrices, 24);

    let input = ChatInput {
        messages: vec![
            serde_json::json!({"role": "user", "content": "Write a Python function that adds two numbers."}),
        ],
        tools: None,
        n: 2,
        max_tokens: Some(24),
        stop: Vec::new(),
        sampling: SamplingParams { temperature: 0.0, ignore_eos: true, ..SamplingParams::default() },
        logprobs: None,
        constraint: None,
        lazy_tools: None,
        cache_scope: Default::default(),
        answer_constraint: None,
        thinking: Default::default(),
    };
    let mut handle = engine.submit(engine.prepare(input).unwrap()).unwrap();
    let mut text = [String::new(), String::new()];
    while let Some(event) = handle.events.blocking_recv() {
        match event {
            Event::Delta { choice, text: t, .. } => text[choice as usize].push_str(&t),
            Event::Done(_) => break,
            Event::Error(e) => panic!("{e:?}"),
            _ => {}
        }
    }
    let usage = handle.usage.blocking_recv().unwrap();
    assert_eq!(usage.completion_tokens, 48, "{text:?}");
    // Two greedy choices of one prompt: the same text, and code.
    assert_eq!(text[0], text[1]);
    assert!(text[0].contains("def "), "{text:?}");
    assert_eq!(gantry_engine::k_quant_copies_made().1, 24, "nothing was copied again");

    engine.shutdown();
    drop(engine);
    // The model goes once its last holder (the scheduler thread, a grammar warm-up) lets go.
    let deadline = Instant::now() + Duration::from_secs(60);
    while gantry_engine::k_quant_copies_made() != (0, 0) {
        assert!(Instant::now() < deadline, "the copies outlived their model");
        std::thread::sleep(Duration::from_millis(50));
    }
}
