//! Loads generated models with llama.cpp (via llama-cpp-2) and exercises the tokenizer
//! and a short greedy generation. Only one `LlamaBackend` may exist per process, so all
//! llama checks live in a single test function.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tiny_gguf::{write_tiny_model, TinyModelSpec, CHATML_TEMPLATE, ENDOFTEXT_TOKEN, IM_END_TOKEN, IM_START_TOKEN};

#[test]
fn same_seed_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.gguf");
    let b = dir.path().join("b.gguf");
    let c = dir.path().join("c.gguf");
    let spec = TinyModelSpec { seed: 42, ..Default::default() };
    write_tiny_model(&a, &spec).unwrap();
    write_tiny_model(&b, &spec).unwrap();
    write_tiny_model(&c, &TinyModelSpec { seed: 43, ..Default::default() }).unwrap();
    let (a, b, c) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.len() < 2 * 1024 * 1024, "model is {} bytes", a.len());
}

fn argmax(logits: &[f32]) -> usize {
    assert!(logits.iter().all(|l| l.is_finite()), "non-finite logits");
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

#[test]
fn llama_cpp_loads_tokenizes_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = TinyModelSpec { seed: 7, ..Default::default() };
    write_tiny_model(&path, &spec).unwrap();

    let backend = LlamaBackend::init().unwrap();
    let model = LlamaModel::load_from_file(&backend, &path, &LlamaModelParams::default())
        .expect("llama.cpp failed to load the tiny model");

    // ---- metadata ----
    assert_eq!(model.n_layer(), spec.n_layer);
    assert_eq!(model.n_head(), spec.n_head);
    assert_eq!(model.n_head_kv(), spec.n_head_kv);
    assert_eq!(model.n_embd(), spec.n_embd as i32);
    assert_eq!(model.n_ctx_train(), spec.n_ctx_train);
    assert_eq!(model.meta_val_str("tokenizer.chat_template").unwrap(), CHATML_TEMPLATE);
    assert_eq!(model.meta_val_str("general.architecture").unwrap(), "llama");

    let vocab = model.vocab();
    let n_vocab = model.n_vocab();
    assert_eq!(vocab.n_tokens(), n_vocab);
    assert!((300..=600).contains(&n_vocab), "n_vocab = {n_vocab}");

    // ---- special tokens ----
    let text_of = |t: LlamaToken| vocab.text(t).unwrap().to_str().unwrap().to_owned();
    let single = |s: &str| {
        let toks = vocab.tokenize(s.as_bytes(), false, true);
        assert_eq!(toks.len(), 1, "{s:?} should be one token, got {toks:?}");
        toks[0]
    };
    let im_start = single(IM_START_TOKEN);
    let im_end = single(IM_END_TOKEN);
    let endoftext = single(ENDOFTEXT_TOKEN);
    assert_eq!(vocab.eos(), im_end);
    assert_eq!(vocab.eot(), im_end);
    assert_eq!(vocab.bos(), endoftext);
    assert_eq!(vocab.pad(), endoftext);
    assert!(!vocab.should_add_bos());
    assert!(vocab.is_eog(im_end));
    assert!(vocab.is_control(im_start) && vocab.is_control(im_end));
    assert_eq!(text_of(im_start), IM_START_TOKEN);

    // ordinary multi-character tokens exist
    assert_eq!(text_of(single("Hello")), "Hello");
    assert_eq!(text_of(single(" the")), "Ġthe");
    assert!(vocab.tokenize(b"Hello the world", false, false).len() < "Hello the world".len());

    // ---- tokenize / detokenize round trip ----
    let text = "Hello, wörld! 你好 <|im_start|>";
    let toks = vocab.tokenize(text.as_bytes(), false, true);
    assert_eq!(toks.iter().filter(|&&t| t == im_start).count(), 1);
    assert_eq!(*toks.last().unwrap(), im_start);
    let mut bytes = Vec::new();
    for &t in &toks[..toks.len() - 1] {
        bytes.extend(vocab.token_to_piece(t, false, None));
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), "Hello, wörld! 你好 ");
    // whole-sequence detokenize with special rendering reproduces the input
    let detok = vocab.detokenize(&toks, false, true);
    assert_eq!(String::from_utf8(detok).unwrap(), text);
    // without parse_special the marker is plain text (several tokens)
    assert!(!vocab.tokenize(text.as_bytes(), false, false).contains(&im_start));

    // arbitrary UTF-8 / control bytes round-trip too
    for s in ["\n\t\u{0}\u{7f} emoji: 🦀🎉, ÄÖÜß, ελληνικά, العربية", "  leading  and trailing  "]
    {
        let toks = vocab.tokenize(s.as_bytes(), false, false);
        let mut bytes = Vec::new();
        for &t in &toks {
            bytes.extend(vocab.token_to_piece(t, false, None));
        }
        assert_eq!(String::from_utf8(bytes).unwrap(), s);
    }

    // ---- inference ----
    let ctx_params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(256))
        .with_n_batch(256)
        .with_n_threads(2)
        .with_n_threads_batch(2);
    let mut ctx = model.new_context(&backend, ctx_params).expect("context");
    assert_eq!(ctx.n_ctx(), 256);

    let prompt = vocab.tokenize(b"<|im_start|>user\nHello<|im_end|>", false, true);
    let prompt = &prompt[..5];
    let mut batch = LlamaBatch::new(256, 1);
    for (i, &t) in prompt.iter().enumerate() {
        batch.add(t, i as i32, &[0], i == prompt.len() - 1).unwrap();
    }
    ctx.decode(&mut batch).expect("decode prompt");

    let mut generated = Vec::new();
    let mut logits_idx = batch.n_tokens() - 1;
    let mut distinct_logits = false;
    for pos in (prompt.len() as i32..).take(10) {
        let logits = ctx.get_logits_ith(logits_idx);
        assert_eq!(logits.len(), n_vocab as usize);
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let min = logits.iter().copied().fold(f32::MAX, f32::min);
        distinct_logits |= max - min > 1e-3;
        let next = LlamaToken(argmax(logits) as i32);
        generated.push(next);
        batch.clear();
        batch.add(next, pos, &[0], true).unwrap();
        ctx.decode(&mut batch).expect("decode generated token");
        logits_idx = 0;
    }
    assert_eq!(generated.len(), 10);
    assert!(distinct_logits, "logits should vary across the vocabulary");
    // last decode's logits are finite too
    argmax(ctx.get_logits_ith(0));
}
