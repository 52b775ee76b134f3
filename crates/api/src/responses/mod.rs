//! OpenAI's Responses API as a translation onto Chat Completions: a `POST /v1/responses`
//! request becomes the [`ValidatedChat`](crate::ValidatedChat) it means, and the chat answer
//! (collected or streamed) becomes a Response object or its semantic events. No I/O; the server
//! runs the one chat path in between.

mod items;
mod kept;
mod request;
mod response;
mod stream;

pub use items::{input_items_page, items_query, ItemsQuery};
pub use request::{in_responses_terms, parse_responses_request, turn_items, ResponsesRequest};
pub use response::{response_from_chat, ResponseIds};
pub use stream::{ResponseEvent, ResponseStream};
