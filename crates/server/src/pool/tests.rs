//! The pool with models that load instantly: what loads when, what leaves, what waits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_engine::{
    ChatInput, EngineConfig, GenerateRequest, GenerationHandle, Generator, Health, ModelInfo, PrepareError, SubmitError,
};

use super::*;

/// A model that does nothing but record that it was shut down.
struct Fake {
    info: ModelInfo,
    stopped: Arc<Mutex<Vec<String>>>,
    name: String,
}

impl Generator for Fake {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }
    fn prepare(&self, _: ChatInput) -> Result<GenerateRequest, PrepareError> {
        unreachable!("the pool never prepares")
    }
    fn prepare_raw(&self, _: ChatInput, _: gantry_engine::RawPrompt) -> Result<GenerateRequest, PrepareError> {
        unreachable!("the pool never prepares")
    }
    fn submit(&self, _: GenerateRequest) -> Result<GenerationHandle, SubmitError> {
        unreachable!("the pool never submits")
    }
    fn health(&self) -> Health {
        Health::Ready
    }
    fn shutdown(&self) {
        self.stopped.lock().unwrap().push(self.name.clone());
    }
}

/// Loads [`Fake`]s; a model's size is its spec's `ctx_size`, and a spec whose path ends in
/// `broken` fails to load.
#[derive(Default, Clone)]
struct FakeLoader {
    loads: Arc<AtomicUsize>,
    stopped: Arc<Mutex<Vec<String>>>,
    /// Slows each load down, so concurrent requests find it in progress.
    load_time: Duration,
}

impl ModelLoader for FakeLoader {
    fn estimate(&self, spec: &ModelSpec) -> anyhow::Result<u64> {
        Ok(u64::from(spec.config.ctx_size))
    }
    fn load(&self, spec: &ModelSpec) -> anyhow::Result<(Arc<dyn Generator>, u64)> {
        std::thread::sleep(self.load_time);
        if spec.config.model_path.ends_with("broken") {
            anyhow::bail!("not a GGUF file");
        }
        self.loads.fetch_add(1, Ordering::SeqCst);
        let info = ModelInfo {
            path: spec.config.model_path.clone(),
            n_vocab: 10,
            n_ctx_train: 10,
            size_bytes: 0,
            n_params: 0,
            supports_vision: false,
            image_marker: None,
            chat_template: Some(String::new()),
        };
        let model: Arc<dyn Generator> = Arc::new(Fake { info, stopped: self.stopped.clone(), name: spec.id.clone() });
        Ok((model, 0))
    }
}

fn spec(id: &str, bytes: u32, pin: bool) -> ModelSpec {
    let mut config = EngineConfig::new(PathBuf::from(format!("/models/{id}")));
    config.ctx_size = bytes;
    ModelSpec {
        id: id.into(),
        aliases: Vec::new(),
        config,
        pin,
        idle_unload: None,
        created: 0,
        shrinkable: Shrinkable::ALL,
        capabilities: gantry_engine::Capabilities::default(),
        prices: Vec::new(),
    }
}

fn pool(specs: Vec<ModelSpec>, loader: &FakeLoader, budget: u64) -> ModelPool {
    ModelPool::new(specs, Box::new(loader.clone()), PoolOptions { budget, wait_for_room: Duration::from_millis(300) })
}

fn loaded(pool: &ModelPool) -> Vec<String> {
    pool.status().into_iter().filter(|s| s.loaded).map(|s| s.id).collect()
}

#[tokio::test]
async fn models_load_on_first_use_and_the_least_recently_used_idle_one_leaves() {
    let loader = FakeLoader::default();
    let pool = pool(vec![spec("a", 40, false), spec("b", 40, false), spec("c", 40, false)], &loader, 100);
    assert!(loaded(&pool).is_empty(), "nothing loads before it is asked for");
    drop(pool.acquire("a").await.unwrap());
    drop(pool.acquire("b").await.unwrap());
    assert_eq!(loaded(&pool), ["a", "b"]);
    drop(pool.acquire("a").await.unwrap()); // a is now the more recently used
    drop(pool.acquire("c").await.unwrap());
    assert_eq!(loaded(&pool), ["a", "c"], "b was the least recently used");
    assert_eq!(*loader.stopped.lock().unwrap(), ["b"], "an unloaded model is shut down");
    assert_eq!(loader.loads.load(Ordering::SeqCst), 3);
    let status = pool.status();
    assert_eq!((status[0].bytes, status[1].bytes), (40, 0), "the estimate, as nothing was measured");
    assert!(matches!(pool.acquire("nope").await, Err(PoolError::NotFound(id)) if id == "nope"));
}

#[tokio::test]
async fn a_model_in_use_or_pinned_never_leaves_and_the_request_gets_a_retryable_503() {
    let loader = FakeLoader::default();
    let pool = pool(vec![spec("a", 60, false), spec("b", 60, false), spec("p", 30, true)], &loader, 100);
    drop(pool.acquire("p").await.unwrap());
    let running = pool.acquire("a").await.unwrap();
    let err = pool.acquire("b").await.err().expect("a is in use and p is pinned: b cannot fit");
    assert!(matches!(err, PoolError::Busy { .. }), "{err:?}");
    assert_eq!(loaded(&pool), ["a", "p"]);
    assert_eq!(pool.status()[0].leases, 1);
    // The stream on a ends while b waits for room: b loads in a's place.
    let waiting = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire("b").await.map(|l| l.id().to_string()) }
    });
    while pool.waiting_for_room() == 0 {
        assert!(!waiting.is_finished(), "b could not have loaded while a ran");
        tokio::task::yield_now().await;
    }
    drop(running);
    assert_eq!(waiting.await.unwrap().unwrap(), "b");
    assert_eq!(loaded(&pool), ["b", "p"]);
    assert_eq!(*loader.stopped.lock().unwrap(), ["a"], "the pinned model stayed");
}

#[tokio::test]
async fn concurrent_first_requests_share_one_load() {
    let loader = FakeLoader { load_time: Duration::from_millis(100), ..Default::default() };
    let pool = pool(vec![spec("a", 10, false)], &loader, 100);
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire("a").await.map(|_| ()) })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
    assert_eq!(pool.status()[0].leases, 0, "every lease ended");
}

#[tokio::test]
async fn a_failed_load_is_an_error_for_its_request_and_the_pool_goes_on() {
    let loader = FakeLoader::default();
    let mut broken = spec("broken", 10, false);
    broken.config.model_path = PathBuf::from("/models/broken");
    let pool = pool(vec![spec("a", 10, false), broken], &loader, 100);
    let err = pool.acquire("broken").await.err().expect("it cannot load");
    assert!(err.to_string().contains("could not be loaded: not a GGUF file"), "{err}");
    assert!(matches!(err, PoolError::LoadFailed { .. }), "{err:?}");
    assert!(pool.acquire("a").await.is_ok(), "the other model still serves");
    assert!(pool.failure().is_none(), "a failed load is not a failed engine");
}

#[tokio::test]
async fn a_model_larger_than_the_whole_budget_is_refused_up_front() {
    let loader = FakeLoader::default();
    let pool = pool(vec![spec("small", 10, false), spec("huge", 500, false)], &loader, 100);
    let err = pool.check_budget().expect_err("huge does not fit");
    assert!(matches!(&err, PoolError::TooLarge { id, need: 500, budget: 100 } if id == "huge"), "{err:?}");
    assert!(matches!(pool.acquire("huge").await, Err(PoolError::TooLarge { .. })));
    assert_eq!(loader.loads.load(Ordering::SeqCst), 0);
}
