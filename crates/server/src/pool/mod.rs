//! Several models in one server: each is loaded when a request first names it, and a model
//! that does not fit the memory budget makes idle models leave, least recently used first.
//! A model with a request running or waiting on it, or pinned, never leaves; when nothing can
//! leave, the request waits a while for room and then gets a retryable 503. Loads run one at
//! a time (two at once would only share the same cores and memory), and concurrent first
//! requests for one model share its load.
//!
//! A request holds a [`Lease`] on its model from routing until its last event: that, not the
//! engine's queue, is what "in use" means here, so a model is never torn down under a stream.

mod fit;
mod loader;
mod memory;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_engine::{EngineConfig, Generator, Health};
use tokio::sync::{watch, Notify};

pub use fit::{fit_to_budget, Refit, Shrinkable};
pub use loader::{EngineLoader, ModelLoader};
pub use memory::{available_memory, default_budget, parse_bytes, parse_size, process_rss};

/// A model the server can serve, loaded or not.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The id clients send as `model`.
    pub id: String,
    /// Other names clients may send for it.
    pub aliases: Vec<String>,
    pub config: EngineConfig,
    /// Never unloaded to make room.
    pub pin: bool,
    /// Unloaded once it has had no request for this long.
    pub idle_unload: Option<Duration>,
    /// Unix seconds for `/v1/models` (the file's modification time).
    pub created: u64,
    /// What may be lowered to fit the memory budget.
    pub shrinkable: Shrinkable,
    /// What it serves (generation, embeddings, fill-in-the-middle), read from its GGUF.
    pub capabilities: gantry_engine::Capabilities,
    /// Its prices from a models file, by billing tier (`--price` flags are added to them).
    pub prices: Vec<(crate::prices::BillingTier, gantry_accounts::Price)>,
}

/// Why a request could not get its model.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("The model `{0}` does not exist")]
    NotFound(String),
    #[error("The model `{id}` could not be loaded: {reason}")]
    LoadFailed { id: String, reason: String },
    #[error("The model `{id}` needs {need} bytes and the server's memory budget is {budget} bytes")]
    TooLarge { id: String, need: u64, budget: u64 },
    #[error("The model `{id}` cannot be loaded now: the models in use fill the server's memory budget")]
    Busy { id: String },
    #[error("The model `{id}` has {running} requests running or queued; unload it with ?force=true to cut them (they are billed for what they generated)")]
    InUse { id: String, running: usize },
}

/// What `/admin` and `/metrics` show of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStatus {
    pub id: String,
    pub loaded: bool,
    /// Budgeted bytes (the estimate from the GGUF header) while loaded.
    pub bytes: u64,
    /// What the process grew by while it loaded.
    pub measured_bytes: u64,
    pub leases: usize,
    pub pinned: bool,
}

pub struct PoolOptions {
    /// Bytes all loaded models may take together.
    pub budget: u64,
    /// How long a request waits for models in use to free room before its 503.
    pub wait_for_room: Duration,
}

/// The models one server serves. Cheap to clone.
#[derive(Clone)]
pub struct ModelPool {
    inner: Arc<Inner>,
}

struct Inner {
    specs: Vec<ModelSpec>,
    loader: Box<dyn ModelLoader>,
    options: PoolOptions,
    state: Mutex<State>,
    /// Held while a model loads or models are unloaded to make room for one.
    loading: tokio::sync::Mutex<()>,
    /// A lease ended: a model may have become idle.
    released: Notify,
    /// Requests waiting in `make_room` for a lease to end.
    waiting_for_room: std::sync::atomic::AtomicUsize,
    /// Set once a loaded engine failed: the server stops for its supervisor to restart it.
    failed: watch::Sender<Option<String>>,
}

#[derive(Default)]
struct State {
    loaded: HashMap<usize, Loaded>,
    clock: u64,
}

struct Loaded {
    model: Arc<dyn Generator>,
    /// Budgeted: the estimate.
    bytes: u64,
    /// What the process grew by while it loaded.
    measured: u64,
    leases: usize,
    last_used: u64,
    /// Since when no lease has been held (for `idle_unload`).
    idle_since: std::time::Instant,
}

