//! The whole server's load, as the Kubernetes inference gateway's model-server protocol reads
//! it: requests waiting, requests running and KV-cache utilisation, each exported once for the
//! whole server (an endpoint picker takes the first series of a family, so per-model series
//! would give it an arbitrary model's), summed over the models' own gauges at every scrape; and,
//! with `--metrics-compat vllm`, the same figures under vLLM's names.
//!
//! KV-cache utilisation counts only the cells of running requests' sequences: the prefixes idle
//! sequences keep for reuse are free for the taking, so a warm idle server reads 0, not 1.
//! Gantry's cache is per sequence, not paged; the info gauge describes it in virtual blocks of
//! [`KV_BLOCK_TOKENS`] tokens.

use std::fmt::Write as _;

use crate::admin::stats::tap::Reading;

/// Tokens per virtual KV block (the info gauges' `block_size`).
pub(crate) const KV_BLOCK_TOKENS: u64 = 64;

/// The whole server's figures, summed over models.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct ServerLoad {
    pub waiting: f64,
    pub running: f64,
    pub active_tokens: f64,
    pub capacity_tokens: f64,
}

impl ServerLoad {
    /// Sums the models' gauges.
    pub(crate) fn of(gauges: &[Reading]) -> Self {
        let sum = |name: &str| gauges.iter().filter(|g| g.name == name).map(|g| g.value).sum::<f64>();
        Self {
            waiting: sum("gantry_queue_depth"),
            running: sum("gantry_running_sequences"),
            active_tokens: sum("gantry_kv_cache_active_tokens"),
            capacity_tokens: sum("gantry_kv_cache_capacity_tokens"),
        }
    }

    /// Cells of running sequences over all cells, 0 to 1 (0 with no model loaded).
    pub(crate) fn kv_utilisation(&self) -> f64 {
        if self.capacity_tokens > 0.0 {
            (self.active_tokens / self.capacity_tokens).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    fn blocks(&self) -> u64 {
        // A token count: whole, and far below 2^53.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let tokens = self.capacity_tokens.max(0.0) as u64;
        tokens / KV_BLOCK_TOKENS
    }
}

/// The exposition-format text of the whole-server gauges, with vLLM's aliases where
/// `vllm_model` names the model they carry.
pub(crate) fn render(gauges: &[Reading], vllm_model: Option<&str>) -> String {
    let load = ServerLoad::of(gauges);
    let blocks = load.blocks();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, labels: &str, value: f64| {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{labels} {value}\n");
    };
    gauge("gantry_requests_waiting", "Requests waiting for a sequence, every model together.", "", load.waiting);
    gauge("gantry_requests_running", "Sequences being prefilled or decoded, every model together.", "", load.running);
    let utilisation = load.kv_utilisation();
    gauge(
        "gantry_kv_cache_utilization",
        "Share (0 to 1) of the KV cache's cells running requests hold, every model together; the \
         prefixes idle sequences keep for reuse count as free.",
        "",
        utilisation,
    );
    let info = format!("{{block_size=\"{KV_BLOCK_TOKENS}\",num_blocks=\"{blocks}\"}}");
    gauge("gantry_kv_cache_info", "Always 1; the KV cache in virtual blocks of block_size tokens.", &info, 1.0);
    if let Some(model) = vllm_model {
        let label = format!("{{model_name=\"{}\"}}", escaped(model));
        gauge("vllm:num_requests_waiting", "gantry_requests_waiting, under vLLM's name.", &label, load.waiting);
        gauge("vllm:num_requests_running", "gantry_requests_running, under vLLM's name.", &label, load.running);
        gauge(
            "vllm:kv_cache_usage_perc",
            "gantry_kv_cache_utilization (0 to 1), under vLLM's name.",
            &label,
            utilisation,
        );
        // Its name before vLLM v1, which pickers older than the inference extension's v1 read.
        gauge("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc, under vLLM's older name.", &label, utilisation);
        let info = format!(
            "{{model_name=\"{}\",block_size=\"{KV_BLOCK_TOKENS}\",num_gpu_blocks=\"{blocks}\"}}",
            escaped(model)
        );
        gauge("vllm:cache_config_info", "gantry_kv_cache_info, under vLLM's name.", &info, 1.0);
    }
    out
}

/// A label value as the exposition format quotes it.
fn escaped(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(name: &str, model: &str, value: f64) -> Reading {
        Reading { name: name.into(), labels: vec![("model".into(), model.into())], value }
    }

    /// Two models: one busy, one idle but warm (its prefixes fill half its cache).
    fn two_models() -> Vec<Reading> {
        vec![
            reading("gantry_queue_depth", "a", 3.0),
            reading("gantry_running_sequences", "a", 2.0),
            reading("gantry_kv_cache_active_tokens", "a", 512.0),
            reading("gantry_kv_cache_tokens", "a", 700.0),
            reading("gantry_kv_cache_capacity_tokens", "a", 2048.0),
            reading("gantry_queue_depth", "b", 1.0),
            reading("gantry_running_sequences", "b", 0.0),
            reading("gantry_kv_cache_active_tokens", "b", 0.0),
            reading("gantry_kv_cache_tokens", "b", 1024.0),
            reading("gantry_kv_cache_capacity_tokens", "b", 2048.0),
        ]
    }

    #[test]
    fn the_server_sums_its_models_and_idle_prefixes_count_as_free() {
        let load = ServerLoad::of(&two_models());
        assert_eq!((load.waiting, load.running), (4.0, 2.0));
        assert_eq!(load.kv_utilisation(), 0.125);
        assert_eq!(ServerLoad::of(&[]).kv_utilisation(), 0.0);
    }

    /// The samples of `family` in `text`: the value of each line naming it.
    fn samples<'a>(text: &'a str, family: &str) -> Vec<(&'a str, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let name = series.split('{').next()?;
                (name == family).then(|| (series, value.parse().unwrap()))
            })
            .collect()
    }

    #[test]
    fn each_family_is_exported_once_and_vllms_names_only_when_asked() {
        let plain = render(&two_models(), None);
        for family in ["gantry_requests_waiting", "gantry_requests_running", "gantry_kv_cache_utilization"] {
            assert_eq!(samples(&plain, family).len(), 1, "{family}: {plain}");
        }
        assert_eq!(
            samples(&plain, "gantry_kv_cache_info"),
            [("gantry_kv_cache_info{block_size=\"64\",num_blocks=\"64\"}", 1.0)]
        );
        assert!(!plain.contains("vllm:"), "{plain}");
        let aliased = render(&two_models(), Some("qwen \"0.5b\""));
        let label = "{model_name=\"qwen \\\"0.5b\\\"\"}";
        assert_eq!(
            samples(&aliased, "vllm:num_requests_waiting"),
            [(&*format!("vllm:num_requests_waiting{label}"), 4.0)]
        );
        assert_eq!(samples(&aliased, "vllm:kv_cache_usage_perc")[0].1, 0.125);
        assert_eq!(samples(&aliased, "vllm:gpu_cache_usage_perc")[0].1, 0.125);
        assert!(aliased.contains("# TYPE vllm:num_requests_running gauge\n"), "{aliased}");
    }
}
