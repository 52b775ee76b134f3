//! OpenAI Chat Completions wire types, request validation, the one API error type, and the
//! typed deltas of a streamed answer that every dialect renders; the other dialects
//! (`anthropic`, `responses`, `completions` with llama.cpp's `/infill`) as translations onto
//! them, and `embeddings`' and `rerank`'s requests and answers. No I/O.

pub mod anthropic;
mod chat_answer;
mod chat_delta;
mod chunks;
pub mod completions;
pub mod embeddings;
mod error;
mod fields;
mod image;
mod request;
pub mod rerank;
mod response;
pub mod responses;
mod service_tier;
mod tools;
mod validate;

pub use chat_answer::ChatAnswer;
pub use chat_delta::{ChatDelta, FinishReason};
pub use chunks::{ChunkEncoder, ChunkFrame};
pub use error::ApiError;
pub use image::{parse_image_url, sniff_image_mime, ImageRef};
pub use request::{ChatMessage, ImageDetail, ImagePart, ReasoningEffort, Role, ValidatedChat};
pub use response::{
    ChatCompletionChunk, ChatCompletionResponse, Choice, ChoiceLogprobs, ChunkChoice, CompletionTokensDetails, Delta,
    ModelList, ModelObject, PromptTokensDetails, ResponseMessage, TokenLogprob, ToolCall, TopLogprob, Usage,
};
pub use service_tier::ServiceTier;
pub use tools::{tool_choice_not_offered, ResponseFormat, Tool, ToolChoice};
pub use validate::parse_chat_request;
