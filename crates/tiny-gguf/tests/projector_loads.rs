//! Loads a tiny model plus a tiny multimodal projector with llama.cpp's `mtmd` (via
//! llama-cpp-2), turns an RGB image into image tokens and evaluates them in a text context.
//! Only one `LlamaBackend` may exist per process, so everything lives in one test function.

use std::ffi::CString;
use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunkType, MtmdInputText,
};
use tiny_gguf::{write_tiny_model, write_tiny_projector, TinyModelSpec, TinyProjectorSpec};

#[test]
fn mtmd_loads_projector_and_evaluates_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("tiny.gguf");
    let mmproj_path = dir.path().join("tiny-mmproj.gguf");
    let model_spec = TinyModelSpec { seed: 5, ..Default::default() };
    let spec = TinyProjectorSpec { text_n_embd: model_spec.n_embd, seed: 5, ..Default::default() };
    write_tiny_model(&model_path, &model_spec).unwrap();
    write_tiny_projector(&mmproj_path, &spec).unwrap();

    let backend = LlamaBackend::init().unwrap();
    let model = LlamaModel::load_from_file(&backend, &model_path, &LlamaModelParams::default())
        .expect("llama.cpp failed to load the tiny model");

    let params = MtmdContextParams {
        use_gpu: false,
        print_timings: false,
        n_threads: 2,
        media_marker: CString::new(mtmd_default_marker()).unwrap(),
        ..MtmdContextParams::default()
    };
    let mut mtmd_ctx = MtmdContext::init_from_file(mmproj_path.to_str().unwrap(), &model, &params)
        .expect("mtmd failed to load the tiny projector");
    assert!(mtmd_ctx.support_vision());
    assert!(!mtmd_ctx.support_audio());
    assert!(!mtmd_ctx.decode_use_mrope());

    // A non-square gradient, so the resize-and-pad path runs too.
    let (nx, ny) = (48u32, 40u32);
    let rgb: Vec<u8> =
        (0..ny).flat_map(|y| (0..nx).flat_map(move |x| [(x * 5) as u8, (y * 6) as u8, ((x + y) * 3) as u8])).collect();
    let bitmap = MtmdBitmap::from_image_data(nx, ny, &rgb).unwrap();

    let text =
        MtmdInputText { text: format!("{}describe", mtmd_default_marker()), add_special: true, parse_special: true };
    let chunks = mtmd_ctx.tokenize(text, &[&bitmap]).expect("mtmd_tokenize failed");
    let kinds: Vec<MtmdInputChunkType> = (0..chunks.len()).map(|i| chunks.get(i).unwrap().chunk_type()).collect();
    let images: Vec<usize> = (0..chunks.len()).filter(|&i| kinds[i] == MtmdInputChunkType::Image).collect();
    assert_eq!(images.len(), 1, "chunk kinds: {kinds:?}");
    let image = chunks.get(images[0]).unwrap();
    assert_eq!(image.n_tokens(), spec.image_tokens() as usize);
    assert_eq!(image.n_positions(), spec.image_tokens() as i32);
    // The `mlp` projector wraps no text around the image: image chunk, then the prompt text.
    assert_eq!(kinds, [MtmdInputChunkType::Image, MtmdInputChunkType::Text]);
    let text_tokens = chunks.get(1).unwrap().n_tokens();
    assert_eq!(chunks.total_tokens(), spec.image_tokens() as usize + text_tokens);

    let ctx_params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(512))
        .with_n_batch(512)
        .with_n_threads(2)
        .with_n_threads_batch(2);
    let mut ctx = model.new_context(&backend, ctx_params).unwrap();
    let n_past = chunks
        .eval_chunks(&mut mtmd_ctx, &mut ctx, 0, 0, 512, true)
        .expect("evaluating the image and text chunks failed");
    assert_eq!(n_past, chunks.total_positions());
    assert_eq!(n_past, (spec.image_tokens() as usize + text_tokens) as i32);
    let logits = ctx.get_logits();
    assert_eq!(logits.len(), model.n_vocab() as usize);
    assert!(logits.iter().all(|l| l.is_finite()), "non-finite logits after the image");
}
