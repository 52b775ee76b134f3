//! The Q5_0 → Q8_0 twin: every block's values kept, a model served from it with the same weights,
//! the source served where no twin can be written, and the estimate counting its larger weights.

#![allow(unsafe_code, reason = "ggml's quantisation functions and model loader are C")]
use super::*;
use llama_cpp_sys_2 as sys;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// ggml's own dequantization of `bytes` of type `ty`.
fn to_float(ty: sys::ggml_type, bytes: &[u8]) -> Vec<f32> {
    crate::model::backend::llama_backend();
    // SAFETY: ggml's static type table; `bytes` holds whole blocks of `ty`.
    unsafe {
        let traits = &*sys::ggml_get_type_traits(ty);
        assert_eq!(bytes.len() % traits.type_size, 0);
        let n = bytes.len() / traits.type_size * traits.blck_size as usize;
        let mut out = vec![0f32; n];
        traits.to_float.expect("a quantized type dequantizes")(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64);
        out
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn every_q5_0_block_has_a_q8_0_twin_with_the_same_values() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // Scales: 1, -0.5, about 0.1, the smallest subnormal, the largest finite f16.
    let scales = [0x3c00u16, 0xb800, 0x2e66, 0x0001, 0x7bff];
    let (mut q5, mut q8) = (Vec::new(), Vec::new());
    for i in 0..4096 {
        let mut block = [0u8; Q5_0_BLOCK];
        block.iter_mut().for_each(|b| *b = next() as u8);
        // The extremes of the 5-bit range too: every value 0 (-16) and every value 31 (+15).
        if i < 2 {
            block[2..].fill(if i == 0 { 0 } else { 0xff });
        }
        block[..2].copy_from_slice(&scales[i % scales.len()].to_le_bytes());
        q5.extend_from_slice(&block);
        q8.extend_from_slice(&q5_0_to_q8_0(&block));
    }
    let (from_q5, from_q8) = (to_float(GGML_TYPE_Q5_0, &q5), to_float(GGML_TYPE_Q8_0, &q8));
    assert_eq!(from_q5.len(), 4096 * 32);
    assert_eq!(bits(&from_q5), bits(&from_q8), "bit for bit what ggml reads from the Q5_0 block");
    assert_eq!(&from_q5[..32], &[-16.0; 32], "an all-zero block holds -16 times its scale");
    assert_eq!(&from_q5[32..64], &[-7.5; 32], "an all-ones block holds 15 times -0.5");
}

/// The tiny fixture quantized by llama.cpp to Q5_0 (its tied embedding too).
fn tiny_q5_0_model(dir: &Path) -> PathBuf {
    let f32_model = dir.join("tiny-f32.gguf");
    tiny_gguf::write_tiny_model(&f32_model, &tiny_gguf::TinyModelSpec::default()).unwrap();
    let q5 = dir.join("tiny-q5_0.gguf");
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    crate::model::backend::llama_backend();
    // SAFETY: valid paths and llama.cpp's default parameters with the type set.
    let rc = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.ftype = sys::LLAMA_FTYPE_MOSTLY_Q5_0;
        params.nthread = 1;
        sys::llama_model_quantize(c(&f32_model).as_ptr(), c(&q5).as_ptr(), &params)
    };
    assert_eq!(rc, 0, "llama.cpp quantized the fixture");
    q5
}

fn read_span(path: &Path, (start, len): (u64, u64)) -> Vec<u8> {
    let mut file = File::open(path).unwrap();
    file.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; len as usize];
    file.read_exact(&mut buf).unwrap();
    buf
}

#[test]
fn a_q5_0_model_is_served_from_a_twin_with_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_q5_0_model(dir.path());
    let converted = plan(&source).expect("the quantized fixture has Q5_0 matrices");
    let twins = dir.path().join("twins");

    let twin = weights_to_load(&source, &twins);
    assert_ne!(twin, source);
    assert!(twin.starts_with(&twins) && twin.is_file());
    let leftovers: Vec<_> = std::fs::read_dir(&twins).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the twin, no partial file: {leftovers:?}");
    let written = std::fs::metadata(&twin).unwrap().modified().unwrap();
    assert_eq!(weights_to_load(&source, &twins), twin, "found again, not written again");
    assert_eq!(std::fs::metadata(&twin).unwrap().modified().unwrap(), written);

    let (from, to) = (Header::open(&source).unwrap(), Header::open(&twin).unwrap());
    assert_eq!(from.n_tensors(), to.n_tensors());
    assert!(plan(&twin).is_none(), "nothing left to convert");
    for id in 0..from.n_tensors() {
        assert_eq!(from.tensor_name(id), to.tensor_name(id));
        let (src_ty, dst_ty) = (from.tensor_type(id), to.tensor_type(id));
        let (src, dst) = (read_span(&source, from.tensor_span(id)), read_span(&twin, to.tensor_span(id)));
        if converted.tensors.contains(&id) {
            assert_eq!((src_ty, dst_ty), (GGML_TYPE_Q5_0, GGML_TYPE_Q8_0), "{}", from.tensor_name(id));
            assert_eq!(bits(&to_float(src_ty, &src)), bits(&to_float(dst_ty, &dst)), "{}", from.tensor_name(id));
        } else {
            assert_eq!((src_ty, &src), (dst_ty, &dst), "{} copied as it is", from.tensor_name(id));
        }
    }
    let grown = std::fs::metadata(&twin).unwrap().len() - std::fs::metadata(&source).unwrap().len();
    let extra = converted.growth() as u64;
    assert!(grown >= extra && grown < extra + 64 * converted.tensors.len() as u64, "{grown}");

    // llama.cpp serves the twin as the same model: the same vocabulary and template.
    let offload = crate::Offload::default();
    let (a, b) = (
        crate::LoadedModel::load(&source, None, 1, &offload).unwrap(),
        crate::LoadedModel::load(&twin, None, 1, &offload).unwrap(),
    );
    assert_eq!(a.info().chat_template, b.info().chat_template);
    assert_eq!(a.info().n_vocab, b.info().n_vocab);
    assert_eq!(a.info().n_params, b.info().n_params);
}

#[test]
fn models_without_q5_0_matrices_and_unreadable_files_are_served_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let f32_model = dir.path().join("tiny.gguf");
    tiny_gguf::write_tiny_model(&f32_model, &tiny_gguf::TinyModelSpec::default()).unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf").unwrap();
    let twins = dir.path().join("twins");
    for model in [&f32_model, &junk, &dir.path().join("missing.gguf")] {
        assert!(plan(model).is_none());
        assert_eq!(&weights_to_load(model, &twins), model);
    }
    assert!(!twins.exists(), "nothing written");
}

#[test]
fn a_twin_that_cannot_be_written_leaves_the_source_served() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_q5_0_model(dir.path());
    // A file where the twins' directory would be.
    let blocked = dir.path().join("not-a-dir");
    std::fs::write(&blocked, b"").unwrap();
    assert_eq!(weights_to_load(&source, &blocked), source);
}

#[test]
fn the_memory_estimate_counts_the_twins_larger_weights() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_q5_0_model(dir.path());
    let mut config = crate::EngineConfig::new(&source);
    let as_is = config.estimate_memory().unwrap();
    config.q8_twin_dir = Some(dir.path().join("twins"));
    let twin = config.estimate_memory().unwrap();
    assert_eq!((twin.weights - as_is.weights) as i64, plan(&source).unwrap().growth());
    assert!(plan(&source).unwrap().growth() > 0);
    assert_eq!((twin.kv_cache, twin.compute), (as_is.kv_cache, as_is.compute));
}
