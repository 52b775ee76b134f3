//! Images on a tiny random-weight model and projector: placement, exact usage, the prefix cache
//! keyed by image content, choices sharing one encode, and refusals.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::json;

use crate::tests::engine::{drain, tiny_model};
use crate::{
    ChatInput, Engine, EngineConfig, Event, Generator, ImageDetail, ImageError, ImageInput, PrepareError,
    SamplingParams, Usage,
};

pub(crate) fn tiny_projector(kind: tiny_gguf::ProjectorKind) -> PathBuf {
    static LLAVA: OnceLock<PathBuf> = OnceLock::new();
    static GEMMA3: OnceLock<PathBuf> = OnceLock::new();
    let (cell, spec, name) = match kind {
        tiny_gguf::ProjectorKind::Llava => (&LLAVA, tiny_gguf::TinyProjectorSpec::default(), "llava"),
        tiny_gguf::ProjectorKind::Gemma3 => (&GEMMA3, tiny_gguf::TinyProjectorSpec::gemma3(), "gemma3"),
    };
    cell.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gantry-engine-tiny-mmproj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("mmproj-{name}.gguf"));
        tiny_gguf::write_tiny_projector(&path, &spec).unwrap();
        path
    })
    .clone()
}

fn start(parallel: u32, with_projector: bool) -> Engine {
    start_with(parallel, with_projector.then_some(tiny_gguf::ProjectorKind::Llava))
}

fn start_with(parallel: u32, projector: Option<tiny_gguf::ProjectorKind>) -> Engine {
    let mut config = EngineConfig::new(tiny_model());
    config.mmproj_path = projector.map(tiny_projector);
    config.ctx_size = 512;
    config.parallel = parallel;
    config.threads = Some(1);
    Engine::start(config).unwrap()
}

pub(crate) fn png(seed: u8) -> Vec<u8> {
    let img =
        image::RgbImage::from_fn(48, 40, |x, y| image::Rgb([(x as u8).wrapping_mul(seed), (y as u8) ^ seed, seed]));
    let mut out = Vec::new();
    image::DynamicImage::ImageRgb8(img).write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png).unwrap();
    out
}

pub(crate) fn image(bytes: Vec<u8>) -> ImageInput {
    ImageInput { bytes, param: "messages[0].content[1].image_url".into(), detail: ImageDetail::Auto }
}

