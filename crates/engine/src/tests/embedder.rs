//! The `Embedder` on tiny random BERTs (`tiny_gguf::write_tiny_bert`): a reranker's pairs are
//! framed as its tokenizer frames them and scored the same alone or batched with others; an
//! embedding model's vectors have unit length, and are the same alone or among many batches;
//! the capabilities read from each GGUF say which. A decoder (tiny llama) that declares a pooling
//! type embeds too.

use std::path::PathBuf;

use tiny_gguf::{BertPooling, TinyBertSpec};

use crate::{Capabilities, Embedder, Generator, Offload, Pooling};

fn written(name: &str, pooling: BertPooling) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gantry-engine-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    tiny_gguf::write_tiny_bert(&path, &TinyBertSpec { pooling, ..Default::default() }).unwrap();
    path
}

#[test]
fn a_reranker_scores_each_pair_the_same_alone_or_beside_others() {
    let path = written("tiny-reranker", BertPooling::Rank);
    let caps = Capabilities::read(&path).unwrap();
    assert_eq!((caps.pooling, caps.ranks(), caps.embeds(), caps.generates()), (Pooling::Rank, true, false, false));
    let ranker = Embedder::start(&path, 1, &Offload::default(), None, None).unwrap();
    assert_eq!(ranker.embedding_shape().map(|s| s.dimensions), Some(1), "one logit per pair");
    // [CLS] query [SEP] document [SEP], each text as plain words.
    let pair = ranker.ranking_input("the capital of france?", "paris").unwrap();
    let word = |w: &str| tiny_gguf::BERT_VOCAB.iter().position(|t| *t == w).unwrap() as i32;
    let want = [2, word("the"), word("capital"), word("of"), word("france"), word("?"), 3, word("paris"), 3];
    assert_eq!(pair, want);
    // Text that spells a control token stays text.
    assert!(!ranker.ranking_input("[SEP]", "x").unwrap()[1..].starts_with(&[3]));

    let docs = ["paris", "the cat sat on the mat", "the stock market fell", "rates rose"];
    let inputs: Vec<Vec<i32>> =
        docs.iter().map(|d| ranker.ranking_input("where is the capital?", d).unwrap()).collect();
    let together = ranker.embed_blocking(inputs.clone()).unwrap();
    assert_eq!(together.len(), docs.len());
    for (input, score) in inputs.into_iter().zip(&together) {
        let alone = ranker.embed_blocking(vec![input]).unwrap();
        assert_eq!(score.len(), 1);
        assert!(score[0].is_finite());
        assert!((alone[0][0] - score[0]).abs() < 1e-4, "{} alone, {} in a batch", alone[0][0], score[0]);
    }
    assert!(together.iter().any(|s| (s[0] - together[0][0]).abs() > 1e-6), "the documents score differently");
    assert_eq!(ranker.queued.total(), 0, "every answered job left the queue");
}

