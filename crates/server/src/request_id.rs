//! Every request gets a server-generated id (a UUID): the suffix of the completion id and the
//! key of its reservation and usage record. A sane `x-request-id` sent by the client is kept
//! apart ([`ClientRequestId`]), stored beside the usage record and echoed back in the
//! response's `x-request-id`; clients reuse ids (retries, constants), so it is never a key.
//! Without one, the response's `x-request-id` is the server's id.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

pub(crate) const HEADER: &str = "x-request-id";

/// The server's id of this request, unique.
#[derive(Clone, Debug)]
pub(crate) struct RequestId(pub String);

/// The client's own `x-request-id`, when it sent a sane one (≤ 128 of `A-Za-z0-9-_.`).
#[derive(Clone, Debug)]
pub(crate) struct ClientRequestId(pub Option<String>);

pub(crate) async fn assign(mut req: Request, next: Next) -> Response {
    let client = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .map(str::to_owned);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let echoed = client.clone().unwrap_or_else(|| id.clone());
    // Anthropic's SDK reads its request ids (`_request_id`, on errors too) from `request-id`.
    let anthropic = req.uri().path().starts_with("/v1/messages").then(|| format!("req_{id}"));
    req.extensions_mut().insert(RequestId(id));
    req.extensions_mut().insert(ClientRequestId(client));
    let mut response = next.run(req).await;
    if let Ok(value) = HeaderValue::from_str(&echoed) {
        response.headers_mut().insert(HEADER, value);
    }
    if let Some(value) = anthropic.and_then(|id| HeaderValue::from_str(&id).ok()) {
        response.headers_mut().insert("request-id", value);
    }
    response
}
