//! `GET /console`: the operator's web console, static files embedded in the binary. The pages
//! hold no data of their own: every figure comes from `/admin/v1` with the admin token the
//! operator signs in with, so without that token the console can do nothing.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use gantry_api::ApiError;

use crate::state::AppState;

/// No inline scripts or styles, nothing from other origins, no framing.
pub(crate) const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Every file under `crates/server/console/`, by its path there (a unit test keeps this list
/// and the folder in step).
pub(crate) const ASSETS: &[(&str, &[u8])] = &[
    ("index.html", include_bytes!("../../console/index.html")),
    ("console.css", include_bytes!("../../console/console.css")),
    ("app.js", include_bytes!("../../console/app.js")),
    ("api.js", include_bytes!("../../console/api.js")),
    ("charts.js", include_bytes!("../../console/charts.js")),
    ("dom.js", include_bytes!("../../console/dom.js")),
    ("format.js", include_bytes!("../../console/format.js")),
    ("pages/overview.js", include_bytes!("../../console/pages/overview.js")),
    ("pages/keys.js", include_bytes!("../../console/pages/keys.js")),
    ("pages/key_form.js", include_bytes!("../../console/pages/key_form.js")),
    ("pages/usage.js", include_bytes!("../../console/pages/usage.js")),
    ("pages/models.js", include_bytes!("../../console/pages/models.js")),
    ("pages/playground.js", include_bytes!("../../console/pages/playground.js")),
    ("favicon.svg", include_bytes!("../../console/favicon.svg")),
];

const DISABLED_PAGE: &str = "<!doctype html>
<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Gantry console is off</title></head>
<body><h1>The Gantry console is off</h1>
<p>The console manages keys and usage, so it needs the admin token. Start the server with one:</p>
<pre>gantry serve --admin-token \"$(openssl rand -hex 24)\" …</pre>
<p>(or set <code>GANTRY_ADMIN_TOKEN</code>), then open <code>/console</code> again and sign in with that token.</p>
</body></html>
";

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/assets/{*path}", get(asset))
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

/// The headers every console response carries.
fn secured(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The files change with the binary; revalidating them is cheap on loopback.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn file(path: &str) -> Option<Response> {
    let (_, bytes) = ASSETS.iter().find(|(p, _)| *p == path)?;
    Some(([(header::CONTENT_TYPE, content_type(path))], *bytes).into_response())
}

async fn index(State(state): State<AppState>) -> Response {
    if state.admin_token.is_none() {
        return secured(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], DISABLED_PAGE).into_response());
    }
    secured(file("index.html").expect("index.html is embedded"))
}

async fn asset(State(state): State<AppState>, Path(path): Path<String>) -> Response {
    match file(&path).filter(|_| state.admin_token.is_some() && path != "index.html") {
        Some(response) => secured(response),
        None => secured(ApiError::not_found(format!("No console file {path:?}")).into_response()),
    }
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// A file added to the console folder but not to [`ASSETS`] would be missing from the binary.
    #[test]
    fn every_console_file_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    on_disk.push(path.strip_prefix(&root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|(p, _)| p.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }
}
