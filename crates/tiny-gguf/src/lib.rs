//! Generator of tiny, random-weight GGUF v3 files that llama.cpp can load.
//!
//! The produced model uses the `llama` architecture with all tensors in F32 and a
//! GPT-2 style byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`,
//! `tokenizer.ggml.pre = "default"`):
//!
//! * ids `0..=255` are the 256 byte-level symbols (id == byte value), so any UTF-8
//!   (indeed any byte string) tokenizes and detokenizes losslessly;
//! * then a handful of ordinary multi-character tokens (" the", "Hello", ...) built
//!   from prefix-chain merges, so tokenization is non-trivial;
//! * then the control tokens `<|endoftext|>` (bos/pad), `<|im_start|>` and
//!   `<|im_end|>` (eos/eot).
//!
//! Output is fully deterministic for a given [`TinyModelSpec`]. `bert` writes tiny BERT
//! encoders (an embedding model, a reranker) the same way; `pulled` finds the real models
//! `gantry models pull` fetched, for the tests that check against them.

use std::collections::HashMap;

mod bert;
pub mod gguf_writer;
mod projector;
pub mod pulled;

pub use bert::{tiny_bert_bytes, write_tiny_bert, BertPooling, TinyBertSpec, BERT_VOCAB};
use gguf_writer::ALIGNMENT;
use gguf_writer::{assemble, KvWriter, SplitMix64, Tensor};
pub use projector::{tiny_projector_bytes, write_tiny_projector, ProjectorKind, TinyProjectorSpec, GEMMA3_MERGE};
use std::io;
use std::path::Path;

/// The default ChatML chat template stored under `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Text of the BOS / padding control token.
pub const ENDOFTEXT_TOKEN: &str = "<|endoftext|>";
/// Text of the ChatML turn-start control token.
pub const IM_START_TOKEN: &str = "<|im_start|>";
/// Text of the ChatML turn-end control token (EOS / EOT).
pub const IM_END_TOKEN: &str = "<|im_end|>";

/// Ordinary multi-character words added to the vocabulary (as plain text; a leading
/// space is part of the token, GPT-2 style). Every prefix of every word becomes a
/// token too, because BPE merges are built as prefix chains.
const WORDS: &[&str] = &[
    "Hello",
    " Hello",
    "Hi",
    " hello",
    " world",
    " the",
    "The",
    " and",
    " to",
    " of",
    " a",
    " is",
    " in",
    " it",
    " you",
    " I",
    " that",
    " for",
    " on",
    " with",
    " are",
    " this",
    " be",
    " not",
    " have",
    " what",
    "What",
    " how",
    "How",
    " can",
    " help",
    " today",
    " model",
    " test",
    " token",
    " tiny",
    "ing",
    "ed",
    "user",
    "assistant",
    "system",
    ",",
    ".",
    "!",
    "?",
    "\n\n",
    "  ",
];

/// llama.cpp token types (`llama_token_type`).
const TOKEN_TYPE_NORMAL: i32 = 1;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Text of Qwen's tool-call tags, user-defined tokens with [`TinyModelSpec::tool_call_tokens`].
pub const TOOL_CALL_TOKENS: [&str; 2] = ["<tool_call>", "</tool_call>"];

/// Text of the thinking markers of reasoning models (DeepSeek-R1 distills, Qwen3),
/// user-defined tokens with [`TinyModelSpec::think_tokens`].
pub const THINK_TOKENS: [&str; 2] = ["<think>", "</think>"];

/// A reasoning template in Qwen3's manner: `enable_thinking` false writes an empty thinking
/// block after the generation prompt; earlier assistant turns lose their thinking, the last
/// one (after the last user message) keeps its `reasoning_content`.
pub const THINKING_TEMPLATE: &str = "{%- set ns = namespace(last_user=-1) -%}{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}{%- for message in messages -%}{%- set content = message['content'] if message['content'] is string else '' -%}{%- if message['role'] == 'assistant' -%}{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}{%- if loop.index0 > ns.last_user and message.reasoning_content -%}{{- '<|im_start|>assistant\n<think>\n' + message['reasoning_content'] + '\n</think>\n\n' + content + '<|im_end|>\n' -}}{%- else -%}{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}{%- endif -%}{%- else -%}{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' -}}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}{%- endif -%}";

