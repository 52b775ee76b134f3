//! What the pool loads: engines, behind traits so tests can load scripted ones.

use std::sync::Arc;

use gantry_engine::{Engine, Generator, Health};
use tokio::sync::watch;

use super::{process_rss, ModelSpec};

/// A loaded model as the pool drives it: requests go through [`Generator`]; the rest is for
/// unloading, shutdown and failure.
pub trait ServedModel: Generator {
    /// Cuts every running request (shutdown's grace period ran out).
    fn abort_all(&self) {}
    /// Finishes what it has and stops (blocking).
    fn shutdown(&self) {}
    /// Its health, for engines that can fail.
    fn watch_health(&self) -> Option<watch::Receiver<Health>> {
        None
    }
}

impl ServedModel for Engine {
    fn abort_all(&self) {
        Engine::abort_all(self);
    }
    fn shutdown(&self) {
        Engine::shutdown(self);
    }
    fn watch_health(&self) -> Option<watch::Receiver<Health>> {
        Some(Engine::watch_health(self))
    }
}

/// Loads models; behind a trait so tests can load scripted ones.
pub trait ModelLoader: Send + Sync + 'static {
    /// Bytes the model will take once loaded, known before loading it (blocking).
    fn estimate(&self, spec: &ModelSpec) -> anyhow::Result<u64>;
    /// Loads it (blocking), returning it and the bytes it was measured to take (0: unknown).
    fn load(&self, spec: &ModelSpec) -> anyhow::Result<(Arc<dyn ServedModel>, u64)>;
}

/// Loads GGUF models into llama.cpp engines.
pub struct EngineLoader;

impl ModelLoader for EngineLoader {
    fn estimate(&self, spec: &ModelSpec) -> anyhow::Result<u64> {
        Ok(spec.config.estimate_memory()?.total())
    }

    /// Measures what the process grew by while loading: loads run one at a time.
    fn load(&self, spec: &ModelSpec) -> anyhow::Result<(Arc<dyn ServedModel>, u64)> {
        let before = process_rss();
        let engine: Arc<dyn ServedModel> = Arc::new(Engine::start(spec.config.clone())?);
        Ok((engine, process_rss().saturating_sub(before)))
    }
}
