//! Prompts no chat template renders: `/v1/completions`' text or token prompts, and
//! fill-in-the-middle prompts built from the vocabulary's FIM tokens in llama.cpp's order
//! (`format_prompt_infill`): the other files of the repository, then prefix, suffix, middle.

use llama_cpp_2::token::LlamaToken;

use super::LoadedModel;
use crate::request::Prompt;

/// The client's prompt, as text or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptSource {
    Text(String),
    Tokens(Vec<i32>),
}

/// A prompt to complete as it is: no template. With `fim`, it is the code before the cursor,
/// and the model fills the middle between it and `fim.suffix`.
#[derive(Debug, Clone, PartialEq)]
pub struct RawPrompt {
    pub prompt: PromptSource,
    pub fim: Option<Fim>,
}

/// Fill-in-the-middle's other parts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fim {
    /// The code after the cursor.
    pub suffix: String,
    /// Other files for context (llama.cpp's `input_extra`), oldest first.
    pub files: Vec<FimFile>,
    /// llama.cpp's `/infill`: a prefix and suffix too long for the context are cut to fit (see
    /// [`cut_to_fit`]), as llama-server cuts them, where `/v1/completions` refuses them.
    pub cut_to_fit: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FimFile {
    pub filename: String,
    pub text: String,
}

/// Why a raw prompt cannot be built: the client's to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RawPromptError {
    #[error("This model's vocabulary has no fill-in-the-middle tokens (its GGUF declares no tokenizer.ggml.fim_pre/suf/mid token), so it cannot complete between a prefix and a suffix. Send no suffix, or use a code model with FIM tokens (such as qwen2.5-coder).")]
    NoFim,
    #[error("Invalid token id {token} in the prompt: outside the model's vocabulary (0..{n_vocab}).")]
    TokenOutOfVocabulary { token: i32, n_vocab: i32 },
    #[error("The prompt is empty: it tokenizes to no tokens, and a completion needs at least one to start from.")]
    Empty,
}

/// The vocabulary's FIM tokens: the three a FIM prompt needs, and the repository-level pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FimTokens {
    pub pre: i32,
    pub suf: i32,
    pub mid: i32,
    /// Opens the repository's name (`<|repo_name|>`).
    pub rep: Option<i32>,
    /// Opens a file (`<|file_sep|>`).
    pub sep: Option<i32>,
}

/// llama.cpp's "no token" id.
const NULL_TOKEN: i32 = -1;

impl FimTokens {
    /// The tokens as llama.cpp reads them from the GGUF; `None` without all three of pre, suf, mid.
    /// The vocabulary's, as llama.cpp found them (declared, or known by their text).
    pub(crate) fn of(llama: &llama_cpp_2::model::LlamaModel) -> Option<Self> {
        let v = llama.vocab();
        Self::from_ids(v.fim_pre().0, v.fim_suf().0, v.fim_mid().0, v.fim_rep().0, v.fim_sep().0)
    }

    pub(crate) fn from_ids(pre: i32, suf: i32, mid: i32, rep: i32, sep: i32) -> Option<Self> {
        let some = |t: i32| (t != NULL_TOKEN).then_some(t);
        Some(Self { pre: some(pre)?, suf: some(suf)?, mid: some(mid)?, rep: some(rep), sep: some(sep) })
    }
}

/// The parts of a FIM prompt as token runs, in the order they are decoded: the other files
/// (under the repository marker, each after a file separator, then the current file's
/// separator), BOS where the vocabulary wants one, then prefix, suffix and middle markers each
/// before its part (PSM order, as llama.cpp's server builds it without `--spm-infill`).
/// Unlike llama.cpp's, a request without other files gets no repository header: on
/// qwen2.5-coder-0.5b the header alone took the FIM pass rate (`test_fim_pass_rate.py`) from
/// 4/6 to 3/6, the model answering with test code instead of the body.
pub(crate) struct FimParts<'a> {
    pub tokens: FimTokens,
    pub bos: Option<i32>,
    pub files: Vec<(Vec<i32>, Vec<i32>)>,
    pub repo_name: &'a [i32],
    pub current_file: &'a [i32],
    /// Separates files where the vocabulary has no file separator.
    pub chunk_separator: &'a [i32],
    pub prefix: Vec<i32>,
    pub suffix: Vec<i32>,
}

