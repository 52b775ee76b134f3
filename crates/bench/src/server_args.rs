//! The command lines of the servers under test: Gantry, llama-server as `make bench` has always
//! started it (the plain reference), and llama-server as an expert would run it (the tuned
//! reference: n-gram speculation and flash attention), all with the same model, threads, slots
//! and context.

use std::path::Path;

use crate::servers::{Kind, ServerSettings};

/// llama-server's "every layer on the GPU": more layers than any model has.
pub(crate) const REFERENCE_ALL_LAYERS: [&str; 2] = ["-ngl", "999"];

/// What the tuned reference adds to the plain one. `ngram-mod` drafts from a hash pool of the
/// n-grams every slot has seen, so it needs no draft model and costs nothing when it finds no
/// match. llama.cpp's docs/speculative.md suggests `--spec-ngram-mod-n-match 24 --spec-ngram-mod-
/// n-min 48 --spec-ngram-mod-n-max 64` and says dense models can use shorter drafts: every model
/// here is dense and small, and on a CPU verifying a 64-token draft costs several decode steps,
/// so drafts are 16 to 32 tokens (the lookup stays at 24: llama.cpp warns below 16). The old
/// `--draft-max`/`--draft-min` flags are removed in this build. `-fa on` forces flash attention,
/// which `auto` may leave off.
pub(crate) const TUNED_REFERENCE_ARGS: [&str; 10] = [
    "--spec-type",
    "ngram-mod",
    "--spec-ngram-mod-n-match",
    "24",
    "--spec-ngram-mod-n-min",
    "16",
    "--spec-ngram-mod-n-max",
    "32",
    "-fa",
    "on",
];

/// The command-line arguments for `kind`, and the API key Gantry is started with.
pub(crate) fn server_args(
    kind: Kind,
    model: &str,
    port: u16,
    dir: &Path,
    s: &ServerSettings,
) -> (Vec<String>, Option<String>) {
    let strings = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    match kind {
        Kind::Gantry => {
            let key = format!("sk-gantry-bench-key-{port:05}");
            let a = [
                "serve",
                "--model",
                model,
                "--port",
                &port.to_string(),
                "--host",
                "127.0.0.1",
                "--data-dir",
                &dir.join("data").display().to_string(),
                "--api-key",
                &key,
                "--parallel",
                &s.parallel.to_string(),
                "--ctx-size",
                &s.ctx_per_seq.to_string(),
                "--threads",
                &s.threads.to_string(),
                // Batches (`interference`) may fill every sequence; no other workload sends one.
                "--batch-concurrency",
                &s.parallel.to_string(),
                // The bench reads the kernels, GPUs and step profile from /metrics, which a
                // single listener serves only to the admin token unless told otherwise.
                "--public-metrics",
            ];
            (strings(&a), Some(key))
        }
        Kind::Reference | Kind::TunedReference => {
            let a = [
                "-m",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "-t",
                &s.threads.to_string(),
                "-np",
                &s.parallel.to_string(),
                "-c",
                &(s.ctx_per_seq * s.parallel).to_string(),
                "--cont-batching",
            ];
            let mut a = strings(&a);
            if s.embeddings {
                // Tuned: a batch that holds many slots' inputs at once (its default, 512
                // tokens, holds a dozen sentences).
                a.push("--embeddings".into());
                if kind == Kind::TunedReference {
                    let batch = crate::embeddings::BATCH_TOKENS.to_string();
                    a.extend(strings(&["-b", &batch, "-ub", &batch]));
                }
            } else if kind == Kind::TunedReference {
                a.extend(strings(&TUNED_REFERENCE_ARGS));
            }
            if s.gpu {
                a.extend(strings(&REFERENCE_ALL_LAYERS));
            }
            (a, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings(gpu: bool) -> ServerSettings {
        ServerSettings {
            model: "m.gguf".into(),
            threads: 16,
            parallel: 64,
            ctx_per_seq: 4096,
            ready_timeout: Duration::from_secs(1),
            gpu,
            embeddings: false,
        }
    }

    fn joined(kind: Kind, s: &ServerSettings) -> String {
        server_args(kind, "m.gguf", 8080, Path::new("/tmp/x"), s).0.join(" ")
    }

    #[test]
    fn gpu_mode_offloads_every_layer_of_both_with_the_same_slots_and_threads() {
        let mut s = settings(false);
        assert!(!joined(Kind::Reference, &s).contains("-ngl"), "the CPU reference has no GPU flag");
        s.gpu = true;
        let reference = joined(Kind::Reference, &s);
        assert!(reference.ends_with("-ngl 999"), "{reference}");
        assert!(reference.contains("-t 16 -np 64 -c 262144"), "{reference}");
        let gantry = joined(Kind::Gantry, &s);
        assert!(gantry.contains("--parallel 64 --ctx-size 4096 --threads 16"), "{gantry}");
        // Its kernels, GPUs and step profile are read from /metrics, admin-only by default.
        assert!(gantry.contains("--public-metrics"), "{gantry}");
        // A CUDA build of Gantry offloads every layer when --n-gpu-layers is left unset.
        assert!(!gantry.contains("--n-gpu-layers"), "{gantry}");
    }

    #[test]
    fn the_tuned_reference_is_the_plain_one_with_ngram_speculation_and_flash_attention() {
        for gpu in [false, true] {
            let s = settings(gpu);
            let plain = joined(Kind::Reference, &s);
            let tuned = joined(Kind::TunedReference, &s);
            assert!(!plain.contains("--spec-type") && !plain.contains("-fa"), "{plain}");
            let base = plain.trim_end_matches(" -ngl 999");
            assert!(tuned.starts_with(base), "the same model, threads, slots and context: {tuned}");
            assert!(
                tuned.contains(
                    "--spec-type ngram-mod --spec-ngram-mod-n-match 24 --spec-ngram-mod-n-min 16 \
                     --spec-ngram-mod-n-max 32 -fa on"
                ),
                "{tuned}"
            );
            // The flags this llama.cpp build removed would stop it at start.
            assert!(!tuned.contains("--draft-max") && !tuned.contains("--draft-min"), "{tuned}");
            assert_eq!(tuned.ends_with("-ngl 999"), gpu, "{tuned}");
            assert_eq!(server_args(Kind::TunedReference, "m", 1, Path::new("/"), &s).1, None, "no API key");
        }
    }

    #[test]
    fn an_embedding_model_gets_llama_servers_embeddings_flag_and_tuned_a_larger_batch() {
        let s = crate::embeddings::settings(Path::new("e.gguf"), 2, Duration::from_secs(1));
        let reference = joined(Kind::Reference, &s);
        assert!(reference.contains("-np 64 -c 32768"), "{reference}");
        assert!(reference.ends_with("--embeddings"), "{reference}");
        let tuned = joined(Kind::TunedReference, &s);
        assert!(tuned.ends_with("--embeddings -b 8192 -ub 8192"), "no n-gram speculation: {tuned}");
        assert!(!joined(Kind::Gantry, &s).contains("--embeddings"), "Gantry knows its model embeds");
    }
}
