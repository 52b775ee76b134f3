//! What a model will take in memory once loaded, estimated from its GGUF header alone (no
//! tensor data is read), so a server holding several models can decide what to evict before it
//! loads one rather than after it runs out of memory.
//!
//! Weights: about the file's size. KV cache: a K and a V vector per layer, KV head and cached
//! token, in f16 or the quantized type of `--kv-type` (`KvType::bytes`). Compute buffers:
//! llama.cpp reserves its worst graph, dominated by the logits of one ubatch. Against llama.cpp's
//! own buffer report (default settings: 4 × 4096 cells, ubatch 512) the estimate is 1.5% high
//! for the 0.5B coder (1,073 vs 1,057 MB) and 2.5% for SmolLM2-135M.

use std::path::Path;

use crate::kv::kv_type::KvType;
use crate::model::gguf_header::Header;
use crate::model::twins;
use crate::{EngineConfig, LoadError};

/// Estimated bytes of a model served with these settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    pub weights: u64,
    pub kv_cache: u64,
    pub compute: u64,
}

impl MemoryEstimate {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.compute
    }
}

/// The shape of a model that decides its KV cache and compute buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    layers: u64,
    embedding: u64,
    /// K and V elements one cached token takes in one layer.
    kv_width: u64,
    /// One head's K and V lengths: a quantized KV cache needs both to be whole blocks.
    head_sizes: (u64, u64),
    /// Tokens in the vocabulary: the logits of a whole ubatch are reserved.
    vocab: u64,
}

/// Estimates the memory of `model` (plus its projector, whole) served with `cells` KV cells in
/// total (context per sequence × sequences) of `kv_type` and ubatches of `batch` tokens.
pub fn estimate_memory(
    model: &Path,
    projector: Option<&Path>,
    cells: u64,
    kv_type: KvType,
    batch: u64,
) -> Result<MemoryEstimate, LoadError> {
    let file_len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).map_err(|_| LoadError::Missing(p.to_path_buf()));
    let shape = read_shape(model)?;
    let weights = file_len(model)? + projector.map(file_len).transpose()?.unwrap_or(0);
    Ok(MemoryEstimate {
        // Plus a twentieth: where ggml keeps repacked copies (`dot_kernels::weights_repacked`;
        // not where Gantry's kernels serve every type it copies) it copies some tensors into a
        // second buffer (28 MiB of the 0.5B's 469; for a model all Q4_K, its Q4_K bytes).
        weights: weights + weights / 20,
        kv_cache: shape.layers * kv_type.bytes(shape.kv_width) * cells,
        // llama.cpp reserves its worst graph: one ubatch's logits, and its activations (about
        // twenty embedding-wide f32 rows per token live at once), plus the host-side output
        // buffer. Measured with llama.cpp's own report at ubatch 512: the 0.5B coder 323 MiB
        // (this says 340), SmolLM2-135M 118 MiB (this says 126).
        compute: (shape.embedding * 20 + shape.vocab) * batch * 4 + (8 << 20),
    })
}

impl EngineConfig {
    /// [`estimate_memory`] for this configuration.
    pub fn estimate_memory(&self) -> Result<MemoryEstimate, LoadError> {
        if declares_pooling(&self.model_path) {
            let mut estimate = embedder_memory(&self.model_path)?;
            // Served from its BF16 twin, the model takes the twin's smaller size.
            if self.bf16_twin_dir.is_some() && twins::f32_as_bf16::pays_here() {
                let saved = twins::f32_as_bf16::plan(&self.model_path).map_or(0, |p| p.growth().min(0).unsigned_abs());
                estimate.weights = estimate.weights.saturating_sub(saved);
            }
            // Its Q4_K, Q5_K, Q6_K and IQ4_XS matrices are copied at their first batch (no warm-up here).
            estimate.weights += crate::model::dot_kernels::k_quant_copy_bytes(&self.model_path);
            return Ok(estimate);
        }
        let cells = u64::from(self.ctx_size.max(16)) * u64::from(self.parallel.max(1));
        let batch = u64::from(self.batch_size.max(self.parallel + 16));
        let mut estimate = estimate_memory(&self.model_path, self.mmproj_path.as_deref(), cells, self.kv_type, batch)?;
        // Served from its Q8_0 twin, the model takes the twin's larger size.
        if self.q8_twin_dir.is_some() {
            estimate.weights += twins::q5_as_q8::plan(&self.model_path).map_or(0, |p| p.growth().max(0) as u64);
        }
        // Q4_K, Q5_K, Q6_K and IQ4_XS matrices get a second copy in Gantry's memory for a few rows at a time.
        estimate.weights += crate::model::dot_kernels::k_quant_copy_bytes(&self.model_path);
        Ok(estimate)
    }
}

/// Whether the GGUF declares a pooling type (see `capabilities`: it embeds, or ranks): it is
/// served by an [`crate::Embedder`], not a scheduler.
fn declares_pooling(model: &Path) -> bool {
    Header::open(model).is_some_and(|gguf| {
        let arch = gguf.string("general.architecture").unwrap_or_default();
        matches!(gguf.u32(&format!("{arch}.pooling_type")), Some(1..=4))
    })
}

