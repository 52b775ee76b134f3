//! What the HTTP layer needs from an engine, as a trait: the real [`crate::Engine`] implements
//! it, and the server's router tests drive the same handlers with a scripted one.

use crate::model::ModelInfo;
use crate::prepare::{ChatInput, PrepareError};
use crate::request::{GenerateRequest, GenerationHandle};

/// Why an admitted request failed inside the engine: never the client's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("The model failed to decode: {0}")]
    Decode(String),
    #[error("The server is shutting down; the request was cut.")]
    ShuttingDown,
    /// The scheduler thread panicked; the server stops so its supervisor restarts it.
    #[error("The inference engine failed ({0}); the server is restarting. Please retry.")]
    Crashed(String),
    /// Processing this one request panicked (a bug); it was ended and its sequences cleared,
    /// while every other request went on.
    #[error("The engine failed while generating this request ({0}); other requests were not affected. Please retry.")]
    RequestFailed(String),
    /// A request `prepare` should have refused reached the scheduler anyway.
    #[error("The engine could not run this request: {0}")]
    Rejected(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the engine has stopped")]
    Stopped,
    #[error("{0} requests are already waiting; try again shortly")]
    QueueFull(usize),
    #[error("the inference engine failed ({0})")]
    Failed(String),
}

/// Whether the engine can take work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// The scheduler died; every request it held was answered with an error.
    Failed(String),
}

/// Engine submission as the server sees it.
pub trait Generator: Send + Sync {
    fn model_info(&self) -> &ModelInfo;

    /// Checks and tokenizes a request (see [`crate::prepare`]). Blocking: renders the template
    /// and compiles grammars, so call it off the async runtime.
    fn prepare(&self, input: ChatInput) -> Result<GenerateRequest, PrepareError>;

    /// Puts the request's images, fetched after admission, into its prompt: decodes them,
    /// tokenizes them for the model's projector and checks the context again, now exactly.
    /// Blocking (image decoding), so call it off the async runtime.
    fn attach_images(
        &self,
        request: &mut GenerateRequest,
        images: Vec<crate::vision::ImageInput>,
    ) -> Result<(), PrepareError> {
        let _ = (request, images);
        Err(PrepareError::Image(crate::vision::ImageError::NoVision))
    }

    /// Queues a prepared request. Events stream on the handle; dropping it cancels the request.
    fn submit(&self, request: GenerateRequest) -> Result<GenerationHandle, SubmitError>;

    fn health(&self) -> Health;
}
