//! The whole-server load gauges an inference gateway's endpoint picker and KEDA read (issue
//! #57), against the real binary on the tiny model: waiting and running follow a burst, KV-cache
//! utilisation rises with running sequences and falls back once they end although their
//! prefixes stay cached, each family is one series, vLLM's names parse as the picker parses
//! them, and `--metrics-listen` serves them to anyone with nothing else beside.

mod common;

use common::metrics::{one, scrape, scrape_until, Sample};
use common::{long_streams, TestServer, KEY};

#[tokio::test]
async fn the_load_gauges_follow_a_burst_and_idle_prefixes_count_as_free() {
    // Two sequences of 4,096 tokens: four long answers keep two running and two waiting for a
    // few seconds. No host memory: finished sequences keep their prefixes in the KV cache.
    let s = TestServer::start(&[
        "--parallel",
        "2",
        "--ctx-size",
        "4096",
        "--cache-ram",
        "0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--metrics-compat",
        "vllm",
    ]);
    let metrics = s
        .stdout_lines
        .iter()
        .find_map(|l| l.strip_prefix("/metrics also at ")?.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| panic!("no metrics listener in {:?}", s.stdout_lines));
    // The metrics listener serves nothing but metrics and health, to anyone.
    let base = metrics.trim_end_matches("/metrics");
    assert_eq!(reqwest::get(format!("{base}/health")).await.unwrap().status(), 200);
    let api = reqwest::Client::new().get(format!("{base}/v1/models")).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(api.status(), 404);
    // The API listener keeps /metrics for the admin token (none here: refused).
    assert_ne!(reqwest::get(s.url("/metrics")).await.unwrap().status(), 200);

    let idle = scrape(&metrics).await;
    for family in ["gantry_requests_waiting", "gantry_requests_running", "gantry_kv_cache_utilization"] {
        assert_eq!(one(&idle, family).value, 0.0, "{family} at start");
    }
    let info = one(&idle, "gantry_kv_cache_info");
    let label = |s: &Sample, k: &str| s.labels.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(label(info, "block_size").as_deref(), Some("64"));
    assert_eq!(label(info, "num_blocks").as_deref(), Some("128"), "2 × 4,096 tokens in blocks of 64");

    let streams = long_streams(&s, 4).await;
    let busy = scrape_until(&metrics, "two running and two waiting", |m| {
        one(m, "gantry_requests_running").value == 2.0 && one(m, "gantry_requests_waiting").value == 2.0
    })
    .await;
    let utilisation = one(&busy, "gantry_kv_cache_utilization").value;
    assert!(utilisation > 0.0 && utilisation <= 1.0, "{utilisation}");
    // vLLM's names carry the same figures, under the served model's name.
    for (alias, own) in [
        ("vllm:num_requests_waiting", "gantry_requests_waiting"),
        ("vllm:num_requests_running", "gantry_requests_running"),
        ("vllm:kv_cache_usage_perc", "gantry_kv_cache_utilization"),
        ("vllm:gpu_cache_usage_perc", "gantry_kv_cache_utilization"),
    ] {
        let sample = one(&busy, alias);
        assert_eq!(label(sample, "model_name"), Some(s.model_id.clone()), "{alias}");
        assert_eq!(sample.value, one(&busy, own).value, "{alias} beside {own}");
    }
    assert_eq!(label(one(&busy, "vllm:cache_config_info"), "num_gpu_blocks").as_deref(), Some("128"));

    // Every client leaves: the gauges fall back, while the sequences keep their prefixes.
    drop(streams);
    let after = scrape_until(&metrics, "an idle server", |m| {
        one(m, "gantry_requests_running").value == 0.0 && one(m, "gantry_requests_waiting").value == 0.0
    })
    .await;
    assert_eq!(one(&after, "gantry_kv_cache_utilization").value, 0.0);
    let kept = after.iter().find(|m| m.name == "gantry_kv_cache_tokens").map_or(0.0, |m| m.value);
    assert!(kept > 0.0, "the idle sequences keep their prefixes: {after:?}");
}
