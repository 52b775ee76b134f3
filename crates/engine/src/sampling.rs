//! Per-sequence samplers built from OpenAI's sampling parameters, and logprobs.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use crate::model::LoadedModel;
use crate::request::{SamplingParams, TokenLogprob, TopLogprob};

/// Derives a 32-bit llama.cpp seed; choice `i` of an `n > 1` request gets its own stream.
pub fn seed_for_choice(seed: Option<u64>, choice: u32) -> u32 {
    let base = seed.unwrap_or_else(rand_seed);
    let mixed = base.wrapping_add(u64::from(choice).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (mixed ^ (mixed >> 32)) as u32
}

fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

/// A choice's sampler. Plain greedy decoding (temperature 0, nothing else in the chain) takes
/// the first highest logit straight from llama.cpp's logits, as llama.cpp's greedy sampler does,
/// without the chain copying all ~150k logits into a candidate array first: the scheduler
/// samples every running choice between two decodes while llama.cpp's threads wait, so that
/// copy sat on the critical path of every step.
pub struct Sampler {
    chain: LlamaSampler,
    plain_greedy: bool,
}

impl Sampler {
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        if self.plain_greedy {
            return LlamaToken(first_argmax(ctx.get_logits_ith(idx)));
        }
        self.chain.sample(ctx, idx)
    }
}

/// Index of the first maximum (llama.cpp's greedy sampler keeps the first of equal logits).
fn first_argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > logits[best] {
            best = i;
        }
    }
    best as i32
}

/// Builds the chain: logit bias → presence/frequency penalties → temperature → top-p → draw.
/// Temperature comes before top-p because OpenAI applies nucleus sampling to the tempered
/// distribution. Temperature 0 is greedy and fully deterministic.
///
/// A grammar sampler, when given, goes first: it masks every token the grammar forbids, and
/// the rest of the chain picks among what is left.
pub fn build_sampler(
    n_vocab: i32,
    params: &SamplingParams,
    choice: u32,
    penalty_window: i32,
    grammar: Option<LlamaSampler>,
) -> Sampler {
    let mut chain: Vec<LlamaSampler> = grammar.into_iter().collect();
    if !params.logit_bias.is_empty() {
        let biases: Vec<LlamaLogitBias> =
            params.logit_bias.iter().map(|&(t, b)| LlamaLogitBias::new(LlamaToken(t), b)).collect();
        chain.push(LlamaSampler::logit_bias(n_vocab, &biases));
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            penalty_window.max(1),
            1.0,
            params.frequency_penalty,
            params.presence_penalty,
        ));
    }
    let plain_greedy = chain.is_empty() && params.temperature <= 0.0;
    if params.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        chain.push(LlamaSampler::temp(params.temperature));
        if params.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(params.top_p, 1));
        }
        chain.push(LlamaSampler::dist(seed_for_choice(params.seed, choice)));
    }
    Sampler { chain: LlamaSampler::chain_simple(chain), plain_greedy }
}

/// OpenAI reports logprobs of the model's distribution (before sampling settings).
pub fn logprobs_for(model: &LoadedModel, logits: &[f32], chosen: i32, top_n: u32) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
    let entry = |id: i32| {
        let bytes = model.piece(id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes, logits[id as usize] - log_sum)
    };
    let mut top = Vec::new();
    if top_n > 0 {
        let mut ids: Vec<i32> = (0..logits.len() as i32).collect();
        let k = (top_n as usize).min(ids.len());
        ids.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        ids.truncate(k);
        ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        top = ids
            .into_iter()
            .map(|id| {
                let (token, bytes, logprob) = entry(id);
                TopLogprob { token, bytes, logprob }
            })
            .collect();
    }
    let (token, bytes, logprob) = entry(chosen);
    TokenLogprob { token, bytes, logprob, top }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_choice_gives_same_llama_seed() {
        assert_eq!(seed_for_choice(Some(42), 0), seed_for_choice(Some(42), 0));
        assert_ne!(seed_for_choice(Some(42), 0), seed_for_choice(Some(42), 1));
        assert_ne!(seed_for_choice(Some(42), 0), seed_for_choice(Some(43), 0));
    }

    #[test]
    fn greedy_takes_the_first_of_equal_highest_logits() {
        assert_eq!(first_argmax(&[0.5, 2.0, -1.0, 2.0, 1.9]), 1);
        assert_eq!(first_argmax(&[3.0, 3.0]), 0);
        assert_eq!(first_argmax(&[-5.0, f32::NEG_INFINITY, -4.0]), 2);
        assert_eq!(first_argmax(&[1.0]), 0);
    }
}
