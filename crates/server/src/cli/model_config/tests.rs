//! Which models the flags, a models directory and a models file make.

use clap::Parser;
use gantry_engine::KvType;

use super::*;

/// `gantry serve ARGS` as the command line would parse it.
fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }
    Cli::try_parse_from(std::iter::once("gantry").chain(args.iter().copied())).map(|cli| cli.serve)
}

fn serve_args(args: &[&str]) -> ServeArgs {
    parse(args).unwrap()
}

/// Any bytes do for files only scanned and resolved, never loaded.
fn write_tiny(path: &Path) {
    std::fs::write(path, b"GGUF").unwrap();
}

#[test]
fn a_models_directory_pairs_projectors_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "SmolVLM-256M-Instruct-Q8_0.gguf",
        "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf",
        "SmolVLM-500M-Instruct-Q8_0.gguf",
        "mmproj-SmolVLM-500M-Instruct-Q8_0.gguf",
        "gemma-3-4b-it-Q4_K_M.gguf",
        "gemma-3-4b-it-mmproj-f16.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "notes.txt",
    ] {
        write_tiny(&dir.path().join(name));
    }
    let found: Vec<(String, Option<String>)> = scan_dir(dir.path())
        .unwrap()
        .into_iter()
        .map(|(m, p)| (model_id_from_path(&m), p.map(|p| model_id_from_path(&p))))
        .collect();
    let expect = |m: &str, p: Option<&str>| (m.to_string(), p.map(str::to_string));
    assert_eq!(
        found,
        [
            expect("SmolVLM-256M-Instruct-Q8_0", Some("mmproj-SmolVLM-256M-Instruct-Q8_0")),
            expect("SmolVLM-500M-Instruct-Q8_0", Some("mmproj-SmolVLM-500M-Instruct-Q8_0")),
            expect("gemma-3-4b-it-Q4_K_M", Some("gemma-3-4b-it-mmproj-f16")),
            expect("qwen2.5-coder-0.5b-instruct-q4_k_m", None),
        ]
    );
    assert!(scan_dir(tempfile::tempdir().unwrap().path()).is_err(), "an empty directory is a mistake");
}

#[test]
fn flags_a_directory_and_a_models_file_make_one_list() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"), dir.path().join("c.gguf"));
    let models_dir = dir.path().join("more");
    std::fs::create_dir(&models_dir).unwrap();
    for p in [&a, &b, &c, &models_dir.join("d.gguf")] {
        write_tiny(p);
    }
    let file = dir.path().join("models.toml");
    std::fs::write(
        &file,
        "[[model]]\nmodel = \"b.gguf\"\nid = \"bee\"\naliases = [\"gpt-4o-mini\"]\nctx_size = 1024\nparallel = 2\npin = true\nidle_unload_s = 60\n\n[[model]]\nmodel = \"c.gguf\"\n",
    )
    .unwrap();
    let args = serve_args(&[
        "--model",
        a.to_str().unwrap(),
        "--models-dir",
        models_dir.to_str().unwrap(),
        "--models-config",
        file.to_str().unwrap(),
        "--ctx-size",
        "2048",
        "--pin",
        "c",
    ]);
    let specs = model_specs(&args).unwrap();
    let ids: Vec<&str> = specs.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["a", "d", "bee", "c"]);
    let bee = &specs[2];
    assert_eq!((bee.config.ctx_size, bee.config.parallel, bee.pin), (1024, 2, true));
    assert_eq!(
        (bee.aliases.as_slice(), bee.idle_unload),
        (&["gpt-4o-mini".to_string()][..], Some(Duration::from_secs(60)))
    );
    assert_eq!(
        (specs[0].config.ctx_size, specs[0].pin, specs[3].pin),
        (2048, false, true),
        "flags apply; --pin pins a file's model"
    );
    // Only settings left at their defaults may shrink to fit the memory budget.
    assert_eq!((specs[0].config.parallel, specs[0].config.batch_size), (4, 512));
    assert_eq!(specs[0].shrinkable, crate::pool::Shrinkable::ALL);
    assert_eq!(
        bee.shrinkable,
        crate::pool::Shrinkable { parallel: false, batch: true },
        "the file gave bee's parallel"
    );
    let given =
        model_specs(&serve_args(&["--model", a.to_str().unwrap(), "--parallel", "8", "--batch-size", "256"])).unwrap();
    assert_eq!((given[0].config.parallel, given[0].config.batch_size), (8, 256));
    assert_eq!(given[0].shrinkable, crate::pool::Shrinkable { parallel: false, batch: false });

    // Names must be unique, pins must exist, the file must parse.
    std::fs::write(&file, "[[model]]\nmodel = \"b.gguf\"\nid = \"a\"\n").unwrap();
    let err = model_specs(&serve_args(&["--model", a.to_str().unwrap(), "--models-config", file.to_str().unwrap()]))
        .unwrap_err();
    assert!(err.to_string().contains("two models are served as `a`"), "{err}");
    let err = model_specs(&serve_args(&["--model", a.to_str().unwrap(), "--pin", "zzz"])).unwrap_err();
    assert!(err.to_string().contains("--pin zzz"), "{err}");
    std::fs::write(&file, "[[model]]\nmodel = \"b.gguf\"\ncolour = 3\n").unwrap();
    let err = model_specs(&serve_args(&["--models-config", file.to_str().unwrap()])).unwrap_err();
    assert!(format!("{err:#}").contains("unknown field `colour`"), "{err:#}");
}

