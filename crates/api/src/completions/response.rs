//! The `text_completion` object, collected or as stream chunks, and the legacy `logprobs` shape
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

use serde::Serialize;
use serde_json::Map;

use crate::{TokenLogprob, Usage};

/// `object: "text_completion"`: a whole answer, or one stream chunk (whose `usage` is left out
/// but on the last chunk of a stream with `include_usage`, which has no choices).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<LegacyLogprobs>,
    /// `stop` or `length`; `null` on a stream's chunks before the choice's last.
    pub finish_reason: Option<&'static str>,
}

/// Completions' logprobs: one entry per token in each list. `text_offset` is where the token's
/// text starts in the choice's `text` (in characters, as OpenAI counts them), counted on
/// across a stream's chunks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LegacyLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Map<String, serde_json::Value>>,
    pub text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// The entries of `tokens`, the first starting at character `offset` of the choice's text;
    /// returns them and the offset after the last.
    pub fn from_tokens(tokens: &[TokenLogprob], mut offset: usize) -> (Self, usize) {
        let mut out = Self::default();
        for t in tokens {
            out.tokens.push(t.token.clone());
            out.token_logprobs.push(Some(t.logprob));
            out.top_logprobs.push(t.top_logprobs.iter().map(|a| (a.token.clone(), a.logprob.into())).collect());
            out.text_offset.push(offset);
            offset += t.token.chars().count();
        }
        (out, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TopLogprob;

    fn token(text: &str, logprob: f32, top: &[(&str, f32)]) -> TokenLogprob {
        TokenLogprob {
            token: text.into(),
            logprob,
            bytes: text.as_bytes().to_vec(),
            top_logprobs: top
                .iter()
                .map(|(t, l)| TopLogprob { token: (*t).into(), logprob: *l, bytes: t.as_bytes().to_vec() })
                .collect(),
        }
    }

    #[test]
    fn legacy_logprobs_list_each_token_with_its_offset() {
        let tokens = [token(" héllo", -0.5, &[(" héllo", -0.5), (" hi", -1.5)]), token("!", -0.25, &[])];
        let (lp, next) = LegacyLogprobs::from_tokens(&tokens, 3);
        assert_eq!(lp.tokens, vec![" héllo", "!"]);
        assert_eq!(lp.token_logprobs, vec![Some(-0.5), Some(-0.25)]);
        // Characters, not bytes: "é" is one.
        assert_eq!(lp.text_offset, vec![3, 9]);
        assert_eq!(next, 10);
        let json = serde_json::to_value(&lp).unwrap();
        assert_eq!(json["top_logprobs"][0], serde_json::json!({" héllo": -0.5, " hi": -1.5}));
        assert_eq!(json["top_logprobs"][1], serde_json::json!({}));
    }
}
