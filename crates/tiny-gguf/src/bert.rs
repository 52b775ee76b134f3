//! Tiny random-weight BERT encoders as llama.cpp reads them (`general.architecture = "bert"`,
//! a WordPiece vocabulary in llama.cpp's phantom-space form, non-causal attention): a sentence
//! embedding model (mean pooling), or a cross-encoder reranker (rank pooling with the
//! classification head `cls` (dense + tanh) and `cls.output` (one relevance logit), as
//! `BertForSequenceClassification` checkpoints convert). No reranker ships in a package
//! reachable here, so the server's rerank route is tested on these.

use std::io;
use std::path::Path;

use crate::gguf_writer::{assemble, KvWriter, SplitMix64, Tensor};

/// llama.cpp's `llama_pooling_type` values written as `bert.pooling_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BertPooling {
    Mean = 1,
    Rank = 4,
}

/// Shape and seed of a tiny BERT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyBertSpec {
    pub pooling: BertPooling,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_head: u32,
    pub n_ff: u32,
    /// `bert.context_length`: the most tokens one input may have.
    pub n_ctx_train: u32,
    pub seed: u64,
    /// `tokenizer.chat_template.rerank`: a reranker's own framing of a pair (`{query}`,
    /// `{document}`), as decoder rerankers' GGUFs carry it.
    pub rerank_template: Option<String>,
}

impl Default for TinyBertSpec {
    fn default() -> Self {
        Self {
            pooling: BertPooling::Mean,
            n_layer: 2,
            n_embd: 32,
            n_head: 2,
            n_ff: 64,
            n_ctx_train: 128,
            seed: 0,
            rerank_template: None,
        }
    }
}

/// The special tokens first (`[PAD]` 0, `[UNK]` 1, `[CLS]` 2, `[SEP]` 3, `[MASK]` 4), then whole
/// words and `##` continuations, lower case (the WPM tokenizer lower-cases its input).
pub const BERT_VOCAB: &[&str] = &[
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "is", "of", "in", "what", "where", "how", "capital",
    "france", "paris", "city", "river", "cat", "cats", "dog", "sat", "on", "mat", "stock", "market", "fell", "rose",
    "bank", "rates", "plants", "make", "food", "from", "sunlight", "light", "water", "python", "list", "tuple", "##s",
    "##ed", "##ing", ".", ",", "?", "!",
];

/// Writes the model to `path`.
pub fn write_tiny_bert(path: &Path, spec: &TinyBertSpec) -> io::Result<()> {
    std::fs::write(path, tiny_bert_bytes(spec))
}

/// The model's GGUF bytes; the same for the same spec.
pub fn tiny_bert_bytes(spec: &TinyBertSpec) -> Vec<u8> {
    let mut kv = KvWriter::default();
    kv.string("general.architecture", "bert");
    kv.string("general.name", "tiny-bert");
    kv.u32("bert.context_length", spec.n_ctx_train);
    kv.u32("bert.embedding_length", spec.n_embd);
    kv.u32("bert.feed_forward_length", spec.n_ff);
    kv.u32("bert.block_count", spec.n_layer);
    kv.u32("bert.attention.head_count", spec.n_head);
    kv.f32("bert.attention.layer_norm_epsilon", 1e-12);
    kv.bool("bert.attention.causal", false);
    kv.u32("bert.pooling_type", spec.pooling as u32);
    let tokens: Vec<String> = BERT_VOCAB
        .iter()
        .enumerate()
        .map(|(i, t)| match t.strip_prefix("##") {
            _ if i < 5 => t.to_string(),
            Some(rest) => rest.to_string(),
            None => format!("\u{2581}{t}"),
        })
        .collect();
    // 3: control, 1: normal.
    let types: Vec<i32> = (0..BERT_VOCAB.len()).map(|i| if i < 5 { 3 } else { 1 }).collect();
    kv.string("tokenizer.ggml.model", "bert");
    kv.string("tokenizer.ggml.pre", "default");
    kv.string_array("tokenizer.ggml.tokens", &tokens);
    kv.i32_array("tokenizer.ggml.token_type", &types);
    kv.u32("tokenizer.ggml.token_type_count", 2);
    kv.u32("tokenizer.ggml.bos_token_id", 2);
    kv.u32("tokenizer.ggml.cls_token_id", 2);
    kv.u32("tokenizer.ggml.seperator_token_id", 3);
    kv.u32("tokenizer.ggml.unknown_token_id", 1);
    kv.u32("tokenizer.ggml.padding_token_id", 0);
    kv.u32("tokenizer.ggml.mask_token_id", 4);
    kv.bool("tokenizer.ggml.add_bos_token", true);
    kv.bool("tokenizer.ggml.add_sep_token", true);
    kv.bool("tokenizer.ggml.add_eos_token", false);
    if let Some(template) = &spec.rerank_template {
        kv.string("tokenizer.chat_template.rerank", template);
    }
    assemble(&kv, &tensors(spec))
}

fn tensors(spec: &TinyBertSpec) -> Vec<Tensor> {
    let (e, f) = (u64::from(spec.n_embd), u64::from(spec.n_ff));
    let mut rng = SplitMix64::new(spec.seed);
    let scale = 0.5;
    let mut t = vec![
        Tensor::random("token_embd.weight", &[e, BERT_VOCAB.len() as u64], scale, &mut rng),
        Tensor::random("token_types.weight", &[e, 2], scale, &mut rng),
        Tensor::random("position_embd.weight", &[e, u64::from(spec.n_ctx_train)], scale, &mut rng),
        Tensor::ones("token_embd_norm.weight", &[e]),
        Tensor::zeros("token_embd_norm.bias", &[e]),
    ];
    for l in 0..spec.n_layer {
        let name = |n: &str| format!("blk.{l}.{n}");
        for (n, shape) in [
            ("attn_q", [e, e]),
            ("attn_k", [e, e]),
            ("attn_v", [e, e]),
            ("attn_output", [e, e]),
            ("ffn_up", [e, f]),
            ("ffn_down", [f, e]),
        ] {
            t.push(Tensor::random(&name(&format!("{n}.weight")), &shape, scale, &mut rng));
            t.push(Tensor::random(&name(&format!("{n}.bias")), &shape[1..], scale, &mut rng));
        }
        for n in ["attn_output_norm", "layer_output_norm"] {
            t.push(Tensor::ones(&name(&format!("{n}.weight")), &[e]));
            t.push(Tensor::zeros(&name(&format!("{n}.bias")), &[e]));
        }
    }
    if spec.pooling == BertPooling::Rank {
        t.push(Tensor::random("cls.weight", &[e, e], scale, &mut rng));
        t.push(Tensor::random("cls.bias", &[e], scale, &mut rng));
        t.push(Tensor::random("cls.output.weight", &[e, 1], scale, &mut rng));
        t.push(Tensor::random("cls.output.bias", &[1], scale, &mut rng));
    }
    t
}