#[test]
fn model_flags_may_name_their_id() {
    assert_eq!(split_model_arg("coder=qwen2.5-coder-0.5b"), (Some("coder"), "qwen2.5-coder-0.5b"));
    assert_eq!(split_model_arg("/m/a.gguf"), (None, "/m/a.gguf"));
    assert_eq!(split_model_arg("small=/m/a=b.gguf"), (Some("small"), "/m/a=b.gguf"));
    assert_eq!(split_model_arg("/m/a=b.gguf"), (None, "/m/a=b.gguf"));
    assert_eq!(split_model_arg("=x"), (None, "=x"));
}

#[test]
fn several_models_split_the_cores_and_take_turns_only_when_they_must() {
    let specs = |n: usize| -> Vec<ModelSpec> {
        (0..n)
            .map(|i| ModelSpec {
                id: i.to_string(),
                aliases: Vec::new(),
                config: EngineConfig::new("m.gguf"),
                pin: false,
                idle_unload: None,
                created: 0,
                shrinkable: crate::pool::Shrinkable::ALL,
                capabilities: gantry_engine::Capabilities::default(),
                prices: Vec::new(),
            })
            .collect()
    };
    let shared = |threads: Option<u32>, cores: u32, n: usize| {
        let mut s = specs(n);
        share_cores(&mut s, threads, cores);
        (s[0].config.threads, s.iter().all(|m| m.config.decode_turns.is_some()))
    };
    assert_eq!(shared(None, 8, 1), (None, false), "one model keeps the default");
    assert_eq!(shared(None, 2, 2), (Some(1), false));
    assert_eq!(shared(None, 8, 3), (Some(2), false));
    assert_eq!(shared(None, 2, 3), (Some(1), true), "more models than cores take turns");
    assert_eq!(shared(Some(2), 2, 2), (Some(2), true), "--threads 2 twice on 2 cores take turns");
    assert_eq!(shared(Some(1), 4, 2), (Some(1), false));
}

#[test]
fn q5_0_models_get_q8_0_twins_beside_the_models_cache_unless_turned_off() {
    let cache = Path::new("/cache/gantry/models");
    let twins = Some(PathBuf::from("/cache/gantry/q8-twins"));
    let cpu_build = !gantry_engine::gpu_backend_present();
    assert_eq!(q8_twin_dir(&serve_args(&[]), cache).as_ref(), if cpu_build { twins.as_ref() } else { None });
    assert_eq!(q8_twin_dir(&serve_args(&["--n-gpu-layers", "0"]), cache), twins, "nothing offloaded");
    assert_eq!(q8_twin_dir(&serve_args(&["--q5-as-q8", "off"]), cache), None);
    assert_eq!(q8_twin_dir(&serve_args(&["--q5-as-q8", "off", "--n-gpu-layers", "0"]), cache), None);
}

#[test]
fn embedding_models_get_bf16_twins_beside_the_models_cache_unless_turned_off() {
    let cache = Path::new("/cache/gantry/models");
    let twins = Some(PathBuf::from("/cache/gantry/bf16-twins"));
    let cpu_build = !gantry_engine::gpu_backend_present();
    assert_eq!(bf16_twin_dir(&serve_args(&[]), cache).as_ref(), if cpu_build { twins.as_ref() } else { None });
    assert_eq!(bf16_twin_dir(&serve_args(&["--n-gpu-layers", "0"]), cache), twins, "nothing offloaded");
    assert_eq!(bf16_twin_dir(&serve_args(&["--f32-as-bf16", "off", "--n-gpu-layers", "0"]), cache), None);
    assert!(q8_twin_dir(&serve_args(&["--f32-as-bf16", "off", "--n-gpu-layers", "0"]), cache).is_some());
}

