//! Device sampling on the CPU backend, which runs the same ggml graph a GPU would: its draws
//! follow the tempered distribution of the model's own logits, a sequence switched back to the host
//! gets logits again, and the engine serves sampled, greedy and logprobs requests side by side.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::{raw_context, ChainKey, DeviceSamplers};
use crate::kv::seq_id::SeqId;
use crate::model::backend::llama_backend;
use crate::model::LoadedModel;
use crate::scheduler::sample::sampler::tests::{chi_square, reference};
use crate::tests::engine::{drain, input, logging_moves, submit_together, tiny_model};
use crate::{DeviceSampling, Engine, EngineConfig, Event, Generator, Offload, SamplingParams};

const PROMPT: [i32; 4] = [5, 17, 42, 9];

fn sampled(temperature: f32, top_p: f32) -> SamplingParams {
    SamplingParams { temperature, top_p, ..SamplingParams::default() }
}

/// Decodes `PROMPT` into `seq` from position 0, its last row wanting an output.
fn decode_prompt(ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>, seq: i32) {
    let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
    batch.clear();
    for (i, &t) in PROMPT.iter().enumerate() {
        batch.add(LlamaToken(t), i as i32, &[seq], i + 1 == PROMPT.len()).unwrap();
    }
    ctx.decode(batch).unwrap();
}

#[test]
fn device_draws_follow_the_tempered_distribution_and_the_host_gets_logits_back() {
    let model = LoadedModel::load(tiny_model(), None, 1, &Offload::default()).unwrap();
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(64))
        .with_n_batch(16)
        .with_n_ubatch(16)
        .with_n_seq_max(2)
        .with_n_threads(1)
        .with_n_threads_batch(1);
    let mut ctx = model.llama.new_context(llama_backend(), params).unwrap();
    assert!(raw_context(&ctx).is_some(), "llama-cpp-2's Debug no longer shows the context's handle");
    let mut batch = LlamaBatch::new(16, 2);
    let last = PROMPT.len() as i32 - 1;

    decode_prompt(&mut ctx, &mut batch, 1);
    let logits: Vec<f64> = ctx.get_logits_ith(last).iter().map(|&l| f64::from(l)).collect();

    let temperature = 0.8;
    let key = ChainKey::for_request(&sampled(temperature, 1.0), false);
    let mut device = DeviceSamplers::new(&ctx).unwrap();
    assert!(device.assign(SeqId::new(0), key), "the CPU backend runs temperature and dist");
    assert!(device.assign(SeqId::new(0), key), "the same chain stays");
    assert_eq!(device.attached(), 1);
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..3000 {
        decode_prompt(&mut ctx, &mut batch, 0);
        let token = ctx.sampled_token_ith(last).expect("a token sampled on the device");
        counts[token.0 as usize] += 1;
    }
    let probs = reference(&logits, f64::from(temperature), 1.0);
    let (stat, critical) = chi_square(&counts, &probs);
    assert!(stat < critical, "chi-square {stat:.1} above {critical:.1}");
    // The same draws do not fit another temperature: the test can fail.
    let (off, _) = chi_square(&counts, &reference(&logits, 1.6, 1.0).iter().map(|p| p.max(1e-12)).collect::<Vec<_>>());
    assert!(off > critical, "a wrong reference is told apart ({off:.1} vs {critical:.1})");

    assert!(!device.assign(SeqId::new(0), None), "back to the host");
    assert_eq!(device.attached(), 0);
    decode_prompt(&mut ctx, &mut batch, 0);
    assert_eq!(ctx.sampled_token_ith(last), None);
    let again: Vec<f64> = ctx.get_logits_ith(last).iter().map(|&l| f64::from(l)).collect();
    let close = again.iter().zip(&logits).all(|(a, b)| (a - b).abs() < 1e-3);
    assert!(close, "seq 0's logits are the model's again");
}

#[test]
fn only_a_temperature_is_sampled_on_the_device() {
    assert!(ChainKey::for_request(&sampled(0.7, 1.0), false).is_some());
    assert!(ChainKey::for_request(&sampled(0.7, 0.95), false).is_none(), "top-p sorts the vocabulary there");
    assert!(ChainKey::for_request(&sampled(0.7, 1.0), true).is_none(), "the request needs the host");
    assert!(ChainKey::for_request(&sampled(0.0, 1.0), false).is_none(), "greedy stays exact on the host");
    let host = [
        SamplingParams { seed: Some(1), ..sampled(0.7, 1.0) },
        SamplingParams { logit_bias: vec![(3, 1.0)], ..sampled(0.7, 1.0) },
        SamplingParams { presence_penalty: 0.5, ..sampled(0.7, 1.0) },
        SamplingParams { frequency_penalty: 0.5, ..sampled(0.7, 1.0) },
    ];
    for params in host {
        assert!(ChainKey::for_request(&params, false).is_none(), "{params:?}");
    }
    assert_ne!(ChainKey::for_request(&sampled(0.7, 1.0), false), ChainKey::for_request(&sampled(0.9, 1.0), false));
}

fn engine(device_sampling: DeviceSampling) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    config.ctx_size = 256;
    config.parallel = 4;
    config.threads = Some(1);
    config.device_sampling = device_sampling;
    // Greedy rows apart from the others, so its text cannot depend on the batch (`deterministic`).
    config.deterministic_greedy = true;
    Engine::start(config).unwrap()
}

