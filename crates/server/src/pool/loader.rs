//! What the pool loads: engines (an [`Embedder`] for a model that embeds or ranks), behind
//! traits so tests can load scripted ones.

use std::sync::Arc;

use gantry_engine::{default_threads, Embedder, Engine, Generator};

use super::{process_rss, ModelSpec};

/// Loads models; behind a trait so tests can load scripted ones.
pub trait ModelLoader: Send + Sync + 'static {
    /// Bytes the model will take once loaded, known before loading it (blocking).
    fn estimate(&self, spec: &ModelSpec) -> anyhow::Result<u64>;
    /// Loads it (blocking), returning it and the bytes it was measured to take (0: unknown).
    fn load(&self, spec: &ModelSpec) -> anyhow::Result<(Arc<dyn Generator>, u64)>;
}

/// Loads GGUF models into llama.cpp engines.
pub struct EngineLoader;

impl ModelLoader for EngineLoader {
    fn estimate(&self, spec: &ModelSpec) -> anyhow::Result<u64> {
        Ok(spec.config.estimate_memory()?.total())
    }

    /// Measures what the process grew by while loading: loads run one at a time.
    fn load(&self, spec: &ModelSpec) -> anyhow::Result<(Arc<dyn Generator>, u64)> {
        let before = process_rss();
        let config = &spec.config;
        let engine: Arc<dyn Generator> = if spec.capabilities.embeds() || spec.capabilities.ranks() {
            let threads = config.threads.unwrap_or_else(default_threads).max(1) as i32;
            Arc::new(Embedder::start(
                &config.model_path,
                threads,
                &config.offload,
                config.decode_turns.clone(),
                config.bf16_twin_dir.as_deref(),
            )?)
        } else {
            Arc::new(Engine::start(config.clone())?)
        };
        Ok((engine, process_rss().saturating_sub(before)))
    }
}
