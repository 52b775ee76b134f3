//! The loaded GGUF model: weights, vocabulary, chat template, and prompt preparation.
//! Shared read-only between HTTP handlers (tokenizing) and the scheduler thread (decoding).

pub(crate) mod backend;
pub(crate) mod capabilities;
pub mod cpu_variants;
pub(crate) mod devices;
pub(crate) mod dot_kernels;
pub(crate) mod gguf_header;
pub(crate) mod memory;
pub(crate) mod raw_prompt;
pub mod template;
pub(crate) mod twins;
pub(crate) mod typed_text;
pub(crate) mod vision;

use std::convert::Infallible;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::model::devices::Offload;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token_type::LlamaTokenAttr;
use serde_json::Value as Json;

use crate::constraint::{Constraint, Grammars};
use crate::model::template::{ChatTemplate, TemplateError};
use crate::model::typed_text::{restore, ControlTexts};
use crate::model::vision::{image_token_ids, DecodedImage, ImageError, ImageInput, PromptImage, Vision};
use crate::request::Prompt;
use crate::speculation::json_layout::JsonMarks;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model file {0} does not exist")]
    Missing(PathBuf),
    #[error("llama.cpp could not load {path}: {reason}")]
    Llama { path: PathBuf, reason: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("could not create the llama.cpp context: {0}")]
    Context(String),
    #[error("{0}")]
    Projector(String),
    /// A model served for embeddings that cannot give them (see `embedder`).
    #[error("{0}")]
    NotEmbedding(String),
}

/// Facts about the served model that the API layer needs.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub n_vocab: i32,
    pub n_ctx_train: u32,
    pub size_bytes: u64,
    pub n_params: u64,
    /// Whether the model can look at images (a multimodal projector is loaded).
    pub supports_vision: bool,
    /// Text to write into a message's content where an image part was (vision models only).
    pub image_marker: Option<String>,
    /// The GGUF's `tokenizer.chat_template`; `None` for a model without one (a base model), which
    /// is loaded all the same but cannot render a chat.
    pub chat_template: Option<String>,
}

pub struct LoadedModel {
    /// Shared with the grammar tokenizer (`constraint::LlamaTokEnv`).
    pub(crate) llama: Arc<LlamaModel>,
    /// `None` when the model has no chat template: chat requests get [`TemplateError::Missing`].
    template: Option<ChatTemplate>,
    info: ModelInfo,
    add_bos: bool,
    bos_text: String,
    grammars: Grammars,
    pub(crate) vision: Option<Vision>,
    /// Read from the vocabulary the first time a request answers under a grammar.
    json_marks: OnceLock<JsonMarks>,
    /// Read from the vocabulary the first time an answer meets `auto` tools (see `answer_gate`).
    call_starts: OnceLock<Arc<Vec<u32>>>,
    /// Every end-of-generation token, read from the vocabulary the first time a request ignores
    /// them (`ignore_eos`).
    end_tokens: OnceLock<Vec<i32>>,
    /// What a client's text may not spell as control tokens (see `typed_text`).
    control_texts: ControlTexts,
    /// The `<tool_call>` tag's own token, where the vocabulary has one (Qwen, Hermes).
    tool_call_tag: Option<i32>,
    /// The thinking block's markers, when the template has one (a reasoning model).
    thinking: Option<crate::thinking::Markers>,
    /// `--special-tokens-in-content`: client text is parsed for control tokens like the
    /// template's own (trusted single-user deployments that want the old behaviour).
    special_tokens_in_content: bool,
}

impl LoadedModel {
    /// Loads the model and, with `mmproj`, its multimodal projector (encoding on `threads`).
    pub fn load(path: &Path, mmproj: Option<&Path>, threads: i32, offload: &Offload) -> Result<Arc<Self>, LoadError> {
        Self::load_weights(path, path, mmproj, threads, offload, false)
    }

