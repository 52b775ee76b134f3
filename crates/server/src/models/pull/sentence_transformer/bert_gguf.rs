//! A sentence-transformers BERT model (Hugging Face's `BertModel`: `config.json`,
//! `tokenizer.json`, `model.safetensors`, the pooling module) as the GGUF llama.cpp's
//! `convert_hf_to_gguf.py` writes for it (class `BertModel`, arch `bert`), all tensors F32.
//!
//! What the converter does and this file does too: tensor names mapped as gguf-py's
//! `TensorNameMap` maps them (`token_embd`, `token_types`, `position_embd`, `token_embd_norm`,
//! `blk.N.attn_q/k/v/output`, `attn_output_norm`, `ffn_up/down`, `layer_output_norm`), the
//! pooler and `position_ids` left out; the WordPiece vocabulary in "phantom space" form (a
//! word-initial piece gets `▁`, a `##` continuation loses its `##`, control tokens stay as they
//! are); `bert.attention.causal = false`; `bert.pooling_type` from the pooling module. A
//! safetensors tensor `[out, in]` (row-major) is GGUF's `[in, out]` with the same bytes.

use std::collections::HashMap;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value as Json;
use tiny_gguf::gguf_writer::{assemble, KvWriter, Tensor};

/// llama.cpp's `llama_pooling_type` values a sentence-transformers pooling module can name.
const POOLING_MEAN: u32 = 1;
const POOLING_CLS: u32 = 2;
const POOLING_LAST: u32 = 3;

/// gguf-py's `TokenType`: ordinary pieces and the tokenizer's special (added) tokens.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;

/// `general.file_type` for a file whose tensors are all F32 (llama.cpp's `LLAMA_FTYPE_ALL_F32`).
const FILE_TYPE_ALL_F32: u32 = 0;

/// The files of a sentence-transformers model that the conversion reads.
pub(crate) struct SentenceTransformerFiles {
    pub(crate) config: Vec<u8>,
    pub(crate) tokenizer: Vec<u8>,
    /// `1_Pooling/config.json`; `None` for a model without a pooling module (refused).
    pub(crate) pooling: Option<Vec<u8>>,
    pub(crate) safetensors: Vec<u8>,
}

/// The GGUF file of `files`, named `name` in `general.name`; the error says what is missing or
/// unsupported.
pub(crate) fn bert_gguf(name: &str, files: &SentenceTransformerFiles) -> Result<Vec<u8>, String> {
    let config: Json = serde_json::from_slice(&files.config).map_err(|e| format!("config.json: {e}"))?;
    let tokenizer: Json = serde_json::from_slice(&files.tokenizer).map_err(|e| format!("tokenizer.json: {e}"))?;
    let architectures = config.get("architectures").and_then(Json::as_array).cloned().unwrap_or_default();
    if !architectures.iter().any(|a| a.as_str() == Some("BertModel")) {
        return Err(format!("config.json: architectures {architectures:?} are not BertModel"));
    }
    if config.get("position_embedding_type").and_then(Json::as_str).is_some_and(|t| t != "absolute") {
        return Err("config.json: only absolute position embeddings are supported".into());
    }
    let pooling = pooling_type(files.pooling.as_deref())?;
    let n_layers = config_u32(&config, "num_hidden_layers")?;

    let mut kv = KvWriter::default();
    kv.string("general.architecture", "bert");
    kv.string("general.name", name);
    kv.u32("general.file_type", FILE_TYPE_ALL_F32);
    kv.u32("bert.context_length", config_u32(&config, "max_position_embeddings")?);
    kv.u32("bert.embedding_length", config_u32(&config, "hidden_size")?);
    kv.u32("bert.feed_forward_length", config_u32(&config, "intermediate_size")?);
    kv.u32("bert.block_count", n_layers);
    kv.u32("bert.attention.head_count", config_u32(&config, "num_attention_heads")?);
    let eps = config.get("layer_norm_eps").and_then(Json::as_f64).ok_or("config.json: no layer_norm_eps")?;
    kv.f32("bert.attention.layer_norm_epsilon", eps as f32);
    kv.bool("bert.attention.causal", false);
    kv.u32("bert.pooling_type", pooling);
    write_vocabulary(&mut kv, &tokenizer, config_u32(&config, "type_vocab_size").unwrap_or(1))?;

    let weights = SafeTensors::deserialize(&files.safetensors).map_err(|e| format!("model.safetensors: {e}"))?;
    let tensors = gguf_tensors(&weights, n_layers)?;
    Ok(assemble(&kv, &tensors))
}

fn config_u32(config: &Json, key: &str) -> Result<u32, String> {
    config
        .get(key)
        .and_then(Json::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("config.json: no {key}"))
}

/// `bert.pooling_type` from `1_Pooling/config.json`: the one pooling mode it turns on.
fn pooling_type(pooling: Option<&[u8]>) -> Result<u32, String> {
    let pooling = pooling.ok_or("no pooling module (1_Pooling/config.json): not a sentence embedding model")?;
    let pooling: Json = serde_json::from_slice(pooling).map_err(|e| format!("1_Pooling/config.json: {e}"))?;
    let on = |key: &str| pooling.get(key).and_then(Json::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", POOLING_MEAN),
        ("pooling_mode_cls_token", POOLING_CLS),
        ("pooling_mode_lasttoken", POOLING_LAST),
    ];
    let chosen: Vec<u32> = modes.iter().filter(|(key, _)| on(key)).map(|&(_, ty)| ty).collect();
    match chosen.as_slice() {
        [one] => Ok(*one),
        _ => Err(format!("1_Pooling/config.json: one of mean, CLS or last-token pooling is needed: {pooling}")),
    }
}

