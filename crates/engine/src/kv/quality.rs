//! What a quantized KV cache ([`KvType`]) costs in quality, measured as llama.cpp's
//! `llama-perplexity --kl-divergence` does: the model reads a real text once with an f16 cache
//! and once with the candidate type, chunk by chunk so that every chunk attends over the cache
//! entries stored before it, and the two next-token distributions are compared at every position.
//!
//! - Mean KL divergence, KL(f16 ‖ candidate), in nats, over the whole vocabulary.
//! - Top-1 agreement: the share of positions whose most likely next token is the same, i.e. what
//!   greedy decoding would pick given the same text so far.
//!
//! An f16 candidate runs the very same computation as the reference, so it measures exactly 0 and
//! 100%: the measurement has no noise of its own.

use std::num::NonZeroU32;
use std::path::Path;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use crate::kv::kv_type::KvType;
use crate::model::{backend, devices::Offload, LoadedModel};
use crate::LoadError;

/// Positions decoded per call: every one asks for its logits, so the output buffer holds this many
/// vocabulary-wide rows (78 MB for Qwen's 152k tokens).
const CHUNK: u32 = 128;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvQuality {
    pub kv_type: KvType,
    /// Positions compared: the text's tokens, up to the limit asked for.
    pub tokens: usize,
    pub mean_kl: f64,
    /// The largest KL of a single position.
    pub max_kl: f64,
    pub top1_agreement: f64,
}

/// Compares `kv_type` with f16 on the first `max_tokens` tokens of `text` read by `model`.
pub fn measure_kv_quality(
    model: &Path,
    kv_type: KvType,
    text: &str,
    max_tokens: usize,
    threads: u32,
) -> Result<KvQuality, LoadError> {
    crate::model::memory::check_kv_type(model, kv_type)?;
    let loaded = LoadedModel::load(model, None, threads as i32, &Offload::default())?;
    let failed = |reason: String| LoadError::Llama { path: model.to_path_buf(), reason };
    let vocab = loaded.llama.vocab();
    let mut tokens: Vec<LlamaToken> = vocab.tokenize(text.as_bytes(), vocab.should_add_bos(), false);
    tokens.truncate(max_tokens);
    if tokens.len() < 2 {
        return Err(failed("the text is shorter than two tokens".into()));
    }
    let cells = u32::try_from(tokens.len().next_multiple_of(256)).map_err(|_| failed("the text is too long".into()))?;
    let context =
        |ty| new_context(&loaded.llama, ty, cells, threads).map_err(|e| failed(format!("{ty} KV cache: {e}")));
    let (mut reference, mut candidate) = (context(KvType::F16)?, context(kv_type)?);
    let mut batch = LlamaBatch::new(CHUNK as usize, 1);
    let (mut kl_sum, mut max_kl, mut agree) = (0.0f64, 0.0f64, 0usize);
    let mut pos = 0i32;
    for chunk in tokens.chunks(CHUNK as usize) {
        batch.clear();
        for &token in chunk {
            batch.add(token, pos, &[0], true).map_err(|e| failed(e.to_string()))?;
            pos += 1;
        }
        reference.decode(&mut batch).map_err(|e| failed(format!("f16 decode: {e}")))?;
        candidate.decode(&mut batch).map_err(|e| failed(format!("{kv_type} decode: {e}")))?;
        for (i, _) in (0i32..).zip(chunk) {
            let (p, q) = (reference.get_logits_ith(i), candidate.get_logits_ith(i));
            let kl = kl_divergence(p, q);
            kl_sum += kl;
            max_kl = max_kl.max(kl);
            agree += usize::from(argmax(p) == argmax(q));
        }
    }
    let n = tokens.len();
    Ok(KvQuality { kv_type, tokens: n, mean_kl: kl_sum / n as f64, max_kl, top1_agreement: agree as f64 / n as f64 })
}

fn new_context(model: &LlamaModel, ty: KvType, cells: u32, threads: u32) -> Result<LlamaContext<'_>, String> {
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(cells))
        .with_n_batch(CHUNK)
        .with_n_ubatch(CHUNK)
        .with_n_seq_max(1)
        .with_type_k(ty.llama())
        .with_type_v(ty.llama())
        .with_n_threads(threads as i32)
        .with_n_threads_batch(threads as i32);
    model.new_context(backend::llama_backend(), params).map_err(|e| e.to_string())
}

/// KL(softmax(p) ‖ softmax(q)) in nats, computed in f64 from log-softmaxes.
pub(crate) fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let (lse_p, lse_q) = (log_sum_exp(p), log_sum_exp(q));
    let kl: f64 = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| {
            let (lp, lq) = (f64::from(a) - lse_p, f64::from(b) - lse_q);
            lp.exp() * (lp - lq)
        })
        .sum();
    // Rounding can leave a hair below zero for identical distributions.
    kl.max(0.0)
}

fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + x.iter().map(|&v| (f64::from(v) - max).exp()).sum::<f64>().ln()
}

fn argmax(x: &[f32]) -> usize {
    x.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_logits_and_grows_with_the_difference() {
        let p = [1.0f32, 2.0, 3.0, 0.5];
        assert_eq!(kl_divergence(&p, &p), 0.0);
        // Shifting every logit by a constant leaves the distribution as it was.
        let shifted: Vec<f32> = p.iter().map(|v| v + 7.0).collect();
        assert!(kl_divergence(&p, &shifted) < 1e-12);
        let near = [1.0f32, 2.0, 3.1, 0.5];
        let far = [3.0f32, 2.0, 1.0, 0.5];
        let (kl_near, kl_far) = (kl_divergence(&p, &near), kl_divergence(&p, &far));
        assert!(0.0 < kl_near && kl_near < kl_far, "{kl_near} {kl_far}");
        // Against a hand computation for two tokens: p = (1/2, 1/2), q = (e/(1+e), 1/(1+e)).
        let kl = kl_divergence(&[0.0, 0.0], &[1.0, 0.0]);
        let q0 = std::f64::consts::E / (1.0 + std::f64::consts::E);
        let expected = 0.5 * (0.5 / q0).ln() + 0.5 * (0.5 / (1.0 - q0)).ln();
        assert!((kl - expected).abs() < 1e-12, "{kl} vs {expected}");
        assert_eq!(argmax(&far), 0);
        assert_eq!(argmax(&p), 2);
    }
}