impl FimParts<'_> {
    pub(crate) fn assemble(self) -> Vec<i32> {
        let t = self.tokens;
        let mut out = Vec::new();
        if !self.files.is_empty() {
            if let Some(rep) = t.rep {
                out.push(rep);
                out.extend_from_slice(self.repo_name);
            }
            for (name, text) in &self.files {
                match t.sep {
                    Some(sep) => {
                        out.push(sep);
                        out.extend_from_slice(name);
                    }
                    None => out.extend_from_slice(self.chunk_separator),
                }
                out.extend_from_slice(text);
            }
            if let Some(sep) = t.sep {
                out.push(sep);
                out.extend_from_slice(self.current_file);
            }
        }
        out.extend(self.bos);
        out.push(t.pre);
        out.extend(self.prefix);
        out.push(t.suf);
        out.extend(self.suffix);
        out.push(t.mid);
        out
    }
}

impl LoadedModel {
    /// The vocabulary's FIM tokens, or `None` for a model that has none.
    pub(crate) fn fim_tokens(&self) -> Option<FimTokens> {
        FimTokens::of(&self.llama)
    }

    /// Whether the model can fill in the middle.
    pub fn supports_fim(&self) -> bool {
        self.fim_tokens().is_some()
    }

    /// The prompt exactly as it will be decoded. A text prompt is tokenized as llama-server and
    /// vLLM tokenize completions' prompts: BOS where the vocabulary wants one, control tokens
    /// parsed (a raw prompt is the model's input format, written by the client). A FIM prompt's
    /// code is plain text: code that spells `<|fim_middle|>` stays text.
    /// `room`: the most tokens the prompt may take; a FIM prompt's other files are left out,
    /// oldest first, until it fits (llama.cpp's server cuts them too), and its prefix and suffix
    /// are cut only with `cut_to_fit`.
    pub fn prepare_raw(&self, raw: &RawPrompt, room: usize) -> Result<Prompt, RawPromptError> {
        let n_vocab = self.info.n_vocab;
        if let PromptSource::Tokens(tokens) = &raw.prompt {
            if let Some(&token) = tokens.iter().find(|&&t| t < 0 || t >= n_vocab) {
                return Err(RawPromptError::TokenOutOfVocabulary { token, n_vocab });
            }
        }
        let tokens = match &raw.fim {
            None => match &raw.prompt {
                PromptSource::Text(text) => self.tokenize(text),
                PromptSource::Tokens(tokens) => tokens.clone(),
            },
            Some(fim) => self.fim_prompt(&raw.prompt, fim, room)?,
        };
        if tokens.is_empty() {
            return Err(RawPromptError::Empty);
        }
        let text = match (&raw.prompt, &raw.fim) {
            (PromptSource::Text(text), None) => text.clone(),
            _ => self.detokenize(&tokens, true),
        };
        Ok(Prompt { text, tokens, images: Vec::new(), typed: Vec::new() })
    }

    fn fim_prompt(&self, prefix: &PromptSource, fim: &Fim, room: usize) -> Result<Vec<i32>, RawPromptError> {
        let tokens = self.fim_tokens().ok_or(RawPromptError::NoFim)?;
        let prefix = match prefix {
            PromptSource::Text(text) => self.tokenize_text(text),
            PromptSource::Tokens(tokens) => tokens.clone(),
        };
        let suffix = self.tokenize_text(&fim.suffix);
        // The three FIM markers and BOS.
        let (prefix, suffix) =
            if fim.cut_to_fit { cut_to_fit(prefix, suffix, room.saturating_sub(4)) } else { (prefix, suffix) };
        let (repo_name, current_file) = (self.tokenize_text("myproject\n"), self.tokenize_text("filename\n"));
        let chunk_separator = self.tokenize_text("\n\n--- snippet ---\n\n");
        // The newest files are kept first: they are the ones a client sent last.
        let mut used = prefix.len() + suffix.len() + 5 + repo_name.len() + current_file.len();
        let mut files = Vec::new();
        for f in fim.files.iter().rev() {
            let file = (self.tokenize_text(&format!("{}\n", f.filename)), self.tokenize_text(&f.text));
            used += file.0.len().max(chunk_separator.len()) + file.1.len() + 1;
            if used > room {
                break;
            }
            files.push(file);
        }
        files.reverse();
        let bos = self.llama.vocab().bos().0;
        Ok(FimParts {
            tokens,
            bos: (self.add_bos && bos != NULL_TOKEN).then_some(bos),
            files,
            repo_name: &repo_name,
            current_file: &current_file,
            chunk_separator: &chunk_separator,
            prefix,
            suffix,
        }
        .assemble())
    }

