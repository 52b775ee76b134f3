//! Images in prompts, through llama.cpp's multimodal library (`mtmd`) and a projector GGUF.
//!
//! The server writes [`Vision::marker`] into the conversation where each image part was; the
//! rendered prompt is split there. Text pieces are tokenized as usual; each image is decoded
//! (PNG, JPEG, GIF's first frame, WEBP, BMP), turned into an RGB bitmap and tokenized by mtmd on
//! its own, giving a small chunk list (the projector's own wrapper text, if any, and the image)
//! that the scheduler evaluates in one piece into the sequence's KV cells.
//!
//! Decoding ([`DecodedImage::decode`]) needs no projector, so it cannot take the projector's
//! lock, which the scheduler thread takes to evaluate images: only mtmd's own tokenizing of the
//! decoded bitmap ([`Vision::tokenize`]) runs under it.
//!
//! In the prompt's token list an image's positions hold negative ids derived from a keyed hash of
//! the decoded bitmap (and its position in the image): never real tokens, so nothing decodes them,
//! but the prefix cache compares them like any other. The same image bytes in the same place
//! match; another image differs from its first position, so only the text before it is reused.

use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::mtmd::{MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunks, MtmdInputText};

/// How finely the model should look at an image (`image_url.detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Detail {
    #[default]
    Auto,
    /// Downscaled so its longer side is at most [`LOW_DETAIL_SIDE`]: a projector that tiles
    /// large images into several crops sees one.
    Low,
    High,
}

/// Longest side of an image sent with `detail: "low"`, as OpenAI's low-resolution mode.
pub const LOW_DETAIL_SIDE: u32 = 512;
/// Images wider or taller than this are refused rather than decoded (a small file can declare
/// an enormous canvas).
const MAX_SIDE: u32 = 16_384;
const MAX_DECODE_BYTES: u64 = 512 << 20;

/// One image of a request, as fetched.
#[derive(Debug, Clone)]
pub struct ImageInput {
    pub bytes: Vec<u8>,
    /// The request field it came from (`messages[i].content[j].image_url`), named in errors.
    pub param: String,
    pub detail: Detail,
}

/// An image's place in a prompt: `len` positions from token index `start`.
#[derive(Debug, Clone)]
pub struct PromptImage {
    pub start: usize,
    pub len: usize,
    /// What mtmd evaluates for it (wrapper text and image), shared by the request's clones.
    pub chunks: Arc<MtmdInputChunks>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("Invalid '{param}': {reason}")]
    Unreadable { param: String, reason: String },
    #[error("Invalid 'messages': the chat template wrote {markers} image places for {images} images; this model's template cannot show these images")]
    Placement { markers: usize, images: usize },
    #[error("this model does not support image inputs")]
    NoVision,
}

/// An image decoded into the bitmap mtmd reads, with its identity: an owned value, made without
/// the projector (see the module comment).
pub(crate) struct DecodedImage {
    bitmap: MtmdBitmap,
    /// The keyed hash of the decoded bitmap (see [`image_identity`]).
    id: u64,
    /// The request field it came from, named in errors.
    param: String,
}

impl DecodedImage {
    /// Decodes `image` (PNG, JPEG, GIF's first frame, WEBP, BMP), `detail: low` downscaled.
    /// Blocking, CPU-bound.
    pub(crate) fn decode(image: &ImageInput) -> Result<Self, ImageError> {
        let unreadable = |reason: String| ImageError::Unreadable { param: image.param.clone(), reason };
        let (nx, ny, rgb) = decode_rgb(&image.bytes, image.detail).map_err(unreadable)?;
        let id = image_identity(nx, ny, &rgb);
        let bitmap = identified_bitmap(nx, ny, &rgb, id).map_err(unreadable)?;
        Ok(Self { bitmap, id, param: image.param.clone() })
    }
}

fn identified_bitmap(nx: u32, ny: u32, rgb: &[u8], id: u64) -> Result<MtmdBitmap, String> {
    let mut bitmap = MtmdBitmap::from_image_data(nx, ny, rgb).map_err(|e| e.to_string())?;
    bitmap.set_id(&format!("{id:016x}")).map_err(|e| e.to_string())?;
    Ok(bitmap)
}

/// The projector and what the rest of the engine needs to know about it.
pub(crate) struct Vision {
    /// Encoding and evaluation (the scheduler thread) need it exclusively, and llama-cpp-2
    /// lets tokenizing (the server's threads) run only while they do not: held for mtmd's
    /// tokenizing of a decoded image alone.
    ctx: Mutex<MtmdContext>,
    marker: String,
    /// Positions one image is assumed to take before it is fetched (admission reserves them).
    reserve_tokens: usize,
    /// The model attends to an image's tokens both ways (Gemma 3): llama.cpp then needs the
    /// whole image in one micro-batch.
    non_causal: bool,
}

impl std::fmt::Debug for Vision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vision").field("marker", &self.marker).field("reserve_tokens", &self.reserve_tokens).finish()
    }
}

