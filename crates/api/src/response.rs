//! Response wire types (serialise only).

use serde::ser::{SerializeStruct, Serializer};
use serde::Serialize;
use serde_json::Value;

use crate::FinishReason;

/// `object: "chat.completion"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// The tier the request ran in (`ServiceTier::as_str`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<&'static str>,
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: ResponseMessage,
    /// `null` when logprobs were not requested.
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: FinishReason,
}

/// Serialises as `{"role", "content" (null when None), "tool_calls"? , "refusal": null}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMessage {
    pub role: &'static str,
    pub content: Option<String>,
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A reasoning model's thinking, sent as both `reasoning_content` (DeepSeek's, llama-server's
    /// and vLLM's older name) and `reasoning` (vLLM's and OpenRouter's newer one).
    pub reasoning: Option<String>,
}

impl Serialize for ResponseMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("ResponseMessage", 4)?;
        st.serialize_field("role", self.role)?;
        st.serialize_field("content", &self.content)?;
        if let Some(reasoning) = &self.reasoning {
            st.serialize_field("reasoning_content", reasoning)?;
            st.serialize_field("reasoning", reasoning)?;
        }
        if let Some(calls) = &self.tool_calls {
            st.serialize_field("tool_calls", calls)?;
        }
        st.serialize_field("refusal", &Option::<String>::None)?;
        st.end()
    }
}

/// A tool call the answer made. Serialises as OpenAI's `tool_calls` entry:
/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON object text (what a call cut by `max_tokens` wrote so far).
    pub arguments: String,
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            arguments: &'a str,
        }
        let mut st = s.serialize_struct("ToolCall", 3)?;
        st.serialize_field("id", &self.id)?;
        st.serialize_field("type", "function")?;
        st.serialize_field("function", &Function { name: &self.name, arguments: &self.arguments })?;
        st.end()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

/// Of the completion tokens, those spent thinking (billed as completion tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: u32,
}

/// Serialises as `{"content": [...], "refusal": null}`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

impl Serialize for ChoiceLogprobs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("ChoiceLogprobs", 2)?;
        st.serialize_field("content", &self.content)?;
        st.serialize_field("refusal", &Option::<Vec<TokenLogprob>>::None)?;
        st.end()
    }
}

/// `bytes` serialises as a JSON array of integers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `object: "chat.completion.chunk"`. `usage` is omitted when `None` (the server adds
/// `"usage": null` itself when `include_usage` was requested).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<&'static str>,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    /// `null` when absent.
    pub logprobs: Option<ChoiceLogprobs>,
    /// `null` until the choice finishes.
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// Thinking text, under both of its names (see [`ResponseMessage::reasoning`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// `object: "model"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: String,
    /// Gantry's: what the model serves (`chat`, `completions`, `fill_in_the_middle`, `vision`,
    /// `embeddings`, `rerank`), so a client picks a model for a route without trying it.
    pub capabilities: Vec<&'static str>,
}

/// `object: "list"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

