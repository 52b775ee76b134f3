//! The sampler through the engine, on the tiny model's real logits: its first tokens follow the
//! distribution OpenAI's parameters define over the model's own log-softmax, and a seeded
//! request says the same thing twice.

use std::collections::HashMap;

use crate::scheduler::sample::sampler::tests::{chi_square, reference};
use crate::tests::engine::{drain, input, start};
use crate::{Engine, Event, Generator, SamplingParams};

/// Every token's (bytes, logprob) at the first position of `input(…)`'s answer.
async fn first_position(engine: &Engine) -> Vec<(Vec<u8>, f64)> {
    let n_vocab = engine.model_info().n_vocab as u32;
    let mut request = input(1, vec![]);
    request.logprobs = Some(n_vocab);
    let (events, _) = drain(engine.submit(engine.prepare(request).unwrap()).unwrap()).await;
    let Some(Event::Delta { logprobs, .. }) = events.iter().find(|e| matches!(e, Event::Delta { .. })) else {
        panic!("{events:?}")
    };
    let top = &logprobs[0].top;
    assert_eq!(top.len(), n_vocab as usize);
    top.iter().map(|t| (t.bytes.clone(), f64::from(t.logprob))).collect()
}

/// The first token's bytes of each choice of `requests` requests of `n` choices, each seeded.
async fn first_tokens(engine: &Engine, sampling: &SamplingParams, requests: u64, n: u32) -> Vec<Vec<u8>> {
    let mut drawn = Vec::new();
    for seed in 0..requests {
        let mut request = input(1, vec![]);
        request.n = n;
        request.logprobs = Some(0);
        request.sampling = SamplingParams { seed: Some(1000 + seed), ..sampling.clone() };
        let (events, _) = drain(engine.submit(engine.prepare(request).unwrap()).unwrap()).await;
        for e in &events {
            if let Event::Delta { logprobs, .. } = e {
                drawn.extend(logprobs.iter().map(|l| l.bytes.clone()));
            }
        }
    }
    assert_eq!(drawn.len() as u64, requests * u64::from(n));
    drawn
}

#[tokio::test]
async fn first_tokens_follow_the_tiny_models_tempered_nucleus() {
    let engine = start(8, None);
    let tokens = first_position(&engine).await;
    // A logit bias on the token the model likes most after the top one (its bytes its own).
    let count = |bytes: &[u8]| tokens.iter().filter(|(b, _)| b.as_slice() == bytes).count();
    let biased = (1..tokens.len()).find(|&k| count(&tokens[k].0) == 1).unwrap();
    let id = (0..engine.model_info().n_vocab).find(|&t| engine.model().piece(t) == tokens[biased].0).unwrap();
    let sampling =
        SamplingParams { temperature: 0.8, top_p: 0.9, logit_bias: vec![(id, 3.0)], ..SamplingParams::default() };
    let drawn = first_tokens(&engine, &sampling, 500, 8).await;
    engine.shutdown();

    let mut adjusted: Vec<f64> = tokens.iter().map(|&(_, lp)| lp).collect();
    adjusted[biased] += 3.0;
    let probs = reference(&adjusted, 0.8, 0.9);
    // Tokens that spell the same bytes are one outcome.
    let mut groups: HashMap<&[u8], usize> = HashMap::new();
    for (b, _) in &tokens {
        let next = groups.len();
        groups.entry(b.as_slice()).or_insert(next);
    }
    let mut expected = vec![0.0; groups.len()];
    for ((b, _), p) in tokens.iter().zip(&probs) {
        expected[groups[b.as_slice()]] += p;
    }
    let mut counts = vec![0u64; groups.len()];
    for b in &drawn {
        counts[groups[b.as_slice()]] += 1;
    }
    let kept = probs.iter().filter(|&&p| p > 0.0).count();
    assert!(kept > 1 && kept < probs.len(), "top-p cuts the tail: {kept} of {}", probs.len());
    let (stat, critical) = chi_square(&counts, &expected);
    assert!(stat < critical, "chi-square {stat:.1} above {critical:.1}");
}

async fn texts(engine: &Engine, sampling: &SamplingParams) -> Vec<String> {
    let mut request = input(24, vec![]);
    request.n = 2;
    request.sampling = sampling.clone();
    let (events, usage) = drain(engine.submit(engine.prepare(request).unwrap()).unwrap()).await;
    let mut out = vec![String::new(); 2];
    for e in &events {
        if let Event::Delta { choice, text, .. } = e {
            out[*choice as usize].push_str(text);
        }
    }
    assert!(usage.completion_tokens > 8, "{usage:?}");
    out
}

#[tokio::test]
async fn a_seeded_request_says_the_same_thing_twice() {
    let engine = start(4, None);
    let sampling = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        seed: Some(9),
        ..SamplingParams::default()
    };
    let first = texts(&engine, &sampling).await;
    let second = texts(&engine, &sampling).await;
    assert_eq!(first, second);
    assert_ne!(first[0], first[1], "each choice draws its own stream");
    let other = texts(&engine, &SamplingParams { seed: Some(10), ..sampling }).await;
    assert_ne!(first, other, "another seed, other draws");
    engine.shutdown();
}