#[test]
fn a_rerankers_own_template_frames_its_pairs() {
    let dir = std::env::temp_dir().join(format!("gantry-engine-templated-ranker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("templated-ranker.gguf");
    let template = "[CLS] what is {query} [SEP] in {document} [SEP] [MASK]".to_string();
    let spec = TinyBertSpec { pooling: BertPooling::Rank, rerank_template: Some(template), ..Default::default() };
    tiny_gguf::write_tiny_bert(&path, &spec).unwrap();
    let ranker = Embedder::start(&path, 1, &Offload::default(), None, None).unwrap();
    let word = |w: &str| tiny_gguf::BERT_VOCAB.iter().position(|t| *t == w).unwrap() as i32;
    // The template's markers are its control tokens, and nothing is added around it.
    let pair = ranker.ranking_input("the capital", "paris").unwrap();
    let want = [2, word("what"), word("is"), word("the"), word("capital"), 3, word("in"), word("paris"), 3, 4];
    assert_eq!(pair, want);
    // A client's text that spells a marker stays text.
    let spelled = ranker.ranking_input("[MASK]", "[SEP]").unwrap();
    assert_eq!(spelled.iter().filter(|&&t| t == 3 || t == 4).count(), 3, "{spelled:?}");
    assert!(ranker.embed_blocking(vec![pair]).unwrap()[0][0].is_finite());
}

#[test]
fn an_embedding_model_gives_unit_vectors_and_no_ranking() {
    let path = written("tiny-bert-mean", BertPooling::Mean);
    let caps = Capabilities::read(&path).unwrap();
    assert_eq!((caps.embeds(), caps.ranks(), caps.generates(), caps.chat_template), (true, false, false, false));
    let embedder = Embedder::start(&path, 1, &Offload::default(), None, None).unwrap();
    assert_eq!(embedder.ranking_input("a", "b"), None);
    let vectors = embedder.embed_blocking(vec![embedder.tokenize("the cat sat"), embedder.tokenize("paris")]).unwrap();
    for v in &vectors {
        assert_eq!(v.len(), 32);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    }
    // A chat model is refused: its states pooled by nothing mean nothing.
    let chat = crate::tests::engine::tiny_model();
    assert!(Embedder::start(chat, 1, &Offload::default(), None, None).is_err());
}

#[test]
fn an_inputs_vector_is_the_same_alone_or_among_many_batches() {
    let path = written("tiny-bert-batches", BertPooling::Mean);
    let embedder = Embedder::start(&path, 2, &Offload::default(), None, None).unwrap();
    let words = ["the", "cat", "sat", "on", "mat", "paris", "is", "capital"];
    let texts: Vec<String> =
        (0..200).map(|i| (0..1 + i % 23).map(|j| words[(i + j) % words.len()]).collect::<Vec<_>>().join(" ")).collect();
    let inputs: Vec<Vec<i32>> = texts.iter().map(|t| embedder.tokenize(t)).collect();
    // Many batches (64 sequences at most each), two jobs sharing them.
    let (a, b) = std::thread::scope(|s| {
        let first = s.spawn(|| embedder.embed_blocking(inputs[..120].to_vec()).unwrap());
        let second = s.spawn(|| embedder.embed_blocking(inputs[120..].to_vec()).unwrap());
        (first.join().unwrap(), second.join().unwrap())
    });
    let together: Vec<Vec<f32>> = a.into_iter().chain(b).collect();
    for (i, input) in inputs.iter().enumerate().step_by(7) {
        let alone = embedder.embed_blocking(vec![input.clone()]).unwrap().remove(0);
        let cosine: f32 = alone.iter().zip(&together[i]).map(|(x, y)| x * y).sum();
        assert!(cosine >= 0.9999, "input {i}: cosine {cosine}");
    }
}

#[test]
fn a_decoder_that_declares_pooling_embeds_each_input_alike_alone_or_batched() {
    // llama.cpp's `llama_pooling_type`: mean, and last token (Qwen3-Embedding's, e5-mistral's).
    for (name, pooling) in [("tiny-decoder-mean", 1), ("tiny-decoder-last", 3)] {
        let dir = std::env::temp_dir().join(format!("gantry-engine-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.gguf"));
        let spec = tiny_gguf::TinyModelSpec { pooling: Some(pooling), chat_template: None, ..Default::default() };
        tiny_gguf::write_tiny_model(&path, &spec).unwrap();
        let caps = Capabilities::read(&path).unwrap();
        assert_eq!((caps.embeds(), caps.ranks(), caps.generates()), (true, false, false), "{name}");

        let embedder = Embedder::start(&path, 2, &Offload::default(), None, None).unwrap();
        assert_eq!(embedder.embedding_shape().map(|s| s.dimensions), Some(64), "{name}: its embedding width");
        let texts = ["the cat sat", "the cat", "paris is the capital", "a", "the cat sat on the mat"];
        let inputs: Vec<Vec<i32>> = texts.iter().map(|t| embedder.tokenize(t)).collect();
        let together = embedder.embed_blocking(inputs.clone()).unwrap();
        // The cells a batch left behind are cleared before the next: the same vectors again.
        let again = embedder.embed_blocking(inputs.clone()).unwrap();
        let cosine = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        for (i, input) in inputs.iter().enumerate() {
            let norm = cosine(&together[i], &together[i]).sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{name} input {i}: norm {norm}");
            let alone = embedder.embed_blocking(vec![input.clone()]).unwrap().remove(0);
            assert!(cosine(&alone, &together[i]) >= 0.9999, "{name} input {i}: alone and batched");
            assert!(cosine(&again[i], &together[i]) >= 0.9999, "{name} input {i}: the second batch");
        }
        // Each input its own vector: one more token moves it.
        assert!(cosine(&together[0], &together[1]) < 0.9999, "{name}");
    }
}
