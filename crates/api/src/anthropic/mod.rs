//! Anthropic's Messages API as a translation onto Chat Completions: a Messages request becomes
//! the [`ValidatedChat`](crate::ValidatedChat) it means, and the chat answer (collected or
//! streamed) becomes a Messages answer. No I/O; the server runs the one chat path in between.

mod error;
mod options;
mod request;
mod response;
mod stream;

pub use error::{error_body, error_type};
pub use request::{in_messages_terms, parse_messages_request};
pub use response::{message_from_chat, stop_reason, usage_json};
pub use stream::{MessageStream, StreamEvent};
