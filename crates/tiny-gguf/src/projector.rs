//! A tiny random-weight multimodal projector (`mmproj`) that llama.cpp's `mtmd` library loads
//! beside a tiny model, so image input can be tested without a real vision-language model.
//!
//! It is a LLaVA-1.5 style projector (`clip.projector_type = "mlp"`): a small ViT (patch
//! embedding convolution, learned positions, pre-norm blocks with biased attention and a GELU
//! feed-forward) whose patch outputs go through a two-layer MLP (`mm.0`, GELU, `mm.2`) into the
//! text model's embedding width. mtmd wraps nothing around its images, resizes every image to
//! `image_size` (padding to square) and turns it into `(image_size / patch_size)²` tokens. LLaVA
//! reads the output of the second-to-last block, so with the default two blocks one runs.
//!
//! [`ProjectorKind::Gemma3`] writes Gemma 3's layout instead (`"gemma3"`): a SigLIP-style ViT
//! whose patch grid is average-pooled by `GEMMA3_MERGE` per side, RMS-normed and projected. mtmd
//! wraps its images in `<start_of_image>` … `<end_of_image>` text and decodes them with
//! non-causal attention, the two paths the LLaVA layout does not exercise.

use std::io;
use std::path::Path;

use crate::gguf_writer::{assemble, KvWriter, SplitMix64, Tensor, ALIGNMENT};

/// Which real projector's layout to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProjectorKind {
    #[default]
    Llava,
    Gemma3,
}

/// Gemma 3's pooling kernel per side in the tiny layout (real Gemma 3 uses 4).
pub const GEMMA3_MERGE: u32 = 2;

/// Shape and seed of a tiny projector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyProjectorSpec {
    pub kind: ProjectorKind,
    /// Embedding width of the text model it feeds (`TinyModelSpec::n_embd`, default 64).
    pub text_n_embd: u32,
    /// Side of the square every image is resized to (default 32).
    pub image_size: u32,
    /// Side of one patch (default 8: 16 patches, so 16 image tokens).
    pub patch_size: u32,
    /// Vision encoder width (default 32).
    pub n_embd: u32,
    pub n_head: u32,
    /// Must differ from `n_embd`: llama.cpp swaps the feed-forward weights of old LLaVA files
    /// whose `ffn_down` rows are `n_embd` long.
    pub n_ff: u32,
    pub n_layer: u32,
    pub seed: u64,
}

impl Default for TinyProjectorSpec {
    fn default() -> Self {
        Self {
            kind: ProjectorKind::Llava,
            text_n_embd: 64,
            image_size: 32,
            patch_size: 8,
            n_embd: 32,
            n_head: 2,
            n_ff: 64,
            n_layer: 2,
            seed: 0,
        }
    }
}

impl TinyProjectorSpec {
    /// The tiny Gemma 3 layout: 4-pixel patches pooled 2×2, so also 16 image tokens.
    pub fn gemma3() -> Self {
        Self { kind: ProjectorKind::Gemma3, patch_size: 4, ..Self::default() }
    }

    fn patches(&self) -> u32 {
        (self.image_size / self.patch_size).pow(2)
    }

    /// Image tokens one image becomes (Gemma 3's wrapper text comes on top).
    pub fn image_tokens(&self) -> u32 {
        match self.kind {
            ProjectorKind::Llava => self.patches(),
            ProjectorKind::Gemma3 => self.patches() / GEMMA3_MERGE.pow(2),
        }
    }
}

/// Writes a tiny projector described by `spec` to `path`.
pub fn write_tiny_projector(path: &Path, spec: &TinyProjectorSpec) -> io::Result<()> {
    std::fs::write(path, tiny_projector_bytes(spec)?)
}

