//! The F32 → BF16 twin: the bytes llama-quantize writes, a BERT embedding the same from it, and
//! the memory estimate counting its smaller weights.

#![allow(unsafe_code, reason = "llama.cpp's quantizer is C")]
use super::*;
use crate::model::twins::weights_to_load as twin_of;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use tiny_gguf::{BertPooling, TinyBertSpec};

fn tiny_bert(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-bert.gguf");
    tiny_gguf::write_tiny_bert(&path, &TinyBertSpec { pooling: BertPooling::Mean, ..Default::default() }).unwrap();
    path
}

/// Every tensor by name: its type and bytes.
fn tensors(path: &Path) -> HashMap<String, (llama_cpp_sys_2::ggml_type, Vec<u8>)> {
    let header = Header::open(path).unwrap();
    let mut file = std::fs::File::open(path).unwrap();
    (0..header.n_tensors())
        .map(|id| {
            let (start, len) = header.tensor_span(id);
            file.seek(SeekFrom::Start(start)).unwrap();
            let mut bytes = vec![0u8; len as usize];
            file.read_exact(&mut bytes).unwrap();
            (header.tensor_name(id), (header.tensor_type(id), bytes))
        })
        .collect()
}

#[test]
fn the_twin_holds_what_llama_quantize_writes_for_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_bert(dir.path());
    let plan = plan(&source).expect("a tiny BERT has F32 matrices");
    let twin = twin_of(&source, &dir.path().join("twins"), &CONVERSION);
    assert_ne!(twin, source);
    assert!(super::plan(&twin).is_none(), "nothing left to convert");

    let quantized = dir.path().join("tiny-bert-bf16.gguf");
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    crate::model::backend::llama_backend();
    // SAFETY: valid paths and llama.cpp's default parameters with the type set.
    let rc = unsafe {
        let mut params = llama_cpp_sys_2::llama_model_quantize_default_params();
        params.ftype = llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_BF16;
        params.nthread = 1;
        llama_cpp_sys_2::llama_model_quantize(c(&source).as_ptr(), c(&quantized).as_ptr(), &params)
    };
    assert_eq!(rc, 0, "llama.cpp converted the fixture");

    let (ours, theirs, original) = (tensors(&twin), tensors(&quantized), tensors(&source));
    assert_eq!(ours.len(), theirs.len());
    let mut converted = 0;
    for (name, (ty, bytes)) in &ours {
        assert_eq!(Some(&(*ty, bytes.clone())), theirs.get(name), "{name}: the type and bytes llama-quantize writes");
        if *ty == GGML_TYPE_BF16 {
            converted += 1;
            assert_eq!(original[name].1.len(), bytes.len() * 2, "{name}");
        } else {
            assert_eq!(original[name], (*ty, bytes.clone()), "{name} copied as it is");
        }
    }
    assert_eq!(converted, plan.tensors.len());
    assert!(ours["token_embd.weight"].0 == GGML_TYPE_BF16 && ours["position_embd.weight"].0 == GGML_TYPE_F32);
    let shrunk = std::fs::metadata(&source).unwrap().len() - std::fs::metadata(&twin).unwrap().len();
    assert!(shrunk <= plan.growth().unsigned_abs() && shrunk + 64 * converted as u64 > plan.growth().unsigned_abs());
}

#[test]
fn a_bert_embeds_from_its_twin_as_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_bert(dir.path());
    let twin = twin_of(&source, &dir.path().join("twins"), &CONVERSION);
    let offload = crate::Offload::default();
    let (a, b) = (
        crate::Embedder::start(&source, 1, &offload, None, None).unwrap(),
        crate::Embedder::start(&twin, 1, &offload, None, None).unwrap(),
    );
    let texts = ["the cat sat on the mat", "paris", "the stock market fell"];
    let inputs: Vec<Vec<i32>> = texts.iter().map(|t| a.tokenize(t)).collect();
    assert_eq!(inputs, texts.iter().map(|t| b.tokenize(t)).collect::<Vec<_>>(), "the same vocabulary");
    let (x, y) = (a.embed_blocking(inputs.clone()).unwrap(), b.embed_blocking(inputs).unwrap());
    for (u, v) in x.iter().zip(&y) {
        let cosine: f32 = u.iter().zip(v).map(|(p, q)| p * q).sum();
        assert!(cosine >= 0.999 && u != v, "{cosine}: close, and computed in BF16");
    }
}

#[test]
fn models_without_f32_matrices_and_unreadable_files_have_nothing_to_convert() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_bert(dir.path());
    let twin = twin_of(&source, &dir.path().join("twins"), &CONVERSION);
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf").unwrap();
    for model in [&twin, &junk, &dir.path().join("missing.gguf")] {
        assert!(plan(model).is_none(), "{}", model.display());
        assert_eq!(&twin_of(model, &dir.path().join("other"), &CONVERSION), model);
    }
    assert!(!dir.path().join("other").exists(), "nothing written");
    assert_eq!(convert(&[0u8; 6]), None, "not whole F32 values");
    assert_eq!(convert(&1.0f32.to_le_bytes()), Some(vec![0x80, 0x3f]));
}

#[test]
fn the_memory_estimate_counts_the_twins_smaller_weights_where_it_pays() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_bert(dir.path());
    let mut config = crate::EngineConfig::new(&source);
    let as_is = config.estimate_memory().unwrap();
    config.bf16_twin_dir = Some(dir.path().join("twins"));
    let twin = config.estimate_memory().unwrap();
    let saved = if pays_here() { plan(&source).unwrap().growth().unsigned_abs() } else { 0 };
    assert_eq!(as_is.weights - twin.weights, saved);
    assert_eq!((twin.kv_cache, twin.compute), (as_is.kv_cache, as_is.compute));
}