    /// Plain tokenization for `/tokenize`: `add_special` adds BOS where the vocabulary wants
    /// one, `parse_special` reads control tokens' texts as those tokens.
    pub fn tokenize_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        let add_bos = add_special && self.add_bos;
        self.llama.vocab().tokenize(text.as_bytes(), add_bos, parse_special).into_iter().map(|t| t.0).collect()
    }

    /// The text of `tokens`, bytes joined before decoding (a character split across tokens is
    /// whole); `special`: control tokens written out.
    pub fn detokenize(&self, tokens: &[i32], special: bool) -> String {
        let vocab = self.llama.vocab();
        let mut bytes = Vec::new();
        for &t in tokens.iter().filter(|&&t| t >= 0 && t < self.info.n_vocab) {
            bytes.extend(vocab.token_to_piece(LlamaToken(t), special, None));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// A prefix and suffix cut to `room` tokens together where they are longer: the prefix keeps
/// its end (the code just before the cursor) and the suffix its start. The suffix keeps at least
/// a quarter of `room` where it has that much, as llama-server's `format_prompt_infill` gives the
/// prefix three quarters of a batch and the suffix one; whatever one part leaves, the other may
/// use. Room too small for anything leaves both empty.
pub(crate) fn cut_to_fit(mut prefix: Vec<i32>, mut suffix: Vec<i32>, room: usize) -> (Vec<i32>, Vec<i32>) {
    if prefix.len() + suffix.len() <= room {
        return (prefix, suffix);
    }
    let suffix_take = suffix.len().min((room / 4).max(room.saturating_sub(prefix.len())));
    let prefix_take = prefix.len().min(room - suffix_take);
    prefix.drain(..prefix.len() - prefix_take);
    suffix.truncate(suffix_take);
    (prefix, suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prefix_keeps_its_end_and_a_long_suffix_its_start() {
        let (prefix, suffix): (Vec<i32>, Vec<i32>) = ((0..100).collect(), (100..200).collect());
        // Both fit: nothing is cut.
        assert_eq!(cut_to_fit(prefix.clone(), suffix.clone(), 200), (prefix.clone(), suffix.clone()));
        // Both long: three quarters for the prefix's end, a quarter for the suffix's start.
        let (p, s) = cut_to_fit(prefix.clone(), suffix.clone(), 40);
        assert_eq!((p, s), ((70..100).collect(), (100..110).collect()));
        // A short suffix leaves the rest to the prefix, and a short prefix to the suffix.
        let (p, s) = cut_to_fit(prefix.clone(), vec![7, 8], 40);
        assert_eq!((p, s), ((62..100).collect(), vec![7, 8]));
        let (p, s) = cut_to_fit(vec![1, 2, 3], suffix, 40);
        assert_eq!((p, s), (vec![1, 2, 3], (100..137).collect()));
        assert_eq!(cut_to_fit(prefix, vec![5], 0), (Vec::new(), Vec::new()));
    }

    const QWEN: FimTokens = FimTokens { pre: 1, suf: 2, mid: 3, rep: Some(4), sep: Some(5) };

    fn parts(tokens: FimTokens, files: Vec<(Vec<i32>, Vec<i32>)>) -> FimParts<'static> {
        FimParts {
            tokens,
            bos: None,
            files,
            repo_name: &[40],
            current_file: &[50],
            chunk_separator: &[60],
            prefix: vec![10, 11],
            suffix: vec![20],
        }
    }

    #[test]
    fn prefix_suffix_middle_in_that_order() {
        assert_eq!(parts(QWEN, vec![]).assemble(), vec![1, 10, 11, 2, 20, 3]);
        let with_bos = FimParts { bos: Some(99), ..parts(QWEN, vec![]) };
        assert_eq!(with_bos.assemble(), vec![99, 1, 10, 11, 2, 20, 3]);
    }

    #[test]
    fn other_files_come_first_under_the_repository_marker() {
        let got = parts(QWEN, vec![(vec![70], vec![71, 72]), (vec![80], vec![81])]).assemble();
        assert_eq!(got, vec![4, 40, 5, 70, 71, 72, 5, 80, 81, 5, 50, 1, 10, 11, 2, 20, 3]);
        // Without repository tokens (CodeLlama's vocabulary) files are separated by text.
        let plain = FimTokens { rep: None, sep: None, ..QWEN };
        assert_eq!(parts(plain, vec![(vec![70], vec![71])]).assemble(), vec![60, 71, 1, 10, 11, 2, 20, 3]);
    }

    #[test]
    fn fim_needs_its_three_tokens() {
        assert_eq!(FimTokens::from_ids(1, 2, 3, -1, -1), Some(FimTokens { rep: None, sep: None, ..QWEN }));
        assert_eq!(FimTokens::from_ids(1, -1, 3, 4, 5), None);
        assert_eq!(FimTokens::from_ids(-1, 2, 3, 4, 5), None);
    }
}
