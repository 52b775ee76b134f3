//! The `cache-scopes` workload (Gantry only): what per-tenant prompt-cache scopes cost. Every
//! request of a level shares one ~1,000-token system prompt; the requests go round-robin to the
//! keys of 1 or 4 tenants, all with `cache_scope` `shared` or all `tenant` (docs/security.md,
//! "Prompt cache scopes"). With `tenant`, each tenant computes the system prompt once for itself;
//! with `shared`, the server computes it once. The report is the prompt cache's hit rate
//! (Σ `cached_tokens` ÷ Σ `prompt_tokens`, from usage) and TTFT, per combination.

use anyhow::{bail, Result};

use crate::runs::{cells, find, table, ServerRun, GANTRY};
use crate::servers::Running;

/// A key's `cache_scope` as the benchmark sets it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CacheScope {
    #[default]
    Shared,
    Tenant,
}

impl CacheScope {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CacheScope::Shared => "shared",
            CacheScope::Tenant => "tenant",
        }
    }
}

/// One combination: how many tenants the requests are spread over, and their keys' scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tenancy {
    pub tenants: usize,
    pub scope: CacheScope,
}

impl Default for Tenancy {
    fn default() -> Self {
        Tenancy { tenants: 1, scope: CacheScope::Shared }
    }
}

const LABEL_PREFIX: &str = "cache-scopes/";

impl Tenancy {
    /// The four combinations the report compares.
    pub(crate) const MEASURED: [Tenancy; 4] = [
        Tenancy { tenants: 1, scope: CacheScope::Shared },
        Tenancy { tenants: 1, scope: CacheScope::Tenant },
        Tenancy { tenants: 4, scope: CacheScope::Shared },
        Tenancy { tenants: 4, scope: CacheScope::Tenant },
    ];

    /// The workload name its results go under, e.g. `cache-scopes/4/tenant`.
    pub(crate) fn label(self) -> String {
        format!("{LABEL_PREFIX}{}/{}", self.tenants, self.scope.as_str())
    }

    pub(crate) fn parse_label(label: &str) -> Option<Tenancy> {
        let (tenants, scope) = label.strip_prefix(LABEL_PREFIX)?.split_once('/')?;
        let scope = [CacheScope::Shared, CacheScope::Tenant].into_iter().find(|s| s.as_str() == scope)?;
        Some(Tenancy { tenants: tenants.parse().ok().filter(|&n| n > 0)?, scope })
    }

    /// Mixed into the system prompt's seed, so every combination starts with a cold cache.
    pub(crate) fn seed_bits(self) -> u64 {
        ((self.tenants as u64) << 40) ^ ((self.scope as u64 + 1) << 56)
    }

    /// Tenant names of this combination: its own, so no other combination shares their scope.
    pub(crate) fn tenant_names(self) -> Vec<String> {
        (0..self.tenants).map(|j| format!("bench-{}t-{}-{j}", self.tenants, self.scope.as_str())).collect()
    }
}

/// Creates one key per tenant of `tenancy` on the running Gantry through `gantry keys create`
/// (its data directory; the server reads keys from the database on every request), in tenant
/// order, so request `i` goes to tenant `i % tenants`.
pub(crate) async fn create_keys(gantry: &Running, tenancy: Tenancy) -> Result<Vec<String>> {
    let mut keys = Vec::new();
    for tenant in tenancy.tenant_names() {
        let args = ["keys", "create", "--name", &tenant, "--tenant", &tenant, "--cache-scope", tenancy.scope.as_str()];
        let out = gantry.run_cli(&args).await?;
        let Some(secret) = out.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
            bail!("`gantry keys create` printed no key for tenant {tenant}");
        };
        keys.push(secret.to_string());
    }
    Ok(keys)
}

