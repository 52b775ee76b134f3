//! Tests for the sentence-transformers conversion: a tiny random BERT in Hugging Face's layout,
//! converted and then loaded and run by llama.cpp through the engine's `Embedder`.

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;

use super::bert_gguf::{bert_gguf, SentenceTransformerFiles};

const HIDDEN: usize = 8;
const FFN: usize = 16;
const LAYERS: usize = 2;
const VOCAB: [&str; 11] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "the", "cat", "."];

/// Deterministic weights in [-0.5, 0.5).
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn tiny_model(pooling: Option<&str>) -> SentenceTransformerFiles {
    let config = json!({
        "architectures": ["BertModel"], "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": 2, "max_position_embeddings": 32,
        "layer_norm_eps": 1e-12, "type_vocab_size": 2, "position_embedding_type": "absolute",
    });
    let vocab: serde_json::Map<String, serde_json::Value> =
        VOCAB.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let added: Vec<_> =
        VOCAB[..5].iter().enumerate().map(|(i, t)| json!({"id": i, "content": t, "special": true})).collect();
    let tokenizer = json!({"added_tokens": added, "model": {"type": "WordPiece", "vocab": vocab}});
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![VOCAB.len(), HIDDEN]),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, HIDDEN]),
        ("embeddings.position_embeddings.weight".into(), vec![32, HIDDEN]),
        ("embeddings.LayerNorm.weight".into(), vec![HIDDEN]),
        ("embeddings.LayerNorm.bias".into(), vec![HIDDEN]),
        ("pooler.dense.weight".into(), vec![HIDDEN, HIDDEN]),
    ];
    for l in 0..LAYERS {
        let p = format!("encoder.layer.{l}.");
        for (name, out, inp) in [
            ("attention.self.query", HIDDEN, HIDDEN),
            ("attention.self.key", HIDDEN, HIDDEN),
            ("attention.self.value", HIDDEN, HIDDEN),
            ("attention.output.dense", HIDDEN, HIDDEN),
            ("intermediate.dense", FFN, HIDDEN),
            ("output.dense", HIDDEN, FFN),
        ] {
            shapes.push((format!("{p}{name}.weight"), vec![out, inp]));
            shapes.push((format!("{p}{name}.bias"), vec![out]));
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            shapes.push((format!("{p}{norm}.weight"), vec![HIDDEN]));
            shapes.push((format!("{p}{norm}.bias"), vec![HIDDEN]));
        }
    }
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape.iter().product();
            let values = if name.ends_with("LayerNorm.weight") { vec![1.0; n] } else { weights(n, i as u64 + 1) };
            (name, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    let views: HashMap<String, TensorView<'_>> = data
        .iter()
        .map(|(name, shape, bytes)| (name.clone(), TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap()))
        .collect();
    let pooling = pooling.map(|mode| serde_json::to_vec(&json!({ mode: true })).unwrap());
    SentenceTransformerFiles {
        config: serde_json::to_vec(&config).unwrap(),
        tokenizer: serde_json::to_vec(&tokenizer).unwrap(),
        pooling,
        safetensors: safetensors::serialize(views, None).unwrap(),
    }
}

#[test]
fn a_converted_tiny_bert_loads_tokenizes_and_embeds_in_llama_cpp() {
    let gguf = bert_gguf("tiny-bert", &tiny_model(Some("pooling_mode_mean_tokens"))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-bert.gguf");
    std::fs::write(&path, gguf).unwrap();
    let embedder = gantry_engine::Embedder::start(&path, 2, &gantry_engine::Offload::default(), None, None).unwrap();
    assert_eq!(gantry_engine::Generator::embedding_shape(&embedder).map(|s| s.dimensions), Some(HIDDEN));
    // WordPiece through the phantom-space vocabulary: `cats` is `cat` + `##s`, framed by CLS/SEP.
    assert_eq!(embedder.tokenize("Hello cats."), [2, 5, 9, 7, 10, 3]);
    let inputs = vec![embedder.tokenize("hello world"), embedder.tokenize("the cat"), embedder.tokenize("hello world")];
    let vectors = embedder.embed_blocking(inputs).unwrap();
    for v in &vectors {
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    // The same text in another sequence of the same batch gets the same vector; another text does not.
    let gap = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    assert!(gap(&vectors[0], &vectors[2]) < 1e-5);
    assert!(gap(&vectors[0], &vectors[1]) > 1e-3);
}

#[test]
fn what_is_not_a_pooled_bert_is_refused() {
    let no_pooling = bert_gguf("tiny", &tiny_model(None)).unwrap_err();
    assert!(no_pooling.contains("no pooling module"), "{no_pooling}");
    let max_pooling = bert_gguf("tiny", &tiny_model(Some("pooling_mode_max_tokens"))).unwrap_err();
    assert!(max_pooling.contains("one of mean, CLS or last-token pooling"), "{max_pooling}");
    let mut roberta = tiny_model(Some("pooling_mode_cls_token"));
    roberta.config = serde_json::to_vec(&json!({"architectures": ["RobertaModel"]})).unwrap();
    assert!(bert_gguf("tiny", &roberta).unwrap_err().contains("not BertModel"));
}