/// An embedding model's: its weights, the cells of one batch (a decoder embedding model keeps
/// them while it decodes; an encoder keeps none), and activations for a batch, with no logits.
fn embedder_memory(model: &Path) -> Result<MemoryEstimate, LoadError> {
    let batch = u64::from(crate::embedder::BATCH_TOKENS);
    let shape = read_shape(model)?;
    let weights = std::fs::metadata(model).map(|m| m.len()).map_err(|_| LoadError::Missing(model.to_path_buf()))?;
    Ok(MemoryEstimate {
        weights,
        kv_cache: shape.layers * KvType::F16.bytes(shape.kv_width) * batch,
        compute: shape.embedding * 20 * batch * 4 + (8 << 20),
    })
}

fn read_shape(model: &Path) -> Result<Shape, LoadError> {
    if !model.is_file() {
        return Err(LoadError::Missing(model.to_path_buf()));
    }
    let unreadable = |reason: String| LoadError::Llama { path: model.to_path_buf(), reason };
    let gguf = Header::open(model).ok_or_else(|| unreadable("not a readable GGUF file".into()))?;
    let arch = gguf.string("general.architecture").unwrap_or_else(|| "llama".into());
    let missing = |key: &str| unreadable(format!("no {arch}.{key} in its header"));
    let field = |key: &str| gguf.u32(&format!("{arch}.{key}")).map(u64::from);
    let layers = field("block_count").ok_or_else(|| missing("block_count"))?;
    let embedding = field("embedding_length").ok_or_else(|| missing("embedding_length"))?;
    let heads = field("attention.head_count").unwrap_or(1).max(1);
    // Per-layer head counts (an array) fall back to the query heads: an upper bound.
    let kv_heads = field("attention.head_count_kv").unwrap_or(heads);
    let head_dim = embedding / heads;
    let key_len = field("attention.key_length").unwrap_or(head_dim);
    let value_len = field("attention.value_length").unwrap_or(head_dim);
    let vocab = field("vocab_size").or_else(|| gguf.array_len("tokenizer.ggml.tokens")).unwrap_or(0);
    Ok(Shape { layers, embedding, kv_width: kv_heads * (key_len + value_len), head_sizes: (key_len, value_len), vocab })
}

/// Refuses `kv_type` for `model` where llama.cpp would: a quantized type stores each head's K
/// and V in blocks of 32 values, so both lengths must be multiples of 32 (every Qwen, Llama and
/// Gemma model's are: 64, 128 or 256).
pub(crate) fn check_kv_type(model: &Path, kv_type: KvType) -> Result<(), LoadError> {
    // f16 fits every head: the default start reads no header here.
    if !kv_type.is_quantized() {
        return Ok(());
    }
    let (k, v) = read_shape(model)?.head_sizes;
    if k % 32 != 0 || v % 32 != 0 {
        return Err(LoadError::Context(format!(
            "--kv-type {kv_type} stores heads in blocks of 32 values; {}'s are {k} (K) and {v} (V): use f16",
            model.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_grows_with_the_cache_and_reads_the_fixture_header() {
        let dir = tempfile_dir();
        let path = dir.join("tiny.gguf");
        tiny_gguf::write_tiny_model(&path, &tiny_gguf::TinyModelSpec::default()).unwrap();
        let shape = read_shape(&path).unwrap();
        assert!(shape.layers > 0 && shape.embedding > 0 && shape.kv_width > 0 && shape.vocab > 0, "{shape:?}");
        let small = estimate_memory(&path, None, 512, KvType::F16, 64).unwrap();
        let large = estimate_memory(&path, None, 4096, KvType::F16, 64).unwrap();
        let file = std::fs::metadata(&path).unwrap().len();
        assert_eq!(small.weights, file + file / 20);
        assert_eq!(large.kv_cache, small.kv_cache * 8, "KV bytes are per cell");
        assert_eq!(small.kv_cache, shape.layers * shape.kv_width * 2 * 512, "f16 K and V");
        assert!(large.total() > small.total());
        let q8 = estimate_memory(&path, None, 512, KvType::Q8_0, 64).unwrap();
        let q4 = estimate_memory(&path, None, 512, KvType::Q4_0, 64).unwrap();
        assert_eq!(q8.kv_cache, shape.layers * shape.kv_width / 32 * 34 * 512, "q8_0: 34 bytes a 32-value block");
        assert_eq!(q4.kv_cache, shape.layers * shape.kv_width / 32 * 18 * 512, "q4_0: 18 bytes a 32-value block");
        assert_eq!((q8.weights, q8.compute), (small.weights, small.compute));
        // The tiny model's heads are 16 values: no whole quantized block.
        assert_eq!(shape.head_sizes, (16, 16));
        assert!(check_kv_type(&path, KvType::F16).is_ok());
        let refused = check_kv_type(&path, KvType::Q8_0).unwrap_err().to_string();
        assert!(refused.contains("blocks of 32") && refused.contains("use f16"), "{refused}");
        assert!(estimate_memory(&dir.join("missing.gguf"), None, 512, KvType::F16, 64).is_err());
        std::fs::write(dir.join("junk.gguf"), b"not a gguf").unwrap();
        assert!(estimate_memory(&dir.join("junk.gguf"), None, 512, KvType::F16, 64).is_err());
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gantry-memory-{}-{}", std::process::id(), line!()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