/// gpt-oss's harmony tokens, control tokens with [`TinyModelSpec::harmony_tokens`].
pub const HARMONY_TOKENS: [&str; 6] = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"];

/// A harmony template in gpt-oss's manner: each turn `<|start|>ROLE<|message|>…<|end|>`, an
/// assistant's earlier `thinking` on the `analysis` channel and answer on the `final` one, and the generation prompt
/// `<|start|>assistant`, after which the model writes its `analysis` channel, then `final`.
pub const HARMONY_TEMPLATE: &str = "{%- for message in messages -%}{%- if message['role'] == 'assistant' -%}{%- if message.thinking -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' -}}{%- endif -%}{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' -}}{%- else -%}{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' -}}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}";

/// Shape and seed of a tiny model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyModelSpec {
    /// Number of transformer blocks (default 2).
    pub n_layer: u32,
    /// Embedding width (default 64).
    pub n_embd: u32,
    /// Number of attention heads (default 4).
    pub n_head: u32,
    /// Number of key/value heads (default 2, i.e. GQA).
    pub n_head_kv: u32,
    /// Feed-forward width (default 128).
    pub n_ff: u32,
    /// `llama.context_length` (default 2048).
    pub n_ctx_train: u32,
    /// Seed for the weight PRNG (default 0).
    pub seed: u64,
    /// `tokenizer.chat_template` (default [`CHATML_TEMPLATE`]); `None` writes none, as a base
    /// (pretrained) model's GGUF often has none.
    pub chat_template: Option<String>,
    /// Adds Qwen's `<tool_call>` and `</tool_call>` as user-defined tokens (before the control
    /// tokens, so the EOS stays the last id).
    pub tool_call_tokens: bool,
    /// Adds `<think>` and `</think>` as user-defined tokens (after the tool-call tags).
    pub think_tokens: bool,
    /// Adds [`HARMONY_TOKENS`] as control tokens (after the thinking markers).
    pub harmony_tokens: bool,
    /// `llama.pooling_type` (llama.cpp's `llama_pooling_type`: 1 mean, 2 CLS, 3 last), as a
    /// decoder embedding model's GGUF declares it; `None` (the default) writes none, as a chat
    /// model's.
    pub pooling: Option<u32>,
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        Self {
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 128,
            n_ctx_train: 2048,
            seed: 0,
            chat_template: Some(CHATML_TEMPLATE.to_string()),
            tool_call_tokens: false,
            think_tokens: false,
            harmony_tokens: false,
            pooling: None,
        }
    }
}

/// Writes a tiny GGUF model described by `spec` to `path`.
pub fn write_tiny_model(path: &Path, spec: &TinyModelSpec) -> io::Result<()> {
    let bytes = tiny_model_bytes(spec)?;
    std::fs::write(path, bytes)
}

