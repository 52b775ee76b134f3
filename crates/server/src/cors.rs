//! Cross-origin access to the API, for browser clients (Open WebUI's direct connections, web
//! chat apps): any origin may call it, as any may call OpenAI's and Anthropic's APIs. Keys travel
//! in headers, never in cookies, so a page of another origin can do nothing a request without
//! CORS could not; CORS only lets it read the answer to a key it already holds. The operator's
//! routes (admin API, console, metrics) stay same-origin.

use std::sync::LazyLock;
use std::time::Duration;

use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use tower::{Layer, ServiceExt};
use tower_http::cors::{AllowHeaders, Any, CorsLayer};

static API_CORS: LazyLock<CorsLayer> = LazyLock::new(|| {
    CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        // `Authorization` is never covered by `*`: the headers a preflight asks for are echoed.
        .allow_headers(AllowHeaders::mirror_request())
        // `x-ratelimit-*`, `x-request-id`, `retry-after`: what clients read besides the body.
        .expose_headers(Any)
        .max_age(Duration::from_secs(86_400))
});

/// The API's routes (`/v1/…`, health) answer preflights and carry CORS headers; the layer sits
/// outside every other, so errors, 404s and 405s a browser must read carry them too.
pub(crate) async fn api_cors(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if !(path.starts_with("/v1/") || path == "/health" || path.starts_with("/health/")) {
        return next.run(req).await;
    }
    match API_CORS.layer(next).oneshot(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{HeaderMap, Request, StatusCode};
    use tower::ServiceExt;

    use crate::router_tests::{delta, harness_with_admin, usage, ScriptedEngine, KEY};

    const ADMIN: &str = "admin-token-for-cors-tests-0123456789abc";

    async fn headers_of(h: &crate::router_tests::Harness, request: Request<Body>) -> (StatusCode, HeaderMap) {
        let response = h.app.clone().oneshot(request).await.unwrap();
        (response.status(), response.headers().clone())
    }

    fn preflight(path: &str) -> Request<Body> {
        Request::options(path)
            .header("origin", "http://localhost:3000")
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization,content-type")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn browsers_may_call_the_api_from_any_origin_but_not_the_operators_routes() {
        let engine = ScriptedEngine::new(vec![delta("hi")], usage(1));
        let h = harness_with_admin(std::sync::Arc::new(engine), Some(ADMIN)).await;
        let (status, headers) = headers_of(&h, preflight("/v1/chat/completions")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["access-control-allow-origin"], "*");
        assert_eq!(headers["access-control-allow-headers"], "authorization,content-type");
        assert!(headers["access-control-allow-methods"].to_str().unwrap().contains("POST"), "{headers:?}");

        // Answers, errors included, are readable: a 401 without a key, a listing with one.
        let with_origin = |req: axum::http::request::Builder| req.header("origin", "http://localhost:3000");
        let no_key = with_origin(Request::get("/v1/models")).body(Body::empty()).unwrap();
        let (status, headers) = headers_of(&h, no_key).await;
        assert_eq!(
            (status, &headers["access-control-allow-origin"]),
            (StatusCode::UNAUTHORIZED, &"*".parse().unwrap())
        );
        let listed = with_origin(Request::get("/v1/models"))
            .header("authorization", format!("Bearer {KEY}"))
            .body(Body::empty());
        let (status, headers) = headers_of(&h, listed.unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["access-control-allow-origin"], "*");
        assert_eq!(headers["access-control-expose-headers"], "*");

        // The admin API and the console stay same-origin.
        for path in ["/admin/v1/keys", "/console"] {
            let (_, headers) = headers_of(&h, preflight(path)).await;
            assert!(!headers.contains_key("access-control-allow-origin"), "{path}: {headers:?}");
        }
    }
}
