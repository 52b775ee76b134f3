//! What the HTTP layer needs from an engine, as a trait: the real [`crate::Engine`] implements
//! it, and the server's router tests drive the same handlers with a scripted one.

use tokio::sync::oneshot;

use crate::embedder::{EmbedError, EmbeddingShape, Embeddings};
use crate::error::SubmitError;
use crate::model::raw_prompt::RawPrompt;
use crate::model::ModelInfo;
use crate::prepare::{ChatInput, PrepareError};
use crate::request::{GenerateRequest, GenerationHandle};

/// Whether the engine can take work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// The scheduler died; every request it held was answered with an error.
    Failed(String),
}

/// An engine as the server sees it: requests go in through `prepare` and `submit`; the rest is
/// for health, unloading and shutdown. The real [`crate::Engine`] implements it, and the
/// server's tests drive the same code with scripted ones.
pub trait Generator: Send + Sync {
    fn model_info(&self) -> &ModelInfo;

    /// Checks and tokenizes a request (see [`crate::prepare`]). Blocking: renders the template
    /// and compiles grammars, so call it off the async runtime.
    fn prepare(&self, input: ChatInput) -> Result<GenerateRequest, PrepareError>;

    /// [`Self::prepare`] for a prompt no template renders (`/v1/completions`, `/infill`): `raw`
    /// is the prompt, `input` the rest of the request (its `messages` unused). Blocking.
    fn prepare_raw(&self, input: ChatInput, raw: RawPrompt) -> Result<GenerateRequest, PrepareError>;

    /// `text` as the model's token ids (`/tokenize`): `add_special` adds BOS where the
    /// vocabulary wants one, `parse_special` reads control tokens' texts as those tokens.
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        let _ = (text, add_special, parse_special);
        Vec::new()
    }

    /// The text of token ids (`/detokenize`, a token prompt's `echo`), control tokens written
    /// out; ids outside the vocabulary write nothing.
    fn detokenize(&self, tokens: &[i32]) -> String {
        let _ = tokens;
        String::new()
    }

    /// Puts the request's images, fetched after admission, into its prompt: decodes them,
    /// tokenizes them for the model's projector and checks the context again, now exactly.
    /// Blocking (image decoding), so call it off the async runtime.
    fn attach_images(
        &self,
        request: &mut GenerateRequest,
        images: Vec<crate::model::vision::ImageInput>,
    ) -> Result<(), PrepareError> {
        let _ = (request, images);
        Err(PrepareError::Image(crate::model::vision::ImageError::NoVision))
    }

    /// Queues a prepared request. Events stream on the handle; dropping it cancels the request.
    fn submit(&self, request: GenerateRequest) -> Result<GenerationHandle, SubmitError>;

    /// Queues every request or none (the jobs of one completion's several prompts). This
    /// default, for scripted engines, submits them one by one.
    fn submit_all(&self, requests: Vec<GenerateRequest>) -> Result<Vec<GenerationHandle>, SubmitError> {
        requests.into_iter().map(|r| self.submit(r)).collect()
    }

    fn health(&self) -> Health;

    /// Its health as it changes, for engines that can fail (the server stops serving a model
    /// whose engine turns `Failed`); `None` for one that cannot.
    fn watch_health(&self) -> Option<tokio::sync::watch::Receiver<Health>> {
        None
    }

    /// What it embeds, for an embedding model ([`crate::Embedder`]); `None` for one that
    /// generates.
    fn embedding_shape(&self) -> Option<EmbeddingShape> {
        None
    }

    /// Embeds `inputs` (token ids, the model's special tokens included) for `owner` (batches are
    /// shared fairly between tenants, then keys): one unit vector per input on the receiver.
    fn embed(
        &self,
        owner: crate::request::Owner,
        inputs: Vec<Vec<i32>>,
    ) -> oneshot::Receiver<Result<Embeddings, EmbedError>> {
        let _ = (owner, inputs);
        let (reply, answer) = oneshot::channel();
        let model = self.model_info().path.display().to_string();
        let _ = reply.send(Err(EmbedError::NotEmbeddingModel { model }));
        answer
    }

    /// A reranker's input for one (query, document) pair, to [`Self::embed`] (which then gives
    /// the pair's relevance logit); `None` for a model that does not rank.
    fn ranking_input(&self, query: &str, document: &str) -> Option<Vec<i32>> {
        let _ = (query, document);
        None
    }

    /// Cuts every running request (shutdown's grace period ran out).
    fn abort_all(&self) {}

    /// Finishes what it has and stops. Blocking.
    fn shutdown(&self) {}
}