/// Gantry's `cache-scopes` results, one row per combination (passes merged: token counts summed,
/// TTFT mean and p50 averaged over passes); `None` when none was measured.
pub(crate) fn cache_scope_table(runs: &[ServerRun]) -> Option<String> {
    let headers =
        ["tenants", "cache_scope", "ok/total", "prompt tok", "cached tok", "hit rate", "TTFT mean ms", "TTFT p50 ms"];
    let mut rows = Vec::new();
    for key in cells(runs) {
        let Some(tenancy) = Tenancy::parse_label(&key.0) else { continue };
        let Some(l) = find(runs, GANTRY, &key) else { continue };
        let hit_rate = if l.prompt_tokens > 0 {
            format!("{:.3}", l.cached_tokens as f64 / l.prompt_tokens as f64)
        } else {
            "n/a".into()
        };
        let ms = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "n/a".into());
        rows.push(vec![
            tenancy.tenants.to_string(),
            tenancy.scope.as_str().to_string(),
            format!("{}/{}", l.requests - l.failed, l.requests),
            l.prompt_tokens.to_string(),
            l.cached_tokens.to_string(),
            hit_rate,
            ms(l.ttft_mean_ms),
            ms(l.ttft_p50_ms),
        ]);
    }
    (!rows.is_empty()).then(|| table(&headers, &rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::testing::run;
    use crate::runs::REFERENCE;
    use crate::stats::{summarize, RequestSample};

    #[test]
    fn labels_round_trip_and_combinations_are_apart() {
        for t in Tenancy::MEASURED {
            assert_eq!(Tenancy::parse_label(&t.label()), Some(t));
        }
        assert_eq!(Tenancy::MEASURED[3].label(), "cache-scopes/4/tenant");
        for bad in ["chat", "cache-scopes/0/shared", "cache-scopes/4/key", "cache-scopes/x/tenant", "cache-scopes/4"] {
            assert_eq!(Tenancy::parse_label(bad), None, "{bad}");
        }
        let bits: std::collections::HashSet<u64> = Tenancy::MEASURED.iter().map(|t| t.seed_bits()).collect();
        assert_eq!(bits.len(), 4, "every combination gets its own system prompt");
        let names: std::collections::HashSet<String> =
            Tenancy::MEASURED.iter().flat_map(|t| t.tenant_names()).collect();
        assert_eq!(names.len(), 10, "no tenant is shared between combinations: {names:?}");
    }

    fn level(t: Tenancy, pass: usize, samples: &[(f64, u64, u64)]) -> crate::stats::LevelResult {
        let s: Vec<RequestSample> = samples
            .iter()
            .map(|&(ttft, prompt, cached)| RequestSample {
                ttft: Some(ttft),
                completion_tokens: 32,
                prompt_tokens: Some(prompt),
                cached_tokens: Some(cached),
                ..Default::default()
            })
            .collect();
        crate::stats::LevelResult { pass, ..summarize(&t.label(), 2, &s, 10.0) }
    }

    #[test]
    fn the_table_has_hit_rate_and_ttft_per_combination_over_passes() {
        let [one, _, _, four] = Tenancy::MEASURED;
        // Four tenants, `tenant` scope: each pass's first request of each tenant pays in full.
        let gantry = run(
            GANTRY,
            vec![
                level(one, 0, &[(2.0, 1000, 0), (0.2, 1000, 1000), (0.2, 1000, 1000), (0.2, 1000, 1000)]),
                level(four, 0, &[(2.0, 1000, 0), (2.0, 1000, 0), (0.2, 1000, 990), (0.2, 1000, 990)]),
                level(four, 1, &[(3.0, 1000, 0), (2.0, 1000, 0), (0.4, 1000, 990), (0.2, 1000, 990)]),
            ],
        );
        let t = cache_scope_table(&[gantry, run(REFERENCE, vec![])]).unwrap();
        let row = |needle: &str| {
            t.lines().find(|l| l.starts_with(needle)).unwrap_or_else(|| panic!("{needle}: {t}")).to_string()
        };
        let single = row("| 1       | shared");
        assert!(single.contains("| 0.750 ") && single.contains("| 650 ") && single.contains("| 200 "), "{t}");
        // 3960 of 8000 cached; means 1100 and 1400 ms → 1250; p50s 1100 and 1200 → 1150.
        let tenants = row("| 4       | tenant");
        assert!(
            tenants.contains("| 8/8 ")
                && tenants.contains("| 0.495 ")
                && tenants.contains("| 1250 ")
                && tenants.contains("| 1150 "),
            "{t}"
        );
        assert!(!t.contains("| 1       | tenant"), "unmeasured combinations are left out: {t}");
        assert_eq!(cache_scope_table(&[run(GANTRY, vec![crate::runs::testing::level("chat", 1, 0, 10.0, 0.1)])]), None);
    }
}