/// A user message with text around one image place.
fn input(engine: &Engine, n: u32) -> ChatInput {
    let marker = engine.model_info().image_marker.clone().expect("a vision model has a marker");
    ChatInput {
        messages: vec![json!({"role": "user", "content": format!("What is in{marker} this picture?")})],
        tools: None,
        n,
        max_tokens: Some(12),
        stop: Vec::new(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        logprobs: None,
        constraint: None,
        lazy_tools: None,
        cache_scope: crate::CacheScope::default(),
        answer_constraint: None,
        thinking: Default::default(),
    }
}

/// Runs the request with `bytes` as its image: each choice's text, the usage, and the prompt's
/// image placement `(start, len)`.
async fn ask(engine: &Engine, n: u32, bytes: Vec<u8>) -> (Vec<String>, Usage, (usize, usize)) {
    let mut request = engine.prepare(input(engine, n)).unwrap();
    engine.attach_images(&mut request, vec![image(bytes)]).unwrap();
    let placed = (request.prompt.images[0].start, request.prompt.images[0].len);
    let (events, usage) = drain(engine.submit(request).unwrap()).await;
    let mut texts = vec![String::new(); n as usize];
    for event in &events {
        match event {
            Event::Delta { choice, text, .. } => texts[*choice as usize].push_str(text),
            Event::Error(e) => panic!("the request failed: {e}"),
            _ => {}
        }
    }
    (texts, usage, placed)
}

#[tokio::test]
async fn an_image_takes_its_positions_in_the_prompt_and_in_usage() {
    let engine = start(2, true);
    let info = engine.model_info();
    assert!(info.supports_vision);
    let mut request = engine.prepare(input(&engine, 1)).unwrap();
    let estimate = request.prompt.tokens.len();
    engine.attach_images(&mut request, vec![image(png(3))]).unwrap();
    let [placed] = request.prompt.images.as_slice() else { panic!("one image placed") };
    let image_tokens = tiny_gguf::TinyProjectorSpec::default().image_tokens() as usize;
    assert!(placed.len >= image_tokens, "{} positions for a {image_tokens}-token image", placed.len);
    // Before the image was fetched, its place counted what admission reserves for one image.
    let reserve = engine.model().vision.as_ref().unwrap().reserve_tokens();
    assert_eq!(estimate - reserve, request.prompt.tokens.len() - placed.len, "the same text around it");
    assert!(placed.len <= reserve, "admission reserved at least what the image takes");
    assert_eq!(request.prompt.tokens.iter().filter(|&&t| t < 0).count(), placed.len);
    let prompt_len = request.prompt.tokens.len() as u32;
    let (events, usage) = drain(engine.submit(request).unwrap()).await;
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(usage.prompt_tokens, prompt_len);
    assert!(usage.completion_tokens > 0);
}

#[tokio::test]
async fn the_prefix_cache_reuses_an_image_only_for_the_same_bytes() {
    let engine = start(1, true);
    let (first, usage, (image_start, image_len)) = ask(&engine, 1, png(3)).await;
    assert_eq!(usage.cached_tokens, 0);
    // Same image again: everything but the last prompt token comes from the cache, image included.
    let (again, usage, _) = ask(&engine, 1, png(3)).await;
    assert_eq!(again, first);
    assert_eq!(usage.cached_tokens, usage.prompt_tokens - 1);
    assert!(usage.cached_tokens as usize > image_start + image_len);
    // Another image in the same place: only the text before it is reused, and the answer is the
    // one a cold engine gives.
    let (other, usage, _) = ask(&engine, 1, png(9)).await;
    assert_eq!(usage.cached_tokens as usize, image_start);
    let cold = start(1, true);
    let (cold_other, cold_usage, _) = ask(&cold, 1, png(9)).await;
    assert_eq!(cold_usage.cached_tokens, 0);
    assert_eq!(other, cold_other);
}

#[tokio::test]
async fn choices_share_one_image_encode_and_bill_the_prompt_once() {
    let engine = start(3, true);
    let (alone, alone_usage, _) = ask(&engine, 1, png(5)).await;
    let cold = start(3, true);
    let (texts, usage, _) = ask(&cold, 3, png(5)).await;
    assert_eq!(texts, vec![alone[0].clone(); 3], "greedy choices agree with a single answer");
    assert_eq!(usage.prompt_tokens, alone_usage.prompt_tokens);
}

#[tokio::test]
async fn unreadable_images_and_models_without_a_projector_are_refused() {
    let engine = start(1, true);
    let mut request = engine.prepare(input(&engine, 1)).unwrap();
    let mut broken = png(3);
    broken.truncate(50);
    let err = engine.attach_images(&mut request, vec![image(broken)]).unwrap_err();
    match &err {
        PrepareError::Image(ImageError::Unreadable { param, .. }) => {
            assert_eq!(param, "messages[0].content[1].image_url")
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("could not be decoded"), "{err}");
    // One place, two images.
    let err = engine.attach_images(&mut request, vec![image(png(1)), image(png(2))]).unwrap_err();
    assert!(matches!(err, PrepareError::Image(ImageError::Placement { markers: 1, images: 2 })), "{err:?}");

    let blind = start(1, false);
    assert!(!blind.model_info().supports_vision && blind.model_info().image_marker.is_none());
    let mut request = blind.prepare(input(&engine, 1)).unwrap();
    let err = blind.attach_images(&mut request, vec![image(png(1))]).unwrap_err();
    assert!(matches!(err, PrepareError::Image(ImageError::NoVision)), "{err:?}");
}

#[tokio::test]
async fn images_that_overflow_the_context_are_refused_once_their_size_is_known() {
    let engine = start(1, true);
    let mut fits = input(&engine, 1);
    let text_tokens =
        engine.prepare(input(&engine, 1)).unwrap().prompt.tokens.iter().filter(|&&t| t >= 0).count() as u32;
    // Room for the text and the completion, but not for the image's 16 positions too.
    fits.max_tokens = Some(512 - text_tokens - 4);
    let mut request = engine.prepare(fits).expect("the text alone fits");
    let err = engine.attach_images(&mut request, vec![image(png(3))]).unwrap_err();
    assert!(matches!(err, PrepareError::ContextLength { limit: 512, .. }), "{err:?}");
    // Without max_tokens the completion gets what the image leaves.
    let mut open = input(&engine, 1);
    open.max_tokens = None;
    let mut request = engine.prepare(open).unwrap();
    engine.attach_images(&mut request, vec![image(png(3))]).unwrap();
    assert_eq!(request.max_tokens as usize, 512 - request.prompt.tokens.len());
}

/// Gemma 3's layout: mtmd wraps the image in text and decodes it with non-causal attention, in
/// the same KV cache as a text stream running beside it.
#[tokio::test]
async fn a_gemma3_style_image_is_wrapped_decoded_non_causally_and_leaves_other_streams_alone() {
    let engine = start_with(2, Some(tiny_gguf::ProjectorKind::Gemma3));
    let mut request = engine.prepare(input(&engine, 1)).unwrap();
    engine.attach_images(&mut request, vec![image(png(4))]).unwrap();
    let placed = request.prompt.images[0].len;
    assert!(placed > 16, "the wrapper text's positions come with the image's 16: {placed}");
    let prompt_len = request.prompt.tokens.len() as u32;

    let mut text = input(&engine, 1);
    text.messages = vec![json!({"role": "user", "content": "Hello there, tell me a story"})];
    text.max_tokens = Some(24);
    let (alone, _) = drain(engine.submit(engine.prepare(text.clone()).unwrap()).unwrap()).await;

    let beside = engine.submit(engine.prepare(text).unwrap()).unwrap();
    let with_image = engine.submit(request).unwrap();
    let ((beside, _), (events, usage)) = tokio::join!(drain(beside), drain(with_image));
    assert!(matches!(events.last(), Some(Event::Done(_))), "{events:?}");
    assert_eq!(usage.prompt_tokens, prompt_len);
    let text_of = |events: &[Event]| -> String {
        events
            .iter()
            .filter_map(|e| if let Event::Delta { text, .. } = e { Some(text.as_str()) } else { None })
            .collect()
    };
    assert_eq!(text_of(&beside), text_of(&alone), "the image decode did not disturb the other stream");

    let (_, again, _) = ask(&engine, 1, png(4)).await;
    assert_eq!(again.cached_tokens, again.prompt_tokens - 1);
}

/// SmolVLM's template reads content as typed parts: the text (with the image's place in it)
/// reaches the prompt as one text part, so the image is still found and read.
#[tokio::test]
async fn a_template_reading_typed_parts_still_places_the_image() {
    const SMOLVLM: &str = "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
    let dir = std::env::temp_dir().join(format!("gantry-engine-typed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("typed.gguf");
    let spec = tiny_gguf::TinyModelSpec { chat_template: Some(SMOLVLM.into()), ..Default::default() };
    tiny_gguf::write_tiny_model(&model, &spec).unwrap();
    let mut config = EngineConfig::new(&model);
    config.mmproj_path = Some(tiny_projector(tiny_gguf::ProjectorKind::Llava));
    config.ctx_size = 512;
    config.parallel = 1;
    config.threads = Some(1);
    let engine = Engine::start(config).unwrap();
    let (_, usage, (start, len)) = ask(&engine, 1, png(3)).await;
    assert!(start > 0 && len == 16);
    assert!(usage.prompt_tokens as usize > start + len, "text before and after the image: {usage:?}");
}

/// A non-causal projector needs a whole image in one decode batch: a smaller --batch-size is
/// raised to hold one, and the image is read.
#[tokio::test]
async fn a_batch_too_small_for_a_non_causal_image_is_raised() {
    let mut config = EngineConfig::new(tiny_model());
    config.mmproj_path = Some(tiny_projector(tiny_gguf::ProjectorKind::Gemma3));
    config.ctx_size = 512;
    config.parallel = 1;
    config.batch_size = 8;
    config.threads = Some(1);
    let engine = Engine::start(config).unwrap();
    let reserve = engine.model().vision.as_ref().unwrap().reserve_tokens();
    assert!(reserve > 17, "image tokens and wrapper text: {reserve}");
    assert_eq!(engine.config().batch_size as usize, reserve);
    let (_, usage, (_, len)) = ask(&engine, 1, png(2)).await;
    assert!(len > 16 && usage.completion_tokens > 0);
}