/// A request's hold on its model: the model stays loaded while any lease on it lives.
pub struct Lease {
    inner: Arc<Inner>,
    index: usize,
    model: Arc<dyn Generator>,
}

impl Lease {
    /// The id clients send for this model.
    pub fn id(&self) -> &str {
        &self.inner.specs[self.index].id
    }

    /// The model's engine, for work that runs off the async runtime.
    pub fn generator(&self) -> Arc<dyn Generator> {
        self.model.clone()
    }
}

impl std::ops::Deref for Lease {
    type Target = dyn Generator;
    fn deref(&self) -> &Self::Target {
        &*self.model
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock().expect("pool state");
        state.clock += 1;
        let now = state.clock;
        if let Some(loaded) = state.loaded.get_mut(&self.index) {
            loaded.leases -= 1;
            loaded.last_used = now;
            if loaded.leases == 0 {
                loaded.idle_since = std::time::Instant::now();
            }
        }
        drop(state);
        self.inner.released.notify_waiters();
    }
}

impl ModelPool {
    /// A pool of `specs` (ids unique, checked by the caller) with nothing loaded yet.
    pub fn new(specs: Vec<ModelSpec>, loader: Box<dyn ModelLoader>, options: PoolOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                specs,
                loader,
                options,
                state: Mutex::new(State::default()),
                loading: tokio::sync::Mutex::new(()),
                released: Notify::new(),
                waiting_for_room: std::sync::atomic::AtomicUsize::new(0),
                failed: watch::Sender::new(None),
            }),
        }
    }

    /// Requests waiting for models in use to free room for theirs.
    pub fn waiting_for_room(&self) -> usize {
        self.inner.waiting_for_room.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every servable model, loaded or not, in configuration order.
    pub fn specs(&self) -> &[ModelSpec] {
        &self.inner.specs
    }

    pub fn budget(&self) -> u64 {
        self.inner.options.budget
    }

    /// The model clients reach as `name`: its id or one of its aliases.
    pub fn resolve(&self, name: &str) -> Option<&ModelSpec> {
        self.inner.specs.get(self.index_of(name)?)
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.inner.specs.iter().position(|s| s.id == name || s.aliases.iter().any(|a| a == name))
    }

    /// Checks every model fits the budget on its own, so none is refused only at its first
    /// request. Returns each model's estimate.
    pub fn check_budget(&self) -> Result<Vec<u64>, PoolError> {
        self.inner
            .specs
            .iter()
            .map(|spec| {
                let need = self.inner.loader.estimate(spec).map_err(|e| load_failed(spec, &e))?;
                if need > self.budget() {
                    return Err(PoolError::TooLarge { id: spec.id.clone(), need, budget: self.budget() });
                }
                Ok(need)
            })
            .collect()
    }

    /// A lease on model `id` (or an alias), loading it first if needed (which may unload idle
    /// models).
    pub async fn acquire(&self, id: &str) -> Result<Lease, PoolError> {
        let index = self.index_of(id).ok_or_else(|| PoolError::NotFound(id.to_string()))?;
        if let Some(lease) = self.try_lease(index) {
            return Ok(lease);
        }
        let _loading = self.inner.loading.lock().await;
        // Loaded by the request this one waited behind.
        if let Some(lease) = self.try_lease(index) {
            return Ok(lease);
        }
        let spec = self.inner.specs[index].clone();
        let inner = self.inner.clone();
        let estimate_spec = spec.clone();
        let need = tokio::task::spawn_blocking(move || inner.loader.estimate(&estimate_spec))
            .await
            .map_err(|e| load_failed(&spec, &anyhow::anyhow!("{e}")))?
            .map_err(|e| load_failed(&spec, &e))?;
        if need > self.budget() {
            return Err(PoolError::TooLarge { id: spec.id.clone(), need, budget: self.budget() });
        }
        self.make_room(index, need).await?;
        let inner = self.inner.clone();
        let load_spec = spec.clone();
        let started = std::time::Instant::now();
        let (model, measured) = tokio::task::spawn_blocking(move || inner.loader.load(&load_spec))
            .await
            .map_err(|e| load_failed(&spec, &anyhow::anyhow!("{e}")))?
            .map_err(|e| load_failed(&spec, &e))?;
        // The budget counts the estimate: what the process grew by also counts allocator and
        // page-cache noise (and the first load, llama.cpp's own start-up), so it is shown, not
        // budgeted.
        let bytes = need;
        tracing::info!(model = %spec.id, estimated = need, measured, seconds = started.elapsed().as_secs_f64(), "model loaded");
        crate::telemetry::model_loaded(&spec.id, bytes, started.elapsed());
        self.watch_failure(&spec.id, &*model);
        let mut state = self.inner.state.lock().expect("pool state");
        state.clock += 1;
        let now = state.clock;
        let idle_since = std::time::Instant::now();
        state
            .loaded
            .insert(index, Loaded { model: model.clone(), bytes, measured, leases: 1, last_used: now, idle_since });
        Ok(Lease { inner: self.inner.clone(), index, model })
    }

    fn try_lease(&self, index: usize) -> Option<Lease> {
        let mut state = self.inner.state.lock().expect("pool state");
        state.clock += 1;
        let now = state.clock;
        let loaded = state.loaded.get_mut(&index)?;
        loaded.leases += 1;
        loaded.last_used = now;
        Some(Lease { inner: self.inner.clone(), index, model: loaded.model.clone() })
    }

    /// Unloads idle, unpinned models, least recently used first, until `need` more bytes fit;
    /// waits for leases to end while only models in use stand in the way.
    async fn make_room(&self, index: usize, need: u64) -> Result<(), PoolError> {
        let deadline = tokio::time::Instant::now() + self.inner.options.wait_for_room;
        loop {
            let released = self.inner.released.notified();
            let victim = {
                let mut state = self.inner.state.lock().expect("pool state");
                let used: u64 = state.loaded.values().map(|l| l.bytes).sum();
                if used + need <= self.budget() {
                    return Ok(());
                }
                let victim = state
                    .loaded
                    .iter()
                    .filter(|(i, l)| l.leases == 0 && !self.inner.specs[**i].pin)
                    .min_by_key(|(_, l)| l.last_used)
                    .map(|(i, _)| *i);
                victim.and_then(|i| state.loaded.remove(&i).map(|l| (i, l)))
            };
            match victim {
                Some((i, loaded)) => {
                    let id = self.inner.specs[i].id.clone();
                    tracing::info!(model = %id, bytes = loaded.bytes, for_model = %self.inner.specs[index].id, "unloading an idle model to make room");
                    let model = loaded.model;
                    // Its memory is free only once its scheduler thread has stopped.
                    let _ = tokio::task::spawn_blocking(move || model.shutdown()).await;
                    crate::telemetry::model_unloaded(&id, true);
                }
                None => {
                    let _waiting = WaitingForRoom::count(&self.inner.waiting_for_room);
                    if tokio::time::timeout_at(deadline, released).await.is_err() {
                        return Err(PoolError::Busy { id: self.inner.specs[index].id.clone() });
                    }
                }
            }
        }
    }

    /// Unloads model `id` now (an operator's request). A model in use is refused unless
    /// `force`, which cuts its requests and unloads it once they have ended. Returns whether it
    /// was loaded.
    pub async fn unload(&self, id: &str, force: bool) -> Result<bool, PoolError> {
        let index = self.index_of(id).ok_or_else(|| PoolError::NotFound(id.to_string()))?;
        let id = self.inner.specs[index].id.as_str();
        let _loading = self.inner.loading.lock().await;
        let deadline = tokio::time::Instant::now() + self.inner.options.wait_for_room;
        loop {
            let released = self.inner.released.notified();
            let taken = {
                let mut state = self.inner.state.lock().expect("pool state");
                match state.loaded.get(&index) {
                    None => return Ok(false),
                    Some(l) if l.leases == 0 => state.loaded.remove(&index),
                    Some(l) if !force => return Err(PoolError::InUse { id: id.to_string(), running: l.leases }),
                    Some(l) => {
                        l.model.abort_all();
                        None
                    }
                }
            };
            if let Some(loaded) = taken {
                let model = loaded.model;
                let _ = tokio::task::spawn_blocking(move || model.shutdown()).await;
                crate::telemetry::model_unloaded(id, false);
                tracing::info!(model = %id, force, "model unloaded by an operator");
                return Ok(true);
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err(PoolError::Busy { id: id.to_string() });
            }
        }
    }

    /// Unloads, every second, the models whose `idle_unload` time has passed without a request
    /// (pinned ones excepted); runs as long as the pool lives.
    pub fn start_idle_unloader(&self) {
        if self.inner.specs.iter().all(|s| s.idle_unload.is_none()) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                ModelPool { inner }.unload_idle().await;
            }
        });
    }

    async fn unload_idle(&self) {
        let _loading = self.inner.loading.lock().await;
        let expired: Vec<(usize, Loaded)> = {
            let mut state = self.inner.state.lock().expect("pool state");
            let due: Vec<usize> = state
                .loaded
                .iter()
                .filter(|(i, l)| {
                    let spec = &self.inner.specs[**i];
                    l.leases == 0 && !spec.pin && spec.idle_unload.is_some_and(|d| l.idle_since.elapsed() >= d)
                })
                .map(|(i, _)| *i)
                .collect();
            due.into_iter().filter_map(|i| state.loaded.remove(&i).map(|l| (i, l))).collect()
        };
        for (i, loaded) in expired {
            let id = &self.inner.specs[i].id;
            tracing::info!(model = %id, "unloading a model idle for its idle_unload_s");
            let model = loaded.model;
            let _ = tokio::task::spawn_blocking(move || model.shutdown()).await;
            crate::telemetry::model_unloaded(id, false);
        }
    }

    /// Forwards an engine's failure to [`ModelPool::failure`].
    fn watch_failure(&self, id: &str, model: &dyn Generator) {
        let Some(mut health) = model.watch_health() else { return };
        let (failed, id) = (self.inner.failed.clone(), id.to_string());
        tokio::spawn(async move {
            if let Ok(h) = health.wait_for(|h| matches!(h, Health::Failed(_))).await {
                if let Health::Failed(why) = &*h {
                    failed.send_replace(Some(format!("{id}: {why}")));
                }
            }
        });
    }

    /// Why a loaded engine failed, once one has.
    pub fn failure(&self) -> Option<String> {
        self.inner.failed.borrow().clone()
    }

    /// Resolves once a loaded engine has failed; never otherwise.
    pub async fn failed(&self) {
        let mut rx = self.inner.failed.subscribe();
        if rx.wait_for(Option::is_some).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Each model's state, in configuration order.
    pub fn status(&self) -> Vec<ModelStatus> {
        let state = self.inner.state.lock().expect("pool state");
        self.inner
            .specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let loaded = state.loaded.get(&i);
                ModelStatus {
                    id: spec.id.clone(),
                    loaded: loaded.is_some(),
                    bytes: loaded.map_or(0, |l| l.bytes),
                    measured_bytes: loaded.map_or(0, |l| l.measured),
                    leases: loaded.map_or(0, |l| l.leases),
                    pinned: spec.pin,
                }
            })
            .collect()
    }

    /// Cuts every running request of every loaded model.
    pub fn abort_all(&self) {
        for loaded in self.inner.state.lock().expect("pool state").loaded.values() {
            loaded.model.abort_all();
        }
    }

    /// Stops every loaded model (blocking: each finishes what it has).
    pub fn shutdown(&self) {
        let models: Vec<_> =
            self.inner.state.lock().expect("pool state").loaded.drain().map(|(_, l)| l.model).collect();
        for model in models {
            model.shutdown();
        }
    }
}

/// How many leading characters `a` and `b` share (for pairing projectors with models by name).
pub fn common_prefix_len(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

fn load_failed(spec: &ModelSpec, e: &anyhow::Error) -> PoolError {
    tracing::error!(model = %spec.id, error = %format!("{e:#}"), "could not load a model");
    PoolError::LoadFailed { id: spec.id.clone(), reason: format!("{e:#}") }
}

/// Counts one request waiting for room while it lives (a request cancelled while it waits is
/// dropped mid-wait, so the count goes down in `Drop`).
struct WaitingForRoom<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> WaitingForRoom<'a> {
    fn count(waiting: &'a std::sync::atomic::AtomicUsize) -> Self {
        waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(waiting)
    }
}

impl Drop for WaitingForRoom<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