/// Builds the GGUF file contents for `spec` in memory.
pub fn tiny_model_bytes(spec: &TinyModelSpec) -> io::Result<Vec<u8>> {
    validate(spec)?;
    let vocab = Vocab::build(spec.tool_call_tokens, spec.think_tokens, spec.harmony_tokens);
    let n_vocab = vocab.tokens.len() as u64;
    let head_dim = spec.n_embd / spec.n_head;
    let n_embd_kv = u64::from(head_dim * spec.n_head_kv);
    let n_embd = u64::from(spec.n_embd);
    let n_ff = u64::from(spec.n_ff);

    // ---- metadata ----
    let mut kv = KvWriter::default();
    kv.string("general.architecture", "llama");
    kv.string("general.name", "gantry-tiny-random");
    kv.u32("general.alignment", ALIGNMENT as u32);
    kv.u32("llama.context_length", spec.n_ctx_train);
    kv.u32("llama.embedding_length", spec.n_embd);
    kv.u32("llama.block_count", spec.n_layer);
    kv.u32("llama.feed_forward_length", spec.n_ff);
    kv.u32("llama.attention.head_count", spec.n_head);
    kv.u32("llama.attention.head_count_kv", spec.n_head_kv);
    kv.u32("llama.rope.dimension_count", head_dim);
    kv.f32("llama.rope.freq_base", 10000.0);
    kv.f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    kv.u32("llama.vocab_size", n_vocab as u32);
    kv.string("tokenizer.ggml.model", "gpt2");
    kv.string("tokenizer.ggml.pre", "default");
    kv.string_array("tokenizer.ggml.tokens", &vocab.tokens);
    kv.i32_array("tokenizer.ggml.token_type", &vocab.token_types);
    kv.string_array("tokenizer.ggml.merges", &vocab.merges);
    kv.u32("tokenizer.ggml.bos_token_id", vocab.endoftext);
    kv.u32("tokenizer.ggml.eos_token_id", vocab.im_end);
    kv.u32("tokenizer.ggml.eot_token_id", vocab.im_end);
    kv.u32("tokenizer.ggml.padding_token_id", vocab.endoftext);
    kv.bool("tokenizer.ggml.add_bos_token", false);
    kv.bool("tokenizer.ggml.add_eos_token", false);
    if let Some(template) = &spec.chat_template {
        kv.string("tokenizer.chat_template", template);
    }
    if let Some(pooling) = spec.pooling {
        kv.u32("llama.pooling_type", pooling);
    }

    // ---- tensors ----
    let mut rng = SplitMix64::new(spec.seed);
    let mut tensors: Vec<Tensor> = Vec::new();
    tensors.push(Tensor::random("token_embd.weight", &[n_embd, n_vocab], 0.1, &mut rng));
    tensors.push(Tensor::ones("output_norm.weight", &[n_embd]));
    tensors.push(Tensor::random("output.weight", &[n_embd, n_vocab], 0.1, &mut rng));
    for i in 0..spec.n_layer {
        let name = |t: &str| format!("blk.{i}.{t}.weight");
        tensors.push(Tensor::ones(&name("attn_norm"), &[n_embd]));
        tensors.push(Tensor::random(&name("attn_q"), &[n_embd, n_embd], 0.08, &mut rng));
        tensors.push(Tensor::random(&name("attn_k"), &[n_embd, n_embd_kv], 0.08, &mut rng));
        tensors.push(Tensor::random(&name("attn_v"), &[n_embd, n_embd_kv], 0.08, &mut rng));
        tensors.push(Tensor::random(&name("attn_output"), &[n_embd, n_embd], 0.08, &mut rng));
        tensors.push(Tensor::ones(&name("ffn_norm"), &[n_embd]));
        tensors.push(Tensor::random(&name("ffn_gate"), &[n_embd, n_ff], 0.08, &mut rng));
        tensors.push(Tensor::random(&name("ffn_up"), &[n_embd, n_ff], 0.08, &mut rng));
        tensors.push(Tensor::random(&name("ffn_down"), &[n_ff, n_embd], 0.08, &mut rng));
    }

    Ok(assemble(&kv, &tensors))
}

