//! What an [`super::Engine`] is started with: the model, its context and slots, threads,
//! speculation, offload, the KV cache's layout and type, and the test hooks.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::kv::blocks::KvEventSink;
use crate::kv::cache::StreamCopies;
use crate::kv::kv_type::KvType;
use crate::kv::layout::KvLayout;
use crate::model::devices::Offload;
use crate::scheduler::sample::device::DeviceSampling;
use crate::speculation::SpeculationConfig;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// Multimodal projector GGUF: with it the model reads images (see `vision`).
    pub mmproj_path: Option<PathBuf>,
    /// Max tokens of one sequence, prompt plus completion.
    pub ctx_size: u32,
    /// Sequences decoded together (slots); KV memory is `ctx_size * parallel` tokens.
    pub parallel: u32,
    /// CPU threads for llama.cpp; `None` = physical cores.
    pub threads: Option<u32>,
    /// Max tokens per decode call (prompt chunks plus one token per running sequence).
    pub batch_size: u32,
    /// Requests allowed to wait for a slot; beyond that `submit` refuses (backpressure).
    pub max_queue: usize,
    /// Prompt-lookup speculative decoding (see `speculation`).
    pub speculation: SpeculationConfig,
    /// GPU offload (see `devices`); nothing is offloaded in a CPU build.
    pub offload: Offload,
    /// Host memory for idle sequences' KV entries (see `host_cache`); 0 keeps them in their
    /// slots instead.
    pub host_cache_bytes: usize,
    /// Shared by engines serving different models in one process: each decode step (and
    /// image encode) holds it, so the engines' steps take turns on the cores instead of all
    /// their threads spinning at once.
    pub decode_turns: Option<Arc<Mutex<()>>>,
    /// The `model` label of this engine's metrics (default: the file stem).
    pub metrics_label: String,
    /// Where Q5_0 models get their Q8_0 twin (see `q5_as_q8`); `None` serves files as they are.
    pub q8_twin_dir: Option<PathBuf>,
    /// Where embedding and rerank models get their BF16 twin (see `f32_as_bf16`: only where the
    /// CPU multiplies BF16 natively); `None` serves files as they are.
    pub bf16_twin_dir: Option<PathBuf>,
    /// One KV stream per sequence, or one buffer for all (see `kv_layout`).
    pub kv_layout: KvLayout,
    /// The type KV entries are stored in (see `kv_type`).
    pub kv_type: KvType,
    /// How KV entries are copied between streams; `None`: on the device where the KV cache is on
    /// a GPU, through host memory elsewhere.
    pub kv_copies: Option<StreamCopies>,
    /// Most sequences the requests of one API key (`Owner::key`) may run at
    /// once, so one key cannot take every slot; `None` is no limit (see `scheduler::queue`).
    pub max_running_per_key: Option<u32>,
    /// Client text that spells a control token (`<|im_end|>`) becomes that token, as the
    /// template's own markup does; off, it is tokenized as plain text (see `typed_text`).
    pub special_tokens_in_content: bool,
    /// Temperature-0 requests return the same output whatever else runs, at a cost (see
    /// `deterministic`).
    pub deterministic_greedy: bool,
    /// Where sampled choices are sampled: on the GPU that computed their logits, or on the
    /// host (see `scheduler::sample::device`).
    pub device_sampling: DeviceSampling,
    /// Where the KV cache's virtual blocks are announced as they are stored and removed, for a
    /// prefix-aware router (see `kv::blocks`); `None` keeps no account of them.
    pub kv_events: Option<KvEventSink>,
    /// Tests only: the scheduler panics once this many tokens were generated, to exercise
    /// engine death.
    #[cfg(test)]
    pub(crate) panic_after_tokens: Option<u32>,
    /// Tests only: the scheduler appends each admitted request's key (`Owner::key`) here, in order.
    #[cfg(test)]
    pub(crate) admission_log: Option<Arc<Mutex<Vec<u64>>>>,
    /// Tests only: every request's end, as the scheduler counts it (`Scheduler::end`).
    #[cfg(test)]
    pub(crate) endings_log: Option<Arc<Mutex<Vec<crate::scheduler::end::EndingRecord>>>>,
    /// Tests only: `device_sampling_max_streams` in place of `AUTO_MAX_STREAMS` (for `On` too).
    #[cfg(test)]
    pub(crate) device_sampling_max_streams: Option<usize>,
    /// Tests only: the scheduler appends each step's moves of sequences down into gaps, `(from, to)`.
    #[cfg(test)]
    pub(crate) moves_log: Option<crate::scheduler::step::compact::MovesLog>,
}

/// Default `host_cache_bytes`, in MiB: about 340k tokens of the 0.5B's KV entries, 150k of the
/// 1.5B's.
pub const DEFAULT_HOST_CACHE_MIB: usize = 4096;

impl EngineConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        let model_path: PathBuf = model_path.into();
        let metrics_label = model_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Self {
            model_path,
            mmproj_path: None,
            ctx_size: 4096,
            parallel: 4,
            threads: None,
            batch_size: 512,
            max_queue: 64,
            speculation: SpeculationConfig::default(),
            offload: Offload::default(),
            host_cache_bytes: DEFAULT_HOST_CACHE_MIB << 20,
            decode_turns: None,
            metrics_label,
            q8_twin_dir: None,
            bf16_twin_dir: None,
            kv_layout: KvLayout::default(),
            kv_type: KvType::default(),
            kv_copies: None,
            max_running_per_key: None,
            special_tokens_in_content: false,
            deterministic_greedy: false,
            device_sampling: DeviceSampling::Auto,
            kv_events: None,
            #[cfg(test)]
            panic_after_tokens: None,
            #[cfg(test)]
            admission_log: None,
            #[cfg(test)]
            endings_log: None,
            #[cfg(test)]
            moves_log: None,
            #[cfg(test)]
            device_sampling_max_streams: None,
        }
    }
}

/// llama.cpp threads when none are configured: the physical cores.
pub fn default_threads() -> u32 {
    u32::try_from(num_cpus::get_physical().max(1)).unwrap_or(u32::MAX)
}