/// Builds the projector's GGUF file contents in memory.
pub fn tiny_projector_bytes(spec: &TinyProjectorSpec) -> io::Result<Vec<u8>> {
    validate(spec)?;
    let mut kv = KvWriter::default();
    kv.string("general.architecture", "clip");
    kv.string("general.name", "gantry-tiny-random-mmproj");
    kv.u32("general.alignment", ALIGNMENT as u32);
    kv.string(
        "clip.projector_type",
        match spec.kind {
            ProjectorKind::Llava => "mlp",
            ProjectorKind::Gemma3 => "gemma3",
        },
    );
    if spec.kind == ProjectorKind::Gemma3 {
        kv.u32("clip.vision.projector.scale_factor", GEMMA3_MERGE);
    }
    kv.bool("clip.has_vision_encoder", true);
    kv.bool("clip.use_gelu", true);
    kv.u32("clip.vision.image_size", spec.image_size);
    kv.u32("clip.vision.patch_size", spec.patch_size);
    kv.u32("clip.vision.embedding_length", spec.n_embd);
    kv.u32("clip.vision.feed_forward_length", spec.n_ff);
    kv.u32("clip.vision.block_count", spec.n_layer);
    kv.u32("clip.vision.projection_dim", spec.text_n_embd);
    kv.u32("clip.vision.attention.head_count", spec.n_head);
    kv.f32("clip.vision.attention.layer_norm_epsilon", 1e-6);
    kv.f32_array("clip.vision.image_mean", &[0.5, 0.5, 0.5]);
    kv.f32_array("clip.vision.image_std", &[0.5, 0.5, 0.5]);

    let (d, ff, text) = (u64::from(spec.n_embd), u64::from(spec.n_ff), u64::from(spec.text_n_embd));
    let p = u64::from(spec.patch_size);
    let mut rng = SplitMix64::new(spec.seed ^ 0x6d6d_7072_6f6a);
    let n_pos = u64::from(spec.patches());
    let mut t = vec![
        // ggml's conv2d kernel: [width, height, input channels, output channels].
        Tensor::random("v.patch_embd.weight", &[p, p, 3, d], 0.1, &mut rng),
        Tensor::random("v.position_embd.weight", &[d, n_pos], 0.05, &mut rng),
        Tensor::ones("v.pre_ln.weight", &[d]),
        Tensor::zeros("v.pre_ln.bias", &[d]),
    ];
    for i in 0..spec.n_layer {
        let name = |what: &str| format!("v.blk.{i}.{what}");
        for proj in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            t.push(Tensor::random(&name(&format!("{proj}.weight")), &[d, d], 0.1, &mut rng));
            t.push(Tensor::random(&name(&format!("{proj}.bias")), &[d], 0.02, &mut rng));
        }
        for norm in ["ln1", "ln2"] {
            t.push(Tensor::ones(&name(&format!("{norm}.weight")), &[d]));
            t.push(Tensor::zeros(&name(&format!("{norm}.bias")), &[d]));
        }
        t.push(Tensor::random(&name("ffn_up.weight"), &[d, ff], 0.1, &mut rng));
        t.push(Tensor::random(&name("ffn_up.bias"), &[ff], 0.02, &mut rng));
        t.push(Tensor::random(&name("ffn_down.weight"), &[ff, d], 0.1, &mut rng));
        t.push(Tensor::random(&name("ffn_down.bias"), &[d], 0.02, &mut rng));
    }
    match spec.kind {
        ProjectorKind::Llava => {
            t.push(Tensor::random("mm.0.weight", &[d, text], 0.1, &mut rng));
            t.push(Tensor::random("mm.0.bias", &[text], 0.02, &mut rng));
            t.push(Tensor::random("mm.2.weight", &[text, text], 0.1, &mut rng));
            t.push(Tensor::random("mm.2.bias", &[text], 0.02, &mut rng));
        }
        ProjectorKind::Gemma3 => {
            t.push(Tensor::ones("v.post_ln.weight", &[d]));
            t.push(Tensor::zeros("v.post_ln.bias", &[d]));
            t.push(Tensor::ones("mm.soft_emb_norm.weight", &[d]));
            // Applied transposed: [text width, vision width].
            t.push(Tensor::random("mm.input_projection.weight", &[text, d], 0.1, &mut rng));
        }
    }
    Ok(assemble(&kv, &t))
}

fn validate(spec: &TinyProjectorSpec) -> io::Result<()> {
    let bad = |msg: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, msg.to_string()));
    if [spec.text_n_embd, spec.image_size, spec.patch_size, spec.n_embd, spec.n_head, spec.n_ff].contains(&0)
        || spec.n_layer < 2
    {
        return bad("every size must be non-zero, and LLaVA needs at least 2 blocks (it reads the second-to-last)");
    }
    if !spec.image_size.is_multiple_of(spec.patch_size) {
        return bad("image_size must be a multiple of patch_size");
    }
    if spec.kind == ProjectorKind::Gemma3 && !(spec.image_size / spec.patch_size).is_multiple_of(GEMMA3_MERGE) {
        return bad("Gemma 3's patch grid must divide by its pooling kernel");
    }
    if !spec.n_embd.is_multiple_of(spec.n_head) {
        return bad("n_embd must be a multiple of n_head");
    }
    if spec.n_ff == spec.n_embd {
        return bad("n_ff must differ from n_embd");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn deterministic_aligned_and_counted() {
        let spec = TinyProjectorSpec::default();
        let a = tiny_projector_bytes(&spec).unwrap();
        assert_eq!(a, tiny_projector_bytes(&spec).unwrap());
        assert_ne!(a, tiny_projector_bytes(&TinyProjectorSpec { seed: 1, ..spec }).unwrap());
        assert_eq!(&a[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(a[4..8].try_into().unwrap()), 3);
        // patch, positions, pre-norm (2), 16 per block, 4 projector tensors.
        assert_eq!(u64_at(&a, 8), 4 + 16 * u64::from(spec.n_layer) + 4);
        assert_eq!(u64_at(&a, 16), 16, "metadata entries");
        assert_eq!(a.len() % ALIGNMENT, 0);
        assert_eq!(spec.image_tokens(), 16);
    }

    #[test]
    fn the_gemma3_layout_pools_its_patches() {
        let spec = TinyProjectorSpec::gemma3();
        assert_eq!(spec.image_tokens(), 16);
        let a = tiny_projector_bytes(&spec).unwrap();
        assert_ne!(a, tiny_projector_bytes(&TinyProjectorSpec::default()).unwrap());
        // patch, positions, pre-norm (2), 16 per block, post-norm (2), norm and projection.
        assert_eq!(u64_at(&a, 8), 4 + 16 * u64::from(spec.n_layer) + 4);
        assert_eq!(u64_at(&a, 16), 17, "metadata entries (the pooling factor too)");
        assert!(tiny_projector_bytes(&TinyProjectorSpec { patch_size: 32, ..spec }).is_err());
    }

    #[test]
    fn rejects_shapes_llama_cpp_would_misread() {
        for bad in [
            TinyProjectorSpec { patch_size: 5, ..Default::default() },
            TinyProjectorSpec { n_layer: 1, ..Default::default() },
            TinyProjectorSpec { n_ff: 32, ..Default::default() },
            TinyProjectorSpec { n_head: 3, ..Default::default() },
        ] {
            assert!(tiny_projector_bytes(&bad).is_err(), "{bad:?}");
        }
    }
}