fn validate(spec: &TinyModelSpec) -> io::Result<()> {
    let bad = |msg: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, msg.to_string()));
    if spec.n_layer == 0 || spec.n_embd == 0 || spec.n_head == 0 || spec.n_head_kv == 0 {
        return bad("n_layer, n_embd, n_head and n_head_kv must be non-zero");
    }
    if spec.n_ff == 0 || spec.n_ctx_train == 0 {
        return bad("n_ff and n_ctx_train must be non-zero");
    }
    if !spec.n_embd.is_multiple_of(spec.n_head) {
        return bad("n_embd must be a multiple of n_head");
    }
    if !spec.n_head.is_multiple_of(spec.n_head_kv) {
        return bad("n_head must be a multiple of n_head_kv");
    }
    if !(spec.n_embd / spec.n_head).is_multiple_of(2) {
        return bad("head dimension (n_embd / n_head) must be even for RoPE");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Tokenizer vocabulary
// ---------------------------------------------------------------------------

struct Vocab {
    tokens: Vec<String>,
    token_types: Vec<i32>,
    merges: Vec<String>,
    endoftext: u32,
    im_end: u32,
}

impl Vocab {
    fn build(tool_call_tokens: bool, think_tokens: bool, harmony_tokens: bool) -> Self {
        let byte_map = bytes_to_unicode();
        let mut tokens: Vec<String> = byte_map.iter().map(|c| c.to_string()).collect();
        let mut index: HashMap<String, usize> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i)).collect();
        let mut merges = Vec::new();

        for word in WORDS {
            let encoded: Vec<String> = word.bytes().map(|b| byte_map[b as usize].to_string()).collect();
            let mut prefix = encoded[0].clone();
            for sym in &encoded[1..] {
                let merged = format!("{prefix}{sym}");
                if !index.contains_key(&merged) {
                    merges.push(format!("{prefix} {sym}"));
                    index.insert(merged.clone(), tokens.len());
                    tokens.push(merged.clone());
                }
                prefix = merged;
            }
        }

        let mut token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
        if tool_call_tokens {
            for tag in TOOL_CALL_TOKENS {
                tokens.push(tag.to_string());
                token_types.push(TOKEN_TYPE_USER_DEFINED);
            }
        }
        if think_tokens {
            for marker in THINK_TOKENS {
                tokens.push(marker.to_string());
                token_types.push(TOKEN_TYPE_USER_DEFINED);
            }
        }
        if harmony_tokens {
            for marker in HARMONY_TOKENS {
                tokens.push(marker.to_string());
                token_types.push(TOKEN_TYPE_CONTROL);
            }
        }
        let endoftext = tokens.len() as u32;
        let im_end = endoftext + 2;
        for special in [ENDOFTEXT_TOKEN, IM_START_TOKEN, IM_END_TOKEN] {
            tokens.push(special.to_string());
            token_types.push(TOKEN_TYPE_CONTROL);
        }
        Vocab { tokens, token_types, merges, endoftext, im_end }
    }
}

/// GPT-2's reversible byte -> unicode character mapping (index = byte value).
fn bytes_to_unicode() -> Vec<char> {
    let printable = |b: u32| {
        (u32::from(b'!')..=u32::from(b'~')).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut n = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("valid char")
            } else {
                let c = char::from_u32(256 + n).expect("valid char");
                n += 1;
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = bytes_to_unicode();
        let set: std::collections::HashSet<char> = m.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn vocab_shape() {
        let v = Vocab::build(false, true, false);
        assert!(v.tokens.iter().any(|t| t == "</think>"));
        let n = v.tokens.len();
        assert!((300..=600).contains(&n), "vocab size {n}");
        assert_eq!(v.tokens[v.im_end as usize], IM_END_TOKEN);
        assert_eq!(v.tokens[v.endoftext as usize], ENDOFTEXT_TOKEN);
        let uniq: std::collections::HashSet<&String> = v.tokens.iter().collect();
        assert_eq!(uniq.len(), n);
        assert!(v.tokens.iter().any(|t| t == "Ġthe"));
    }

    #[test]
    fn deterministic_and_aligned() {
        let a = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        let b = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        let c = tiny_model_bytes(&TinyModelSpec { seed: 1, ..Default::default() }).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(&a[..4], b"GGUF");
        assert_eq!(a.len() % ALIGNMENT, 0);
        assert!(a.len() < 2 * 1024 * 1024);
    }

    #[test]
    fn rejects_bad_shapes() {
        let spec = TinyModelSpec { n_head: 3, ..Default::default() };
        assert!(tiny_model_bytes(&spec).is_err());
    }
}