/// The WordPiece vocabulary in the converter's phantom-space form, token types, and the special
/// tokens' ids.
fn write_vocabulary(kv: &mut KvWriter, tokenizer: &Json, token_type_count: u32) -> Result<(), String> {
    let model = tokenizer.get("model").ok_or("tokenizer.json: no model")?;
    if model.get("type").and_then(Json::as_str) != Some("WordPiece") {
        return Err("tokenizer.json: not a WordPiece tokenizer".into());
    }
    let vocab = model.get("vocab").and_then(Json::as_object).ok_or("tokenizer.json: no vocab")?;
    let mut by_id: Vec<Option<&str>> = vec![None; vocab.len()];
    for (piece, id) in vocab {
        let id = id.as_u64().and_then(|i| usize::try_from(i).ok()).filter(|&i| i < by_id.len());
        let id = id.ok_or_else(|| format!("tokenizer.json: {piece:?} has an id outside the vocabulary"))?;
        by_id[id] = Some(piece);
    }
    let added: HashMap<&str, bool> = tokenizer
        .get("added_tokens")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| Some((t.get("content")?.as_str()?, t.get("special")?.as_bool()?)))
        .collect();
    let mut tokens = Vec::with_capacity(by_id.len());
    let mut types = Vec::with_capacity(by_id.len());
    for (id, piece) in by_id.iter().enumerate() {
        let piece = piece.ok_or_else(|| format!("tokenizer.json: no token has id {id}"))?;
        if added.get(piece).copied().unwrap_or(false) {
            tokens.push(piece.to_string());
            types.push(TOKEN_CONTROL);
        } else {
            tokens.push(piece.strip_prefix("##").map_or_else(|| format!("\u{2581}{piece}"), str::to_string));
            types.push(TOKEN_NORMAL);
        }
    }
    let id_of = |piece: &str| {
        vocab
            .get(piece)
            .and_then(Json::as_u64)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| format!("tokenizer.json: no {piece} token"))
    };
    kv.string("tokenizer.ggml.model", "bert");
    kv.string("tokenizer.ggml.pre", "default");
    kv.string_array("tokenizer.ggml.tokens", &tokens);
    kv.i32_array("tokenizer.ggml.token_type", &types);
    kv.u32("tokenizer.ggml.token_type_count", token_type_count);
    // `[CLS] text [SEP]`, as the tokenizer's post-processor frames a single text.
    kv.u32("tokenizer.ggml.bos_token_id", id_of("[CLS]")?);
    kv.u32("tokenizer.ggml.cls_token_id", id_of("[CLS]")?);
    kv.u32("tokenizer.ggml.seperator_token_id", id_of("[SEP]")?);
    kv.u32("tokenizer.ggml.unknown_token_id", id_of("[UNK]")?);
    kv.u32("tokenizer.ggml.padding_token_id", id_of("[PAD]")?);
    kv.u32("tokenizer.ggml.mask_token_id", id_of("[MASK]")?);
    kv.bool("tokenizer.ggml.add_bos_token", true);
    kv.bool("tokenizer.ggml.add_sep_token", true);
    kv.bool("tokenizer.ggml.add_eos_token", false);
    Ok(())
}

/// Hugging Face's tensor names (a `bert.` prefix tolerated) and the GGUF names they become.
fn tensor_names(n_layers: u32) -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = [
        ("embeddings.word_embeddings.weight", "token_embd.weight"),
        ("embeddings.token_type_embeddings.weight", "token_types.weight"),
        ("embeddings.position_embeddings.weight", "position_embd.weight"),
        ("embeddings.LayerNorm.weight", "token_embd_norm.weight"),
        ("embeddings.LayerNorm.bias", "token_embd_norm.bias"),
    ]
    .iter()
    .map(|&(hf, gguf)| (hf.to_string(), gguf.to_string()))
    .collect();
    let per_layer = [
        ("attention.self.query", "attn_q"),
        ("attention.self.key", "attn_k"),
        ("attention.self.value", "attn_v"),
        ("attention.output.dense", "attn_output"),
        ("attention.output.LayerNorm", "attn_output_norm"),
        ("intermediate.dense", "ffn_up"),
        ("output.dense", "ffn_down"),
        ("output.LayerNorm", "layer_output_norm"),
    ];
    for layer in 0..n_layers {
        for (hf, gguf) in per_layer {
            for part in ["weight", "bias"] {
                names.push((format!("encoder.layer.{layer}.{hf}.{part}"), format!("blk.{layer}.{gguf}.{part}")));
            }
        }
    }
    names
}

/// Every tensor llama.cpp's BERT graph reads, F32, in GGUF's dimension order.
fn gguf_tensors(weights: &SafeTensors<'_>, n_layers: u32) -> Result<Vec<Tensor>, String> {
    let available = weights.names();
    let lookup = |hf: &str| {
        [hf.to_string(), format!("bert.{hf}")]
            .into_iter()
            .find(|n| available.iter().any(|a| a == n))
            .ok_or_else(|| format!("model.safetensors: no tensor {hf}"))
    };
    let mut tensors = Vec::new();
    for (hf, gguf) in tensor_names(n_layers) {
        let view = weights.tensor(&lookup(&hf)?).map_err(|e| format!("model.safetensors: {hf}: {e}"))?;
        let data = match view.dtype() {
            Dtype::F32 => view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            other => return Err(format!("model.safetensors: {hf} is {other:?}; only F32 weights are converted")),
        };
        let shape = view.shape().iter().rev().map(|&d| d as u64).collect();
        tensors.push(Tensor { name: gguf, shape, data });
    }
    Ok(tensors)
}