#[test]
fn each_sequence_gets_its_own_kv_stream_unless_one_buffer_is_asked_for() {
    let layout = |args: &[&str]| spec(&serve_args(args), "m".into(), PathBuf::from("m.gguf"), None).config.kv_layout;
    assert_eq!(layout(&[]), KvLayout::PerSequence);
    assert_eq!(layout(&["--kv-unified"]), KvLayout::Unified);
}

#[test]
fn the_kv_type_comes_from_the_flag_and_a_models_file_may_set_a_models_own() {
    let kv_type = |args: &[&str]| spec(&serve_args(args), "m".into(), PathBuf::from("m.gguf"), None).config.kv_type;
    assert_eq!(kv_type(&[]), KvType::F16);
    assert_eq!(kv_type(&["--kv-type", "q8_0"]), KvType::Q8_0);
    assert!(parse(&["--kv-type", "q3_k"]).is_err());

    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    write_tiny(&a);
    write_tiny(&b);
    let file = dir.path().join("models.toml");
    std::fs::write(&file, "[[model]]\nmodel = \"a.gguf\"\nkv_type = \"q4_0\"\n\n[[model]]\nmodel = \"b.gguf\"\n")
        .unwrap();
    let specs = model_specs(&serve_args(&["--models-config", file.to_str().unwrap(), "--kv-type", "q8_0"])).unwrap();
    let types: Vec<KvType> = specs.iter().map(|s| s.config.kv_type).collect();
    assert_eq!(types, [KvType::Q4_0, KvType::Q8_0], "the file's type, else the flag's");
    std::fs::write(&file, "[[model]]\nmodel = \"a.gguf\"\nkv_type = \"fp8\"\n").unwrap();
    let err = model_specs(&serve_args(&["--models-config", file.to_str().unwrap()])).unwrap_err();
    assert!(format!("{err:#}").contains("unknown KV type \"fp8\""), "{err:#}");
}

#[test]
fn deterministic_greedy_is_asked_for_and_needs_a_kv_stream_per_sequence() {
    let on =
        |args: &[&str]| spec(&serve_args(args), "m".into(), PathBuf::from("m.gguf"), None).config.deterministic_greedy;
    assert!(!on(&[]));
    assert!(on(&["--deterministic-greedy"]));
    // One unified buffer puts every row in one ubatch: the isolation cannot be had there.
    let both = parse(&["--deterministic-greedy", "--kv-unified"]);
    assert!(both.is_err_and(|e| e.kind() == clap::error::ErrorKind::ArgumentConflict));
}

#[test]
fn model_id_is_the_file_stem() {
    let p = std::path::Path::new("/x/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert_eq!(model_id_from_path(p), "qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn a_models_file_prices_a_models_tiers() {
    use crate::prices::BillingTier;
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.gguf");
    write_tiny(&a);
    let file = dir.path().join("models.toml");
    let models = |text: &str| {
        std::fs::write(&file, text).unwrap();
        model_specs(&serve_args(&["--models-config", file.to_str().unwrap()]))
    };
    let specs =
        models("[[model]]\nmodel = \"a.gguf\"\nprice = { default = \"1,2,0.5\", batch = \"0.25, 1\" }\n").unwrap();
    let prices: Vec<(BillingTier, f64, f64, Option<f64>)> = specs[0]
        .prices
        .iter()
        .map(|(tier, p)| (*tier, p.input_per_mtok, p.output_per_mtok, p.cached_input_per_mtok))
        .collect();
    assert_eq!(
        prices,
        [
            (BillingTier::Batch, 0.25, 1.0, None),
            (BillingTier::Service(gantry_api::ServiceTier::Default), 1.0, 2.0, Some(0.5))
        ]
    );
    for (bad, says) in [
        ("turbo = \"1,2\"", "\"turbo\" is not a billing tier"),
        ("flex = \"1\"", "expected \"INPUT,OUTPUT[,CACHED]\""),
        ("flex = \"1,-2\"", "\"-2\" is not a price"),
    ] {
        let err = models(&format!("[[model]]\nmodel = \"a.gguf\"\nprice = {{ {bad} }}\n")).unwrap_err();
        assert!(format!("{err:#}").contains(says) && format!("{err:#}").contains("price."), "{bad}: {err:#}");
    }
}
