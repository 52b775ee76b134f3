//! Sentence embeddings: an embedding model (a GGUF that declares a pooling type: BERT
//! sentence-transformers, decoder embedding models) served by a thread of its own,
//! `gantry-embedder` (`run`), the only owner of its `LlamaContext` (embeddings on, the model's
//! own pooling).
//!
//! It is not the scheduler: an embedding is one forward pass with no sampling, no decode loop and
//! no KV reuse between inputs, so its loop is short. It packs the inputs of every job waiting
//! into batches (one sequence each, `DECODE_TOKENS` tokens and `MAX_SEQUENCES` sequences at
//! most, filled fairly between API keys), decodes each batch once, reads each sequence's pooled
//! vector and L2-normalises it (as sentence-transformers' `Normalize` module does), then answers
//! each job. So many inputs and many requests share one decode.
//!
//! A reranker (rank pooling: a cross-encoder's classification head) runs here too: its input
//! is a (query, document) pair framed as one sequence (`ranking_input`), its output a logit.
//!
//! To the server it is a [`Generator`] like any engine (the pool loads, leases and unloads it
//! the same way) that embeds and generates nothing. A model whose GGUF declares no pooling type
//! (a chat model) is refused at [`Embedder::start`]: its per-token states pooled by nothing
//! would be vectors without meaning.

mod run;

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::oneshot;

use crate::error::SubmitError;
use crate::model::capabilities::Pooling;
use crate::model::raw_prompt::RawPrompt;
use crate::model::twins::f32_as_bf16;
use crate::model::{backend, devices::Offload, LoadedModel, ModelInfo};
use crate::prepare::{ChatInput, PrepareError};
use crate::request::{GenerateRequest, GenerationHandle, Owner};
use crate::scheduler::queue::shares::QueueShares;
use crate::{Generator, Health, LoadError};

/// The longest input, and the context: one ubatch (non-causal attention needs each sequence
/// whole in one).
pub(crate) const BATCH_TOKENS: u32 = 8192;
/// Tokens one decode packs (unless one input alone is longer). llama.cpp's attention spans the
/// whole batch, masked between sequences (its tiled kernel skips a fully masked 64×64 tile but
/// still reads its mask), so its cost grows with the square of the batch, while smaller
/// batches lose more to each decode's fixed costs: on all-MiniLM-L6-v2, 2 cores, 256 to 1,024
/// tokens embed alike, 128 about 10% less, 64 half (under 64 tokens the attention leaves its
/// tiled kernel).
pub(crate) const DECODE_TOKENS: usize = 512;
/// Sequences (inputs) in one decode.
const MAX_SEQUENCES: u32 = 64;
/// Jobs that may wait, shared between tenants and keys as the scheduler's queue is (`QueueShares`): past
/// it a job is refused (a retryable 503) instead of piling up in memory.
const MAX_QUEUED_JOBS: usize = 256;

/// Why inputs could not be embedded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbedError {
    #[error("The model `{model}` is not an embedding model: its GGUF declares no pooling type.")]
    NotEmbeddingModel { model: String },
    #[error("Input {index} has {tokens} tokens; this model embeds at most {limit} tokens per input.")]
    TooLong { index: usize, tokens: usize, limit: usize },
    #[error("Input {index} is empty.")]
    Empty { index: usize },
    #[error("Input {index} has the token id {token}, outside the model's vocabulary (0..{n_vocab}).")]
    OutsideVocabulary { index: usize, token: i32, n_vocab: i32 },
    #[error("llama.cpp failed to embed: {0}")]
    Decode(String),
    #[error("the embedder has stopped")]
    Stopped,
    #[error("{0} embedding requests are already waiting; try again shortly")]
    QueueFull(usize),
}

/// Unit vectors, one per input, in input order.
pub type Embeddings = Vec<Vec<f32>>;

/// What an embedding model gives and takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingShape {
    /// The length of every vector.
    pub dimensions: usize,
    /// The most tokens one input may have: the model's training context.
    pub max_input_tokens: usize,
}

/// The handle to an embedding model's thread; dropping it stops the thread once its jobs end.
pub struct Embedder {
    model: Arc<LoadedModel>,
    jobs: mpsc::Sender<run::Job>,
    /// Jobs sent and not yet answered, by key.
    pub(crate) queued: Arc<QueueShares>,
    shape: EmbeddingShape,
    pooling: Pooling,
    /// A reranker's own framing of a pair, where its GGUF has one (`tokenizer.chat_template.rerank`).
    rerank_template: Option<String>,
}

