//! Weighted fair sharing through the running engine: the owners' weights the server sets on each
//! request decide who gets sequences that free up (the queue's own tests simulate the rest).

use crate::tests::engine::{eos, tiny_model};
use crate::tests::kv_layout::greedy;
use crate::{Engine, EngineConfig, GenerateRequest, Generator, Owner};

/// A request of `owner` that runs exactly `max_tokens` tokens (the end token is banned).
fn request(engine: &Engine, owner: Owner, text: &str, max_tokens: u32) -> GenerateRequest {
    let mut input = greedy(text, 1, max_tokens);
    input.sampling.logit_bias = vec![(eos(engine), -100.0)];
    let mut request = engine.prepare(input).unwrap();
    request.owner = owner;
    request
}

/// Two tenants weighing 3 and 1 flood four sequences with requests alike: while both have
/// requests waiting, the heavier one's start three times as often.
#[tokio::test]
async fn tenants_weighing_3_to_1_get_sequences_3_to_1() {
    let mut config = EngineConfig::new(tiny_model());
    (config.ctx_size, config.parallel, config.threads, config.max_queue) = (512, 4, Some(1), 256);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    config.admission_log = Some(log.clone());
    let engine = Engine::start(config).unwrap();
    let heavy = Owner { key: 10, key_weight: 1, tenant: 1, tenant_weight: 3 };
    let light = Owner { key: 20, key_weight: 1, tenant: 2, tenant_weight: 1 };
    let mut requests = Vec::new();
    for i in 0..60 {
        requests.push(request(&engine, heavy, &format!("heavy {i:02}"), 8));
        requests.push(request(&engine, light, &format!("light {i:02}"), 8));
    }
    let handles = engine.submit_all(requests).unwrap();
    for handle in handles {
        assert_eq!(handle.usage.await.unwrap().completion_tokens, 8);
    }
    let order = log.lock().unwrap().clone();
    assert_eq!(order.len(), 120);
    // The first 60 started while both had requests waiting.
    let heavy_started = order[..60].iter().filter(|&&k| k == heavy.key).count();
    let ratio = heavy_started as f64 / (60 - heavy_started) as f64;
    assert!((2.5..=3.6).contains(&ratio), "{heavy_started} of 60 were the heavy tenant's: {order:?}");
    engine.shutdown();
}
