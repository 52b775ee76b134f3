//! Key authentication: `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`. Runs
//! before the body is read or validated, as OpenAI and Anthropic do.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::errors::{IntoApiError, KeyRefusal};
use crate::openai::auth_failures::AuthFailures;
use crate::state::AppState;

/// What [`require_api_key`] needs: the accounts behind the app state and the per-address
/// budget of failed authentications.
#[derive(Clone)]
pub(crate) struct KeyAuth {
    pub state: AppState,
    pub failures: AuthFailures,
}

/// The credentials of an `Authorization: Bearer …` value; the scheme's name is case-insensitive
/// (RFC 9110, 11.1).
pub(crate) fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(credentials)
}

pub(crate) async fn require_api_key(State(auth): State<KeyAuth>, mut req: Request, next: Next) -> Response {
    let state = &auth.state;
    // Ends at any refusal's return, or below before the handler runs.
    let span = crate::telemetry::traces::span("authenticate");
    // Set by the accept loop (through a trusted proxy, the client it names); absent only for
    // requests built in-process (tests).
    let peer = crate::client_addr::of(&req);
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_credentials)
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    let Some(secret) = presented.filter(|s| !s.is_empty()) else {
        return KeyRefusal::Missing.into_api_error().into_response();
    };
    if !gantry_accounts::looks_like_key(secret) {
        return KeyRefusal::Incorrect { redacted: redact(secret) }.into_api_error().into_response();
    }
    if let Some(wait) = peer.and_then(|ip| auth.failures.blocked_for(ip)) {
        return KeyRefusal::Throttled { retry_after: wait }.into_api_error().into_response();
    }
    match state.accounts.authenticate(secret).await {
        Ok(Some(key)) if key.is_expired() => {
            KeyRefusal::Expired { prefix: key.prefix }.into_api_error().into_response()
        }
        Ok(Some(key)) => {
            drop(span);
            req.extensions_mut().insert(key);
            next.run(req).await
        }
        Ok(None) => {
            if let Some(ip) = peer {
                auth.failures.record(ip);
            }
            KeyRefusal::Incorrect { redacted: redact(secret) }.into_api_error().into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "key lookup failed");
            KeyRefusal::LookupFailed.into_api_error().into_response()
        }
    }
}

/// Shows only the ends of a presented key, like OpenAI's `sk-abc***wxyz`.
fn redact(secret: &str) -> String {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() <= 10 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..6].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}***{tail}")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redaction_never_shows_the_whole_key() {
        let key = "sk-gantry-abcdefghijklmnopqrstuvwxyz0123";
        let r = redact(key);
        assert!(!r.contains("abcdefghijklmnop"));
        assert!(r.starts_with("sk-gan") && r.ends_with("0123"));
        assert_eq!(redact("short"), "*****");
    }
}