impl Embedder {
    /// Loads the model at `path` and starts its thread; refuses a model without pooling. With
    /// `turns`, each decode takes its turn on the cores with other models' engines. With
    /// `bf16_twins`, F32 matrices are served from a BF16 twin there where that pays
    /// (`twins::f32_as_bf16`).
    pub fn start(
        path: &Path,
        threads: i32,
        offload: &Offload,
        turns: Option<Arc<Mutex<()>>>,
        bf16_twins: Option<&Path>,
    ) -> Result<Self, LoadError> {
        let weights = match bf16_twins {
            Some(dir) => f32_as_bf16::weights_to_load(path, dir),
            None => path.to_path_buf(),
        };
        let model = LoadedModel::load_weights(path, &weights, None, threads, offload, false)?;
        let pooling = Pooling::of(&model.llama);
        if !pooling.embeds() && pooling != Pooling::Rank {
            let model = path.display().to_string();
            return Err(LoadError::NotEmbedding(EmbedError::NotEmbeddingModel { model }.to_string()));
        }
        // A reranker's output is its classification head's: one logit per input.
        let width = if pooling == Pooling::Rank { model.llama.n_cls_out() } else { model.llama.n_embd_out() as u32 };
        let shape = EmbeddingShape {
            dimensions: usize::try_from(width).unwrap_or(0),
            max_input_tokens: (model.info().n_ctx_train as usize).min(BATCH_TOKENS as usize),
        };
        let normalise = pooling.embeds();
        let (jobs, queue) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread_model = Arc::clone(&model);
        let queued = Arc::new(QueueShares::default());
        let thread_queued = Arc::clone(&queued);
        std::thread::Builder::new()
            .name("gantry-embedder".into())
            .spawn(move || match new_context(&thread_model, threads) {
                Ok(ctx) => {
                    let _ = ready_tx.send(Ok(()));
                    run::run(ctx, &queue, turns.as_ref(), normalise, &thread_queued);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| LoadError::Context(e.to_string()))?;
        ready_rx
            .recv()
            .map_err(|_| LoadError::Context("the embedder thread ended".into()))?
            .map_err(LoadError::Context)?;
        let rerank_template = model.llama.meta_val_str("tokenizer.chat_template.rerank").ok();
        Ok(Self { model, jobs, queued, shape, pooling, rerank_template })
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// `text` as the model reads it for an embedding: with its special tokens (BERT's
    /// `[CLS] … [SEP]`, a decoder's BOS), client text never read as control tokens.
    pub fn tokenize(&self, text: &str) -> Vec<i32> {
        self.model.tokenize_with(text, true, false)
    }

    /// [`Generator::embed`], waited for on this thread (not inside an async task).
    pub fn embed_blocking(&self, inputs: Vec<Vec<i32>>) -> Result<Embeddings, EmbedError> {
        self.submit_inputs(Owner::default(), inputs).blocking_recv().unwrap_or(Err(EmbedError::Stopped))
    }

    fn submit_inputs(&self, owner: Owner, inputs: Vec<Vec<i32>>) -> oneshot::Receiver<Result<Embeddings, EmbedError>> {
        let (reply, answer) = oneshot::channel();
        if let Err(e) = check_inputs(&inputs, self.shape.max_input_tokens, self.model.info().n_vocab) {
            let _ = reply.send(Err(e));
            return answer;
        }
        if inputs.is_empty() {
            let _ = reply.send(Ok(Vec::new()));
            return answer;
        }
        if let Err(waiting) = self.queued.try_enter(owner, MAX_QUEUED_JOBS) {
            let _ = reply.send(Err(EmbedError::QueueFull(waiting)));
            return answer;
        }
        let inputs = inputs.into_iter().map(|i| i.into_iter().map(LlamaToken).collect()).collect();
        if let Err(mpsc::SendError(job)) = self.jobs.send(run::Job { owner, inputs, reply }) {
            self.queued.leave(owner);
            let _ = job.reply.send(Err(EmbedError::Stopped));
        }
        answer
    }
}

/// Refuses inputs out of the model's bounds: empty, too long, or with ids outside its vocabulary.
pub fn check_inputs(inputs: &[Vec<i32>], max_input_tokens: usize, n_vocab: i32) -> Result<(), EmbedError> {
    for (index, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(EmbedError::Empty { index });
        }
        if input.len() > max_input_tokens {
            return Err(EmbedError::TooLong { index, tokens: input.len(), limit: max_input_tokens });
        }
        if let Some(&token) = input.iter().find(|&&t| t < 0 || t >= n_vocab) {
            return Err(EmbedError::OutsideVocabulary { index, token, n_vocab });
        }
    }
    Ok(())
}

impl Generator for Embedder {
    fn model_info(&self) -> &ModelInfo {
        self.model.info()
    }

    fn prepare(&self, _: ChatInput) -> Result<GenerateRequest, PrepareError> {
        Err(PrepareError::NotGenerative)
    }

    fn prepare_raw(&self, _: ChatInput, _: RawPrompt) -> Result<GenerateRequest, PrepareError> {
        Err(PrepareError::NotGenerative)
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        self.model.tokenize_with(text, add_special, parse_special)
    }

    fn detokenize(&self, tokens: &[i32]) -> String {
        self.model.detokenize(tokens, true)
    }

    fn submit(&self, _: GenerateRequest) -> Result<GenerationHandle, SubmitError> {
        Err(SubmitError::Failed("an embedding model generates no text".into()))
    }

    fn health(&self) -> Health {
        Health::Ready
    }

    fn embedding_shape(&self) -> Option<EmbeddingShape> {
        Some(self.shape)
    }

    fn embed(&self, owner: Owner, inputs: Vec<Vec<i32>>) -> oneshot::Receiver<Result<Embeddings, EmbedError>> {
        self.submit_inputs(owner, inputs)
    }

    fn ranking_input(&self, query: &str, document: &str) -> Option<Vec<i32>> {
        (self.pooling == Pooling::Rank).then(|| match &self.rerank_template {
            Some(template) => templated_ranking_input(&self.model, template, query, document),
            None => ranking_input(&self.model, query, document),
        })
    }
}

/// A cross-encoder's input for one (query, document) pair, framed as llama.cpp's server frames
/// it: BOS (BERT's `[CLS]`), the query, EOS (else SEP) and SEP where the vocabulary adds them,
/// the document, EOS (BERT's: SEP). Both texts are tokenized as plain text: no control tokens from a client.
fn ranking_input(model: &LoadedModel, query: &str, document: &str) -> Vec<i32> {
    let vocab = model.llama.vocab();
    let eos = if vocab.eos().0 >= 0 { vocab.eos().0 } else { vocab.sep().0 };
    let mut out = Vec::new();
    if vocab.should_add_bos() {
        out.push(vocab.bos().0);
    }
    out.extend(model.tokenize_with(query, false, false));
    if vocab.should_add_eos() {
        out.push(eos);
    }
    if vocab.should_add_sep() {
        out.push(vocab.sep().0);
    }
    out.extend(model.tokenize_with(document, false, false));
    // A BERT vocabulary (no EOS added) closes the pair with its SEP, as its tokenizer does.
    if vocab.should_add_eos() {
        out.push(eos);
    } else if vocab.should_add_sep() {
        out.push(vocab.sep().0);
    }
    out
}

/// A pair in the reranker's own template, as llama.cpp's server fills it: `{query}` and
/// `{document}` replaced, nothing added around it. The template's text is read with its control
/// tokens; the client's texts are plain text, so they cannot spell the template's markers.
fn templated_ranking_input(model: &LoadedModel, template: &str, query: &str, document: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let mut rest = template;
    loop {
        let next = [("{query}", query), ("{document}", document)]
            .into_iter()
            .filter_map(|(placeholder, text)| rest.find(placeholder).map(|at| (at, placeholder, text)))
            .min_by_key(|(at, _, _)| *at);
        let Some((at, placeholder, text)) = next else {
            out.extend(model.tokenize_with(rest, false, true));
            return out;
        };
        out.extend(model.tokenize_with(&rest[..at], false, true));
        out.extend(model.tokenize_with(text, false, false));
        rest = &rest[at + placeholder.len()..];
    }
}

fn new_context(model: &LoadedModel, threads: i32) -> Result<LlamaContext<'_>, String> {
    let params = LlamaContextParams::default()
        .with_embeddings(true)
        .with_n_ctx(NonZeroU32::new(BATCH_TOKENS))
        .with_n_batch(BATCH_TOKENS)
        .with_n_ubatch(BATCH_TOKENS)
        .with_n_seq_max(MAX_SEQUENCES)
        // A decoder embedding model's sequences share the cells: any input may take all of them.
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    model.llama.new_context(backend::llama_backend(), params).map_err(|e| e.to_string())
}

/// `v / max(‖v‖, 1e-12)`, as `torch.nn.functional.normalize` (sentence-transformers) divides;
/// the norm summed in f64 so that long vectors lose nothing to rounding.
pub(crate) fn normalised(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt().max(1e-12);
    // A unit vector's components lie in [-1, 1]: the cast to f32 only rounds.
    #[allow(clippy::cast_possible_truncation)]
    v.iter().map(|&x| (f64::from(x) / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_vectors_have_unit_length_and_zero_stays_zero() {
        let v = normalised(&[3.0, 4.0]);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(normalised(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
