//! Quantized KV caches (`--kv-type`): served end to end, refused where the model's heads are not
//! whole blocks, and measured against f16 (`measure_kv_quality`) on a tiny model and, where this
//! machine has pulled one, on a real model and real text.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::tests::engine::{drain, input, written_once};
use crate::{measure_kv_quality, Engine, EngineConfig, Event, Generator, KvType, LoadError};

/// A tiny model whose heads are 32 values (128 / 4), one whole quantized block.
fn tiny_whole_blocks() -> &'static PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    written_once(&MODEL, "tiny-heads-32", || tiny_gguf::TinyModelSpec {
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        ..tiny_gguf::TinyModelSpec::default()
    })
}

/// Plain English, as a user would send: the quality figures are about real text.
const TEXT: &str = include_str!("../../../../docs/architecture.md");

#[test]
fn f16_measures_exactly_zero_and_quantized_types_measurably_more() {
    let model = tiny_whole_blocks();
    let f16 = measure_kv_quality(model, KvType::F16, TEXT, 300, 1).unwrap();
    assert_eq!((f16.tokens, f16.mean_kl, f16.max_kl, f16.top1_agreement), (300, 0.0, 0.0, 1.0), "{f16:?}");
    let q8 = measure_kv_quality(model, KvType::Q8_0, TEXT, 300, 1).unwrap();
    let q4 = measure_kv_quality(model, KvType::Q4_0, TEXT, 300, 1).unwrap();
    // The cache type is applied (the logits change) and q4_0 loses more than q8_0.
    assert!(q8.mean_kl > 0.0 && q4.mean_kl > q8.mean_kl, "{q8:?} {q4:?}");
    assert!(q8.max_kl >= q8.mean_kl && q8.top1_agreement <= 1.0, "{q8:?}");
}

#[tokio::test]
async fn a_quantized_cache_serves_copies_and_shares_like_f16() {
    for kv_type in [KvType::Q8_0, KvType::Q4_0] {
        let mut config = EngineConfig::new(tiny_whole_blocks());
        (config.ctx_size, config.parallel, config.threads, config.kv_type) = (256, 2, Some(1), kv_type);
        let engine = Engine::start(config).unwrap();
        // Two choices: the prompt is computed once and its entries copied to the second sequence.
        let mut two = input(6, Vec::new());
        two.n = 2;
        let (events, usage) = drain(engine.submit(engine.prepare(two).unwrap()).unwrap()).await;
        assert!(matches!(events.last(), Some(Event::Done(_))), "{kv_type}: {events:?}");
        assert_eq!(usage.completion_tokens, 12, "{kv_type}: both choices ran to max_tokens");
        // The same prompt again reuses the cached prefix.
        let (_, again) = drain(engine.submit(engine.prepare(input(4, Vec::new())).unwrap()).unwrap()).await;
        assert!(again.cached_tokens > 0, "{kv_type}: {again:?}");
        engine.shutdown();
    }
}

#[test]
fn a_model_whose_heads_are_not_whole_blocks_is_refused_with_the_reason() {
    let mut config = EngineConfig::new(crate::tests::engine::tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.kv_type) = (256, 1, Some(1), KvType::Q8_0);
    let Err(LoadError::Context(why)) = Engine::start(config) else { panic!("a 16-value head cannot be q8_0") };
    assert!(why.contains("blocks of 32") && why.contains("use f16"), "{why}");
}

/// What the configuration page reports for the default model (4,096 tokens of this text: q8_0
/// mean KL 0.0087, top-1 agreement 95.1%; q4_0 2.1 and 39%), within a margin: q8_0 stays close
/// (if short of the 99% agreement that would make it the default), and q4_0 loses far more.
#[test]
fn on_a_real_model_q8_0_stays_close_and_q4_0_loses_more() {
    let Some(model) = tiny_gguf::pulled::default_model("q8_0's quality on it is not checked") else { return };
    let q8 = measure_kv_quality(&model, KvType::Q8_0, TEXT, 512, 2).unwrap();
    let q4 = measure_kv_quality(&model, KvType::Q4_0, TEXT, 512, 2).unwrap();
    eprintln!("{}: {q8:?} {q4:?}", model.display());
    assert!(q8.mean_kl < 0.05 && q8.top1_agreement > 0.9, "{q8:?}");
    assert!(q4.mean_kl > 2.0 * q8.mean_kl && q4.top1_agreement < q8.top1_agreement, "{q8:?} {q4:?}");
}