/// A one-choice chat answer for the other dialects' tests: 10 prompt tokens (6 cached), 4
/// completion tokens.
#[cfg(test)]
pub(crate) fn one_choice_for_tests(
    content: Option<&str>,
    calls: Option<Vec<ToolCall>>,
    finish: FinishReason,
) -> ChatCompletionResponse {
    ChatCompletionResponse {
        id: "chatcmpl-1".into(),
        object: "chat.completion",
        created: 1,
        model: "m".into(),
        system_fingerprint: None,
        service_tier: None,
        choices: vec![Choice {
            index: 0,
            message: ResponseMessage {
                role: "assistant",
                content: content.map(str::to_owned),
                tool_calls: calls,
                reasoning: None,
            },
            logprobs: None,
            finish_reason: finish,
        }],
        usage: Usage {
            prompt_tokens: 10,
            completion_tokens: 4,
            total_tokens: 14,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: 6 }),
            completion_tokens_details: Some(CompletionTokensDetails { reasoning_tokens: 0 }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn completion_serialises_openai_shape() {
        let r = ChatCompletionResponse {
            id: "chatcmpl-1".into(),
            object: "chat.completion",
            created: 5,
            model: "m".into(),
            system_fingerprint: None,
            service_tier: None,
            choices: vec![Choice {
                index: 0,
                message: ResponseMessage { role: "assistant", content: None, tool_calls: None, reasoning: None },
                logprobs: None,
                finish_reason: FinishReason::Stop,
            }],
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
                total_tokens: 3,
                prompt_tokens_details: None,
                completion_tokens_details: None,
            },
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "m",
                "choices": [{"index": 0,
                    "message": {"role": "assistant", "content": null, "refusal": null},
                    "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
            })
        );
    }

    #[test]
    fn logprobs_and_details_serialise() {
        let lp = ChoiceLogprobs {
            content: vec![TokenLogprob {
                token: "hi".into(),
                logprob: -0.5,
                bytes: vec![104, 105],
                top_logprobs: vec![TopLogprob { token: "hi".into(), logprob: -0.5, bytes: vec![104, 105] }],
            }],
        };
        let v = serde_json::to_value(&lp).unwrap();
        assert_eq!(v["refusal"], Value::Null);
        assert_eq!(v["content"][0]["bytes"], json!([104, 105]));
        assert_eq!(v["content"][0]["top_logprobs"][0]["logprob"], json!(-0.5));
        let u = Usage {
            prompt_tokens: 4,
            completion_tokens: 0,
            total_tokens: 4,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: 2 }),
            completion_tokens_details: Some(CompletionTokensDetails { reasoning_tokens: 3 }),
        };
        let v = serde_json::to_value(u).unwrap();
        assert_eq!(v["prompt_tokens_details"], json!({"cached_tokens": 2}));
        assert_eq!(v["completion_tokens_details"], json!({"reasoning_tokens": 3}));
        let m = ResponseMessage {
            role: "assistant",
            content: Some("x".into()),
            tool_calls: Some(vec![ToolCall { id: "call_1".into(), name: "f".into(), arguments: "{}".into() }]),
            reasoning: None,
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(
            v["tool_calls"],
            json!([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
        );
        assert!(v.get("reasoning").is_none() && v.get("reasoning_content").is_none(), "{v}");
        let m = ResponseMessage { reasoning: Some("Hmm.".into()), ..m };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!((&v["reasoning_content"], &v["reasoning"]), (&json!("Hmm."), &json!("Hmm.")));
    }

    #[test]
    fn chunk_skips_absent_fields_but_keeps_nulls() {
        let c = ChatCompletionChunk {
            id: "c".into(),
            object: "chat.completion.chunk",
            created: 1,
            model: "m".into(),
            system_fingerprint: Some("fp".into()),
            service_tier: None,
            choices: vec![ChunkChoice {
                index: 0,
                delta: Delta { role: Some("assistant"), ..Delta::default() },
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        };
        let v = serde_json::to_value(&c).unwrap();
        assert!(v.get("usage").is_none());
        assert_eq!(v["system_fingerprint"], "fp");
        assert_eq!(v["choices"][0]["delta"], json!({"role": "assistant"}));
        assert_eq!(v["choices"][0]["finish_reason"], Value::Null);
        assert!(v["choices"][0].as_object().unwrap().contains_key("logprobs"));
    }

    #[test]
    fn models_serialise() {
        let l = ModelList {
            object: "list",
            data: vec![ModelObject {
                id: "m".into(),
                object: "model",
                created: 9,
                owned_by: "gantry".into(),
                capabilities: vec!["chat"],
            }],
        };
        assert_eq!(
            serde_json::to_value(&l).unwrap(),
            json!({"object": "list", "data": [{"id": "m", "object": "model", "created": 9, "owned_by": "gantry", "capabilities": ["chat"]}]})
        );
    }
}
