//! The endpoints a batch may name, in one list: each one's path, what its lines are checked
//! with when the batch is made (`validate.rs`), and the handler the runner sends them through
//! (`runner.rs`), so that a batch can name exactly the routes that run its lines.

use axum::routing::{post, MethodRouter};
use gantry_api::ApiError;

use crate::pipeline;
use crate::state::AppState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    ChatCompletions,
    Responses,
    Completions,
    Embeddings,
}

impl Endpoint {
    /// Every endpoint a batch may name, in the order the API's error lists them.
    pub(super) const ALL: [Endpoint; 4] =
        [Endpoint::ChatCompletions, Endpoint::Responses, Endpoint::Completions, Endpoint::Embeddings];

    pub(super) fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }

    pub(super) fn from_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.path() == path)
    }

    /// Whether it answers vectors rather than generated text: its model must embed, and its
    /// answer is never streamed.
    pub(super) fn embeds(self) -> bool {
        self == Endpoint::Embeddings
    }

    /// Whether a model that can do `capabilities` serves it.
    pub(super) fn served_by(self, capabilities: &gantry_engine::Capabilities) -> bool {
        if self.embeds() {
            capabilities.embeds()
        } else {
            capabilities.generates()
        }
    }

    /// The model a line's body names, once the endpoint's own parse accepts it.
    pub(super) fn parsed_model(self, body: &[u8]) -> Result<String, ApiError> {
        let model = match self {
            Endpoint::ChatCompletions => gantry_api::parse_chat_request(body)?.model,
            Endpoint::Responses => gantry_api::responses::parse_responses_request(body)?.chat.model,
            Endpoint::Completions => gantry_api::completions::parse_completion_request(body)?.chat.model,
            Endpoint::Embeddings => gantry_api::embeddings::parse_embedding_request(body)?.model,
        };
        if model.is_empty() {
            return Err(ApiError::invalid_value("model", "Each line's body must name a 'model'."));
        }
        Ok(model)
    }

    /// The handler of its route, as the key-authenticated router serves it.
    pub(super) fn handler(self) -> MethodRouter<AppState> {
        match self {
            Endpoint::ChatCompletions => post(pipeline::chat_completions),
            Endpoint::Responses => post(pipeline::responses),
            Endpoint::Completions => post(pipeline::completions),
            Endpoint::Embeddings => post(crate::openai::embeddings::embeddings),
        }
    }
}