    /// [`Self::load`] with the weights read from `weights`, a converted copy of the model at
    /// `path` (see `twins`); the model is known by `path`.
    pub(crate) fn load_weights(
        path: &Path,
        weights: &Path,
        mmproj: Option<&Path>,
        threads: i32,
        offload: &Offload,
        special_tokens_in_content: bool,
    ) -> Result<Arc<Self>, LoadError> {
        if !weights.is_file() {
            return Err(LoadError::Missing(weights.to_path_buf()));
        }
        let llama = LlamaModel::load_from_file(backend::llama_backend(), weights, &offload.model_params())
            .map_err(|e| LoadError::Llama { path: weights.to_path_buf(), reason: e.to_string() })?;
        let llama = Arc::new(llama);
        let chat_template = llama.meta_val_str("tokenizer.chat_template").ok();
        if chat_template.is_none() {
            tracing::warn!(model = %path.display(), "the model has no chat template (a base model): its chat requests are refused");
        }
        let vocab = llama.vocab();
        let piece = |t: LlamaToken| {
            if t.0 < 0 {
                return String::new();
            }
            String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned()
        };
        let bos_text = piece(vocab.bos());
        let eos_text = piece(vocab.eos());
        let add_bos = vocab.should_add_bos();
        let template = chat_template.as_deref().map(|t| ChatTemplate::new(t, &bos_text, &eos_text)).transpose()?;
        let vision = mmproj.map(|p| Vision::load(p, &llama, threads)).transpose().map_err(LoadError::Projector)?;
        let info = ModelInfo {
            path: path.to_path_buf(),
            n_vocab: llama.n_vocab(),
            n_ctx_train: llama.n_ctx_train(),
            size_bytes: llama.size(),
            n_params: llama.n_params(),
            supports_vision: vision.is_some(),
            image_marker: vision.as_ref().map(|v| v.marker().to_string()),
            chat_template,
        };
        let (grammars, json_marks) = (Grammars::new(), OnceLock::new());
        let template_text = info.chat_template.as_deref().unwrap_or_default();
        let control_texts = ControlTexts::new(special_token_texts(&llama, template_text));
        let tool_call_tag = match vocab.tokenize(b"<tool_call>", false, true)[..] {
            [tag] if vocab.attr(tag).intersects(LlamaTokenAttr::Control | LlamaTokenAttr::UserDefined) => Some(tag.0),
            _ => None,
        };
        let tokenize_special =
            |text: &str| vocab.tokenize(text.as_bytes(), false, true).into_iter().map(|t| t.0).collect();
        let thinking = crate::thinking::Markers::detect(template_text, tokenize_special);
        Ok(Arc::new(Self {
            llama,
            thinking,
            template,
            info,
            add_bos,
            bos_text,
            grammars,
            vision,
            json_marks,
            call_starts: OnceLock::new(),
            end_tokens: OnceLock::new(),
            control_texts,
            tool_call_tag,
            special_tokens_in_content,
        }))
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Renders the conversation with the model's template and tokenizes it exactly as it will be
    /// decoded, so `tokens.len()` is the billed prompt size. Images (places marked with
    /// [`ModelInfo::image_marker`]) count as many positions as admission reserves for one until
    /// [`Self::attach_images`] puts the real ones there.
    ///
    /// A last assistant message marked `"prefix": true` is not a finished turn: the prompt is the
    /// conversation before it, up to the assistant's generation prompt, then its text, which the
    /// answer continues (as llama-server continues a final assistant message). That text is the
    /// client's, so it is tokenized as plain text, like any content.
    ///
    /// A reasoning model's template gets its thinking switch (`enable_thinking`) from `thinking`,
    /// and the prompt ends as [`crate::thinking::Markers::plan`] says; its plan comes back
    /// (`None` for other models, and for a prefilled answer, which is past any thinking).
    pub fn prepare_thinking(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        thinking: crate::thinking::Thinking,
    ) -> Result<(Prompt, Option<crate::thinking::ThinkingPlan>), TemplateError> {
        let (messages, prefix) = match messages.split_last() {
            Some((last, before)) if last["prefix"] == Json::Bool(true) && last["role"] == "assistant" => {
                (before, last["content"].as_str())
            }
            _ => (messages, None),
        };
        let switch = self.thinking.as_ref().map(|_| thinking != crate::thinking::Thinking::Off);
        let (mut text, mut typed) = self.render(messages, tools, switch)?;
        let plan = match &self.thinking {
            Some(markers) if prefix.is_none() => markers.plan(&mut text, thinking),
            _ => None,
        };
        if let Some(prefix) = prefix.filter(|p| !p.is_empty()) {
            let start = text.len();
            text.push_str(prefix);
            if !self.special_tokens_in_content {
                typed.push(start..text.len());
            }
        }
        let marker = self.vision.as_ref().map(Vision::marker).filter(|m| text.contains(m));
        let reserve = self.vision.as_ref().map_or(0, Vision::reserve_tokens);
        let Ok(tokens) =
            self.tokenize_marked::<Infallible>(&text, &typed, marker, |_, _| Ok(image_token_ids(0, reserve)));
        Ok((Prompt { text, tokens, images: Vec::new(), typed }, plan))
    }

    /// [`Self::prepare_thinking`] with the model's own thinking default, the plan left out.
    pub fn prepare(&self, messages: &[Json], tools: Option<&[Json]>) -> Result<Prompt, TemplateError> {
        Ok(self.prepare_thinking(messages, tools, crate::thinking::Thinking::Default)?.0)
    }

    /// The prompt text, and the byte ranges in it where a client's string spelled a control
    /// token (tokenized as plain text, see `typed_text`).
    /// `thinking`: the template's thinking switch, for a reasoning model.
    fn render(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        thinking: Option<bool>,
    ) -> Result<(String, Vec<Range<usize>>), TemplateError> {
        let template = self.template.as_ref().ok_or(TemplateError::Missing)?.with_thinking(thinking);
        let texts = &self.control_texts;
        let client_spells_control = messages.iter().chain(tools.into_iter().flatten()).any(|v| texts.any_in(v));
        if self.special_tokens_in_content || !client_spells_control {
            return Ok((template.render(messages, tools)?, Vec::new()));
        }
        let mut literals = Vec::new();
        let guarded: Vec<Json> = messages.iter().map(|m| texts.with_sentinels(m, &mut literals)).collect();
        let guarded_tools = tools.map(|t| t.iter().map(|d| texts.with_sentinels(d, &mut literals)).collect::<Vec<_>>());
        let rendered = template.render(&guarded, guarded_tools.as_deref())?;
        let plain = template.render(messages, tools)?;
        // The template must treat a sentinel as it treats the text it stands for (no test on the
        // content, no cut through it); where it does not, the control texts are escaped instead.
        if let Some((text, typed)) = restore(&rendered, &literals).filter(|(text, _)| *text == plain) {
            return Ok((text, typed));
        }
        let escaped: Vec<Json> = messages.iter().map(|m| texts.escaped(m)).collect();
        let escaped_tools = tools.map(|t| t.iter().map(|d| texts.escaped(d)).collect::<Vec<_>>());
        Ok((template.render(&escaped, escaped_tools.as_deref())?, Vec::new()))
    }

    /// Decodes and tokenizes the request's images (fetched after admission) into the prompt
    /// [`Self::prepare`] made, one per marked place, in order. Each is decoded without the
    /// projector's lock ([`DecodedImage`]) and only handed to mtmd under it.
    pub fn attach_images(&self, prompt: &mut Prompt, images: &[ImageInput]) -> Result<(), ImageError> {
        let vision = self.vision.as_ref().ok_or(ImageError::NoVision)?;
        let markers = prompt.text.matches(vision.marker()).count();
        if markers != images.len() {
            return Err(ImageError::Placement { markers, images: images.len() });
        }
        let mut placed = Vec::with_capacity(images.len());
        let tokens = self.tokenize_marked(&prompt.text, &prompt.typed, Some(vision.marker()), |i, start| {
            let decoded = DecodedImage::decode(&images[i])?;
            let (chunks, id) = vision.tokenize(&decoded)?;
            let len = chunks.total_tokens();
            placed.push(PromptImage { start, len, chunks });
            Ok(image_token_ids(id, len))
        })?;
        // The completion starts from the last prompt token's logits: text, always, after the
        // generation prompt of any real template.
        if tokens.last().is_none_or(|&t| t < 0) {
            return Err(ImageError::Placement { markers, images: images.len() });
        }
        prompt.tokens = tokens;
        prompt.images = placed;
        Ok(())
    }

    /// Tokenizes `text` in which `marker` stands for each image; `image(i, start)` gives the ids
    /// of the `i`-th image, which starts at token index `start`. The `typed` ranges are tokenized
    /// as plain text, the rest with special tokens parsed.
    fn tokenize_marked<E>(
        &self,
        text: &str,
        typed: &[Range<usize>],
        marker: Option<&str>,
        mut image: impl FnMut(usize, usize) -> Result<Vec<i32>, E>,
    ) -> Result<Vec<i32>, E> {
        let mut tokens = Vec::new();
        let (mut at, mut images) = (0, 0);
        let ends = typed.iter().cloned().chain(std::iter::once(text.len()..text.len()));
        for literal in ends {
            let template_text = &text[at..literal.start];
            let pieces: Vec<&str> = match marker {
                Some(m) => template_text.split(m).collect(),
                None => vec![template_text],
            };
            for (i, piece) in pieces.into_iter().enumerate() {
                if i > 0 {
                    tokens.extend(image(images, tokens.len())?);
                    images += 1;
                }
                tokens.extend(self.tokenize_piece(piece, at == 0 && i == 0));
            }
            if !literal.is_empty() {
                tokens.extend(self.tokenize_text(&text[literal.clone()]));
            }
            at = literal.end;
        }
        Ok(tokens)
    }

    fn tokenize_piece(&self, text: &str, first: bool) -> Vec<i32> {
        if first {
            return self.tokenize(text);
        }
        self.llama.vocab().tokenize(text.as_bytes(), false, true).into_iter().map(|t| t.0).collect()
    }

    /// Tokenizes `text` as plain text. llama.cpp still reads user-defined tokens (Qwen's
    /// `<tool_call>`) out of text without special parsing, so where one appears the text is
    /// tokenized in halves until none does.
    fn tokenize_text(&self, text: &str) -> Vec<i32> {
        let vocab = self.llama.vocab();
        let tokens = vocab.tokenize(text.as_bytes(), false, false);
        let special = |t: &LlamaToken| vocab.attr(*t).intersects(LlamaTokenAttr::Control | LlamaTokenAttr::UserDefined);
        if text.chars().nth(1).is_none() || !tokens.iter().any(special) {
            return tokens.into_iter().map(|t| t.0).collect();
        }
        let mut half = text.len() / 2;
        while !text.is_char_boundary(half) {
            half += 1;
        }
        let half = if half == text.len() { text.char_indices().last().map_or(0, |(i, _)| i) } else { half };
        let mut out = self.tokenize_text(&text[..half]);
        out.extend(self.tokenize_text(&text[half..]));
        out
    }

    /// Tokenizes prompt text, parsing special tokens; adds BOS only when the vocabulary wants one
    /// and the template did not already write it.
    pub fn tokenize(&self, text: &str) -> Vec<i32> {
        let add_bos = self.add_bos && (self.bos_text.is_empty() || !text.starts_with(&self.bos_text));
        self.llama.vocab().tokenize(text.as_bytes(), add_bos, true).into_iter().map(|t| t.0).collect()
    }

    /// For each of `tokens`, the one token that writes its text without the leading space
    /// (`" Osaka"` → `"Osaka"`), or the token itself where there is none: a value quoted from a
    /// sentence starts after an opening quote, where the tokenizer writes it unspaced.
    pub(crate) fn unspaced(&self, tokens: &[i32]) -> Vec<i32> {
        let mut known = std::collections::HashMap::new();
        tokens.iter().map(|&t| *known.entry(t).or_insert_with(|| self.unspaced_token(t))).collect()
    }

    fn unspaced_token(&self, token: i32) -> i32 {
        if token < 0 {
            return token;
        }
        let piece = self.piece(token);
        let Some(text) = piece.strip_prefix(b" ").filter(|rest| !rest.is_empty()) else { return token };
        match self.llama.vocab().tokenize(text, false, false)[..] {
            [one] => one.0,
            _ => token,
        }
    }

    /// What each token is to JSON layout (see `json_layout`).
    pub(crate) fn json_marks(&self) -> JsonMarks {
        let n_vocab = self.info.n_vocab.max(0) as usize;
        self.json_marks.get_or_init(|| JsonMarks::new(n_vocab, |t| self.piece(t))).clone()
    }

    /// Raw bytes of a token as it appears in generated text (control tokens render empty).
    pub fn piece(&self, token: i32) -> Vec<u8> {
        self.llama.vocab().token_to_piece(LlamaToken(token), false, None)
    }

    /// [`Self::piece`] with control tokens written out (a thinking block's markers).
    pub(crate) fn special_piece(&self, token: i32) -> Vec<u8> {
        self.llama.vocab().token_to_piece(LlamaToken(token), true, None)
    }

    /// Checks that a constraint compiles for this model (an invalid or unsupported schema is the
    /// client's error, reported before the request is queued).
    pub fn check_constraint(&self, constraint: &Constraint) -> Result<(), String> {
        self.compile_constraint(constraint, crate::CacheScope::default()).map(drop)
    }

    /// `constraint` compiled for this model (cached by its source), or why it does not compile.
    pub fn compile_constraint(
        &self,
        constraint: &Constraint,
        scope: crate::CacheScope,
    ) -> Result<crate::constraint::CompiledGrammar, String> {
        self.grammars.compile(&self.llama, constraint, scope)
    }

    /// Builds the grammar engine's view of the vocabulary, compiling no grammar.
    pub fn warm_grammars(&self) {
        self.grammars.warm(&self.llama)
    }

    /// Grammars compiled for this model since it loaded (the grammar cache's misses).
    pub fn grammar_compiles(&self) -> usize {
        self.grammars.compiles()
    }

    /// A matcher enforcing `constraint` on output that already began with `tokens` (none, or a
    /// tool call the model started on its own); fails if those tokens do not fit the grammar.
    pub(crate) fn constraint_matcher(
        &self,
        constraint: &Constraint,
        scope: crate::CacheScope,
        tokens: &[i32],
    ) -> Result<llguidance::Matcher, String> {
        self.grammars.matcher_after(&self.llama, constraint, scope, tokens)
    }

    /// Bit `t` set: token `t`'s text may open a bare or fenced JSON call (`{`, `[` or a
    /// backtick after optional whitespace, or whitespace only).
    pub(crate) fn call_starts(&self) -> Arc<Vec<u32>> {
        let n_vocab = self.info.n_vocab.max(0) as usize;
        let bits = || {
            let mut bits = vec![0u32; n_vocab.div_ceil(32)];
            for t in 0..n_vocab {
                let piece = self.piece(crate::units::token_id(t));
                let text = piece.trim_ascii_start();
                if !piece.is_empty() && (text.is_empty() || matches!(text[0], b'{' | b'[' | b'`')) {
                    bits[t / 32] |= 1 << (t % 32);
                }
            }
            Arc::new(bits)
        };
        self.call_starts.get_or_init(bits).clone()
    }

    /// The `<tool_call>` tag's own token, where the vocabulary has one.
    pub(crate) fn tool_call_tag(&self) -> Option<i32> {
        self.tool_call_tag
    }

    pub fn is_end_of_generation(&self, token: i32) -> bool {
        self.llama.vocab().is_eog(LlamaToken(token))
    }

    /// Every token that ends generation (end of text, end of turn, ...), as llama.cpp's vocabulary
    /// marks them: what `ignore_eos` bans.
    pub(crate) fn end_tokens(&self) -> &[i32] {
        self.end_tokens.get_or_init(|| (0..self.info.n_vocab).filter(|&t| self.is_end_of_generation(t)).collect())
    }
}

impl Drop for LoadedModel {
    /// Runs before the weights are freed (the fields drop after this): copies of them kept under
    /// their addresses must go first (`dot_kernels::k_quant_copies`).
    fn drop(&mut self) {
        dot_kernels::forget_k_quant_copies();
    }
}

/// The texts a client may not spell as tokens: every control (and unknown) token's, and the
/// user-defined tokens the chat template writes or that open a tool call (Qwen's `<tool_call>`).
/// Other user-defined tokens (Gemma's HTML tags and whitespace runs) are ordinary text that
/// llama.cpp, like transformers, reads as those tokens without special parsing too.
fn special_token_texts<'a>(llama: &'a LlamaModel, template: &'a str) -> impl Iterator<Item = String> + 'a {
    let vocab = llama.vocab();
    let control = LlamaTokenAttr::Control | LlamaTokenAttr::Unknown;
    vocab.tokens().filter_map(move |t| {
        let attr = vocab.attr(t);
        let text = vocab.text(t)?.to_str().ok()?;
        let markup = attr.contains(LlamaTokenAttr::UserDefined) && (template.contains(text) || text == "<tool_call>");
        (attr.intersects(control) || markup).then(|| text.to_owned())
    })
}
