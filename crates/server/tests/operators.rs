//! The operator's side through the real binary: admin token strength at start, `--admin-listen`
//! splitting the operator's routes onto their own listener, and the throttle on wrong tokens.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::{gantry, TestServer, KEY};
use reqwest::StatusCode;

const ADMIN: &str = "operators-test-admin-4b9e2d7f0a6c1853";

/// `http://ADDR` of the admin listener, from the line `gantry serve` prints for it.
fn admin_base(s: &TestServer) -> String {
    let line = s
        .stdout_lines
        .iter()
        .find_map(|l| l.strip_prefix("Admin API, console and /metrics at "))
        .unwrap_or_else(|| panic!("no admin listener line in {:?}", s.stdout_lines));
    line.split_whitespace().next().unwrap().to_string()
}

#[test]
fn a_weak_admin_token_stops_the_server_at_start() {
    for (how, weak) in
        [("flag", "changeme"), ("env", "change-me-admin-token"), ("flag", "PLACEHOLDER-ADMIN-TOKEN-0123456789abcdef")]
    {
        let data = tempfile::tempdir().unwrap();
        let mut cmd = gantry();
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"])
            .arg(common::tiny_model())
            .arg("--data-dir")
            .arg(data.path())
            .env_remove("GANTRY_ADMIN_TOKEN");
        match how {
            "flag" => cmd.args(["--admin-token", weak]),
            _ => cmd.env("GANTRY_ADMIN_TOKEN", weak),
        };
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Either the process exits (stdout ends) or it serves (the banner): never wait on a
        // server that started anyway.
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let banner = stdout.lines().map_while(Result::ok).find(|l| l.starts_with("Gantry is serving"));
        if banner.is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{weak}: started anyway");
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{weak}: exited 0");
        assert!(stderr.contains("--admin-token (GANTRY_ADMIN_TOKEN) is too weak"), "{weak}: {stderr}");
        assert!(!stderr.contains(weak), "the token must not be printed: {stderr}");
    }
}

#[tokio::test]
async fn the_admin_listener_serves_the_operators_routes_and_the_public_one_does_not() {
    let mut s = TestServer::start(&["--admin-token", ADMIN, "--admin-listen", "127.0.0.1:0"]);
    let admin = admin_base(&s);
    assert_ne!(admin, s.base);
    let c = s.client();

    for path in ["/admin/v1/keys", "/console", "/metrics"] {
        let public = c.get(s.url(path)).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(public.status(), StatusCode::NOT_FOUND, "public {path}");
        let body: serde_json::Value = public.json().await.unwrap();
        assert!(body["error"]["message"].is_string(), "{body}");
        let private = c.get(format!("{admin}{path}")).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(private.status(), StatusCode::OK, "admin {path}");
    }
    let keys: serde_json::Value =
        c.get(format!("{admin}/admin/v1/keys")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert!(!keys["data"].as_array().unwrap().is_empty(), "{keys}");
    let metrics = c.get(format!("{admin}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("gantry_"), "{metrics}");

    for base in [&s.base, &admin] {
        for path in ["/health", "/health/live", "/health/ready"] {
            assert_eq!(c.get(format!("{base}{path}")).send().await.unwrap().status(), StatusCode::OK, "{base}{path}");
        }
    }
    let models = c.get(s.url("/v1/models")).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(models.status(), StatusCode::OK);
    // The console's playground calls the API on the console's own origin.
    let on_admin = c.get(format!("{admin}/v1/models")).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(on_admin.status(), StatusCode::OK);

    // Both listeners close on SIGTERM and the process exits cleanly.
    assert!(s.terminate().success());
    assert!(c.get(format!("{admin}/health")).send().await.is_err(), "the admin listener outlived the server");
}

#[tokio::test]
async fn wrong_admin_tokens_are_throttled_by_client_address() {
    let s = TestServer::start(&["--admin-token", ADMIN]);
    let c = s.client();
    let mut statuses = Vec::new();
    for i in 0..5 {
        let r = c.get(s.url("/admin/v1/keys")).bearer_auth(format!("wrong-{i}")).send().await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 429]);
    let locked = c.get(s.url("/admin/v1/keys")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS, "the right token waits out the lockout too");
    assert!(locked.headers().contains_key("retry-after"));
    let body: serde_json::Value = locked.json().await.unwrap();
    assert_eq!(body["error"]["code"], "admin_auth_throttled");
    // Chat and the API are not the admin API: they keep answering.
    assert_eq!(c.get(s.url("/v1/models")).bearer_auth(KEY).send().await.unwrap().status(), StatusCode::OK);
}
