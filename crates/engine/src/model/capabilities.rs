//! What a model can do, known before it is loaded: llama.cpp reads the GGUF's vocabulary and
//! metadata alone (no weights), so `/v1/models` says it for models not loaded, and a route
//! refuses a model that cannot serve it without loading it.
//!
//! The pooling type decides the kind: a GGUF that declares one (BERT sentence-transformers,
//! decoder embedding models) gives vectors, and rank pooling a cross-encoder's scores; one that
//! declares none generates text. Fill-in-the-middle is read through llama.cpp's vocabulary, not
//! the header: llama.cpp also finds FIM tokens by their text (qwen2.5-coder declares none).

use std::path::Path;

use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;

use crate::model::backend;
use crate::model::raw_prompt::FimTokens;
use crate::LoadError;

/// How a model turns its per-token states into one output: llama.cpp's `llama_pooling_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// None declared: a generative model.
    #[default]
    None,
    Mean,
    Cls,
    Last,
    /// A cross-encoder's relevance score (a reranker).
    Rank,
}

impl Pooling {
    /// The GGUF's `{arch}.pooling_type`.
    pub(crate) fn of(llama: &LlamaModel) -> Self {
        let arch = llama.meta_val_str("general.architecture").unwrap_or_default();
        match llama.meta_val_str(&format!("{arch}.pooling_type")).ok().and_then(|v| v.parse::<u32>().ok()) {
            Some(1) => Self::Mean,
            Some(2) => Self::Cls,
            Some(3) => Self::Last,
            Some(4) => Self::Rank,
            _ => Self::None,
        }
    }

    /// Whether a model with this pooling gives one vector per input.
    pub fn embeds(self) -> bool {
        matches!(self, Self::Mean | Self::Cls | Self::Last)
    }
}

/// What one model file can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub pooling: Pooling,
    /// It has a chat template: chat dialects render their messages with it.
    pub chat_template: bool,
    /// Its vocabulary has the tokens of a fill-in-the-middle prompt.
    pub fill_in_the_middle: bool,
}

impl Default for Capabilities {
    /// A chat model without FIM tokens.
    fn default() -> Self {
        Self { pooling: Pooling::None, chat_template: true, fill_in_the_middle: false }
    }
}

impl Capabilities {
    /// Reads them from the GGUF at `path` (its vocabulary and metadata: tens of milliseconds).
    pub fn read(path: &Path) -> Result<Self, LoadError> {
        if !path.is_file() {
            return Err(LoadError::Missing(path.to_path_buf()));
        }
        let params = LlamaModelParams::default().with_vocab_only(true);
        let llama = LlamaModel::load_from_file(backend::llama_backend(), path, &params)
            .map_err(|e| LoadError::Llama { path: path.to_path_buf(), reason: e.to_string() })?;
        Ok(Self::of(&llama))
    }

    pub(crate) fn of(llama: &LlamaModel) -> Self {
        Self {
            pooling: Pooling::of(llama),
            chat_template: llama.meta_val_str("tokenizer.chat_template").is_ok(),
            fill_in_the_middle: FimTokens::of(llama).is_some(),
        }
    }

    /// It generates text (chat, Responses, Messages, completions).
    pub fn generates(&self) -> bool {
        self.pooling == Pooling::None
    }

    /// It gives embeddings (`/v1/embeddings`).
    pub fn embeds(&self) -> bool {
        self.pooling.embeds()
    }

    /// It scores documents against a query (`/v1/rerank`).
    pub fn ranks(&self) -> bool {
        self.pooling == Pooling::Rank
    }
}