/// The text of each request, run together, and the tokens each was billed.
async fn run_together(engine: &Engine, requests: Vec<crate::ChatInput>) -> Vec<(String, u32)> {
    let handles: Vec<_> = requests.into_iter().map(|r| engine.submit(engine.prepare(r).unwrap()).unwrap()).collect();
    let mut out = Vec::new();
    for handle in handles {
        let (events, usage) = drain(handle).await;
        assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
        let delta = |e: &Event| if let Event::Delta { text, .. } = e { Some(text.clone()) } else { None };
        let text: String = events.iter().filter_map(delta).collect();
        out.push((text, usage.completion_tokens));
    }
    out
}

fn mixed() -> Vec<crate::ChatInput> {
    let mut greedy = input(16, vec![]);
    greedy.logprobs = None;
    let logprobs = crate::ChatInput { sampling: sampled(0.9, 1.0), ..input(16, vec![]) };
    let on_device = |t| crate::ChatInput { sampling: sampled(t, 1.0), logprobs: None, ..input(16, vec![]) };
    vec![greedy, logprobs, on_device(0.7), on_device(1.1)]
}

#[tokio::test]
async fn the_engine_serves_device_and_host_sampling_in_one_batch() {
    let host = engine(DeviceSampling::Off);
    let reference = run_together(&host, mixed()).await;
    host.shutdown();

    let device = engine(DeviceSampling::On);
    for round in 0..3 {
        let got = run_together(&device, mixed()).await;
        assert_eq!(got[0], reference[0], "round {round}: greedy is unchanged");
        for (text, billed) in &got {
            assert!(*billed > 0 && *billed <= 16, "round {round}: {billed} tokens billed for {text:?}");
        }
    }
    device.shutdown();
}

/// A sequence keeps its device chain after its request ends, and an idle one is emptied into host
/// memory; a host-sampled choice moved down into it (`compact`) must take the chain off, or
/// llama.cpp samples that choice itself and refuses the drafts it verifies.
#[tokio::test]
async fn a_host_choice_moved_onto_a_sequence_left_with_a_device_chain_takes_it_off() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads) = (256, 4, Some(1));
    config.device_sampling = DeviceSampling::On;
    let (moves, turns) = logging_moves(&mut config);
    let engine = Engine::start(config).unwrap();
    let on_device = || crate::ChatInput { sampling: sampled(0.8, 1.0), logprobs: None, ..input(4, vec![]) };
    let host = || {
        let mut i = input(24, vec![]);
        (i.logprobs, i.messages) = (None, vec![serde_json::json!({"role": "user", "content": "abc abc abc abc"})]);
        i
    };
    // Three requests sample on the device and one on the host, with the prompt asked again
    // below. The device ones end first; their sequences, emptied into host memory, keep their
    // chains, and the host one moves down into one of them.
    for handle in submit_together(&engine, &turns, vec![on_device(), on_device(), on_device(), host()]) {
        let (events, _) = drain(handle).await;
        assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    }
    // Its prompt again, continued where it now is: on a sequence a device chain was left on.
    let (events, usage) = drain(engine.submit(engine.prepare(host()).unwrap()).unwrap()).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert!(usage.completion_tokens > 1, "{usage:?}");
    let moves = moves.lock().unwrap();
    assert!(moves.iter().flatten().any(|&(_, to)| to < 3), "a host choice moved down: {moves:?}");
    drop(moves);
    engine.shutdown();
}

/// Past `device_sampling_max_streams` busy sequences a new request samples on the host. Seen
/// through compaction, which moves host choices only: a two-choice greedy request takes 0–1, a
/// temperature-only one 2 (3 busy: on the device), another 3 (4 busy: on the host). When the
/// first ends, only the one on 3 moves down. The tiny model's random weights give its end token
/// a fair chance: a run where a sampled answer drew it early shows nothing, and is run again.
#[tokio::test]
async fn past_a_few_busy_sequences_new_requests_sample_on_the_host() {
    for _ in 0..6 {
        let mut config = EngineConfig::new(tiny_model());
        (config.ctx_size, config.parallel, config.threads) = (256, 4, Some(1));
        (config.device_sampling, config.device_sampling_max_streams) = (DeviceSampling::On, Some(3));
        let (moves, turns) = logging_moves(&mut config);
        let engine = Engine::start(config).unwrap();
        let greedy = crate::ChatInput { n: 2, logprobs: None, ..input(2, vec![]) };
        let on_device = || crate::ChatInput { sampling: sampled(0.8, 1.0), logprobs: None, ..input(16, vec![]) };
        let mut ended_early = false;
        for handle in submit_together(&engine, &turns, vec![greedy, on_device(), on_device()]) {
            let (events, usage) = drain(handle).await;
            assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
            ended_early |= usage.outcome != crate::request::Outcome::Length;
        }
        engine.shutdown();
        if !ended_early {
            assert_eq!(*moves.lock().unwrap(), [vec![(3, 0)]]);
            return;
        }
    }
    panic!("in every run a sampled answer drew the end token early");
}