impl Vision {
    pub(crate) fn load(path: &Path, model: &LlamaModel, threads: i32) -> Result<Self, String> {
        if !path.is_file() {
            return Err(format!("projector file {} does not exist", path.display()));
        }
        // A marker no client can guess, so text that happens to contain llama.cpp's default
        // `<__media__>` stays text.
        let marker = format!("<__gantry_image_{:016x}__>", random_u64());
        let params = MtmdContextParams {
            use_gpu: false,
            print_timings: false,
            n_threads: threads,
            media_marker: std::ffi::CString::new(marker.clone()).expect("marker has no NUL"),
            image_min_tokens: -1,
            image_max_tokens: -1,
        };
        let path_str = path.to_str().ok_or_else(|| format!("projector path {} is not UTF-8", path.display()))?;
        let ctx = MtmdContext::init_from_file(path_str, model, &params)
            .map_err(|e| format!("llama.cpp could not load the projector {}: {e}", path.display()))?;
        if !ctx.support_vision() {
            return Err(format!("{} is not an image projector (audio only?)", path.display()));
        }
        // M-RoPE models (the Qwen2-VL family) place an image's tokens on a 2-D grid of fewer
        // positions than tokens; the scheduler's one-position-per-cell bookkeeping cannot hold
        // that yet.
        if ctx.decode_use_mrope() {
            return Err(format!(
                "{}: projectors with M-RoPE positions (Qwen2-VL / Qwen2.5-VL) are not supported yet; use SmolVLM or Gemma 3",
                path.display()
            ));
        }
        let non_causal = ctx.decode_use_non_causal();
        let mut vision = Self { ctx: Mutex::new(ctx), marker, reserve_tokens: 0, non_causal };
        // A large image: projectors that tile use their most tiles for it.
        let probe = identified_bitmap(1024, 1024, &vec![128u8; 1024 * 1024 * 3], 0)?;
        let chunks =
            vision.tokenize_bitmap(&probe).map_err(|e| format!("the projector cannot tokenize an image: {e}"))?;
        vision.reserve_tokens = chunks.total_tokens();
        Ok(vision)
    }

    /// Text the prompt holds where an image goes.
    pub(crate) fn marker(&self) -> &str {
        &self.marker
    }

    pub(crate) fn reserve_tokens(&self) -> usize {
        self.reserve_tokens
    }

    /// The smallest decode batch that holds one image when the model needs it whole, if it does.
    pub(crate) fn min_batch(&self) -> Option<usize> {
        self.non_causal.then_some(self.reserve_tokens)
    }

    /// Tokenizes a decoded image for the projector: its chunks and the hash identifying it.
    pub(crate) fn tokenize(&self, image: &DecodedImage) -> Result<(Arc<MtmdInputChunks>, u64), ImageError> {
        let chunks = self.tokenize_bitmap(&image.bitmap).map_err(|e| ImageError::Unreadable {
            param: image.param.clone(),
            reason: format!("the model cannot read this image ({e})."),
        })?;
        Ok((Arc::new(chunks), image.id))
    }

    fn tokenize_bitmap(&self, bitmap: &MtmdBitmap) -> Result<MtmdInputChunks, String> {
        let text = MtmdInputText { text: self.marker.clone(), add_special: false, parse_special: true };
        let ctx = self.ctx.lock().expect("vision lock");
        ctx.tokenize(text, &[bitmap]).map_err(|e| e.to_string())
    }

    /// Encodes an image and writes its positions into `seq` from position `at` (one image
    /// encode; the caller's step waits for it).
    pub(crate) fn evaluate(
        &self,
        ctx: &mut LlamaContext<'_>,
        image: &PromptImage,
        seq: i32,
        n_batch: i32,
    ) -> Result<(), String> {
        let mut mtmd = self.ctx.lock().expect("vision lock");
        let end = image
            .chunks
            .eval_chunks(&mut mtmd, ctx, crate::units::llama_pos(image.start), seq, n_batch, false)
            .map_err(|e| e.to_string())?;
        if end as usize != image.start + image.len {
            return Err(format!("the image took {} positions, {} expected", end as usize - image.start, image.len));
        }
        Ok(())
    }
}

/// What identifies a decoded image in the prefix cache: a keyed hash of its bitmap (see
/// `keyed_hash`), so no client can craft an image whose ids match another client's image.
fn image_identity(nx: u32, ny: u32, rgb: &[u8]) -> u64 {
    crate::keyed_hash::keyed_hash((nx, ny, rgb))
}

/// Ids standing for an image's `len` positions in a prompt (see the module comment): negative,
/// and a function of the image and the position, so two images differ at their first position.
pub(crate) fn image_token_ids(id: u64, len: usize) -> Vec<i32> {
    (0..len as u64)
        .map(|i| {
            let mut h = id ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            // splitmix64's finalizer.
            h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            h ^= h >> 31;
            -1 - i32::try_from(h % i32::MAX as u64).expect("below i32::MAX")
        })
        .collect()
}

/// The image as 8-bit RGB, `detail: low` downscaled.
fn decode_rgb(bytes: &[u8], detail: Detail) -> Result<(u32, u32, Vec<u8>), String> {
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("could not read the image ({e})."))?;
    if reader.format().is_none() {
        return Err("unsupported image format; send PNG, JPEG, GIF, WEBP or BMP.".into());
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let mut img = reader.decode().map_err(|e| format!("the image could not be decoded ({e})."))?;
    if img.width() == 0 || img.height() == 0 {
        return Err("the image is empty.".into());
    }
    if detail == Detail::Low && img.width().max(img.height()) > LOW_DETAIL_SIDE {
        img = img.resize(LOW_DETAIL_SIDE, LOW_DETAIL_SIDE, image::imageops::FilterType::Triangle);
    }
    let rgb = img.to_rgb8();
    Ok((rgb.width(), rgb.height(), rgb.into_raw()))
}

fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, 90]));
        let mut out = Vec::new();
        image::DynamicImage::ImageRgb8(img).write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png).unwrap();
        out
    }

    #[test]
    fn image_ids_are_negative_and_differ_per_image_and_position() {
        let a = image_token_ids(1, 64);
        let b = image_token_ids(2, 64);
        assert!(a.iter().chain(&b).all(|&t| t < 0));
        assert_ne!(a[0], b[0]);
        assert_eq!(a, image_token_ids(1, 64));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 64);
    }

    #[test]
    fn image_identity_is_keyed_not_the_public_unkeyed_hash() {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let (_, _, rgb) = decode_rgb(&png(8, 8), Detail::Auto).unwrap();
        let id = image_identity(8, 8, &rgb);
        assert_eq!(id, image_identity(8, 8, &rgb), "the same image matches itself");
        assert_ne!(id, image_identity(4, 16, &rgb), "the same bytes in another shape differ");
        // What an unkeyed hash gives, and anyone could compute offline to craft a collision.
        let mut unkeyed = DefaultHasher::new();
        (8u32, 8u32).hash(&mut unkeyed);
        rgb.hash(&mut unkeyed);
        assert_ne!(id, unkeyed.finish());
    }

    #[test]
    fn images_decode_to_rgb_and_low_detail_downscales() {
        let (w, h, rgb) = decode_rgb(&png(40, 30), Detail::Auto).unwrap();
        assert_eq!((w, h, rgb.len()), (40, 30, 40 * 30 * 3));
        assert_eq!(&rgb[3..6], &[7, 0, 90]);
        let (w, h, _) = decode_rgb(&png(1024, 256), Detail::Low).unwrap();
        assert_eq!((w, h), (512, 128));
        let (w, h, _) = decode_rgb(&png(1024, 256), Detail::High).unwrap();
        assert_eq!((w, h), (1024, 256));
    }

    #[test]
    fn every_accepted_format_decodes() {
        let img = image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(24, 16, |x, y| {
            image::Rgb([x as u8 * 9, y as u8 * 9, 40])
        }));
        for format in
            [image::ImageFormat::Jpeg, image::ImageFormat::Gif, image::ImageFormat::WebP, image::ImageFormat::Bmp]
        {
            let mut bytes = Vec::new();
            img.write_to(&mut Cursor::new(&mut bytes), format).unwrap();
            let (w, h, rgb) = decode_rgb(&bytes, Detail::Auto).unwrap_or_else(|e| panic!("{format:?}: {e}"));
            assert_eq!((w, h, rgb.len()), (24, 16, 24 * 16 * 3), "{format:?}");
        }
    }

    #[test]
    fn images_decode_without_the_projector() {
        // No `Vision` exists here: decoding cannot take the projector's lock, which the scheduler
        // thread holds while it evaluates images.
        let param = "messages[0].content[1].image_url";
        let image = ImageInput { bytes: png(1024, 256), param: param.into(), detail: Detail::Low };
        let decoded = DecodedImage::decode(&image).unwrap();
        assert_eq!((decoded.bitmap.nx(), decoded.bitmap.ny()), (512, 128));
        let (_, _, rgb) = decode_rgb(&image.bytes, Detail::Low).unwrap();
        assert_eq!(decoded.id, image_identity(512, 128, &rgb));
        assert_eq!(decoded.bitmap.data(), &rgb[..]);
        let broken = ImageInput { bytes: b"%PDF-1.7".to_vec(), ..image };
        match DecodedImage::decode(&broken) {
            Err(ImageError::Unreadable { param: named, reason }) => {
                assert_eq!(named, param);
                assert!(reason.contains("unsupported image format"), "{reason}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a PDF decoded"),
        }
    }

    #[test]
    fn broken_or_foreign_bytes_are_refused_with_a_reason() {
        let mut truncated = png(40, 30);
        truncated.truncate(60);
        assert!(decode_rgb(&truncated, Detail::Auto).unwrap_err().contains("could not be decoded"));
        assert!(decode_rgb(b"%PDF-1.7 not an image", Detail::Auto).unwrap_err().contains("unsupported image format"));
    }
}
