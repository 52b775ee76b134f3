//! Budgets, key settings, the usage report and the admin API, end to end through the real binary.

mod common;

use common::{gantry, TestServer, KEY};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-for-tests-0123456789";

fn cli(s: &TestServer, args: &[&str]) -> String {
    let out = gantry().args(args).arg("--data-dir").arg(s.data_dir.path()).output().unwrap();
    assert!(out.status.success(), "gantry {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn last_line(out: &str) -> String {
    out.lines().last().unwrap().trim().to_string()
}

fn hello(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
}

#[tokio::test]
async fn a_budget_holds_under_a_burst_and_the_ledger_matches_the_clients() {
    let s = TestServer::start(&["--max-queue", "200"]);
    budget_burst(&s, &|args| cli(&s, args)).await;
}

#[tokio::test]
async fn a_budget_holds_under_a_burst_on_postgres() {
    let Some(admin) = gantry_accounts::testing::postgres_admin_url_for("a_budget_holds_under_a_burst_on_postgres")
    else {
        return;
    };
    let url = gantry_accounts::testing::fresh_postgres_database(&admin).await.unwrap();
    let s = TestServer::start(&["--max-queue", "200", "--database-url", &url]);
    budget_burst(&s, &|args| cli_db(&url, args)).await;
}

/// 100 concurrent requests on a key whose budget admits about 30 at once.
async fn budget_burst(s: &TestServer, cli: &dyn Fn(&[&str]) -> String) {
    let probe: Value = s.chat(hello(&s.model_id, 4)).send().await.unwrap().json().await.unwrap();
    let prompt = probe["usage"]["prompt_tokens"].as_i64().unwrap();
    // Each request reserves prompt + max_tokens; the budget admits about 30 at once.
    let budget = 30 * (prompt + 4);
    let key = last_line(&cli(&["keys", "create", "--name", "burst", "--budget-tokens", &budget.to_string()]));
    let client = s.client();
    let sends = (0..100)
        .map(|_| client.post(s.url("/v1/chat/completions")).bearer_auth(&key).json(&hello(&s.model_id, 4)).send());
    let (mut ok, mut refused, mut billed) = (0, 0, 0);
    for resp in futures_util::future::join_all(sends).await {
        let resp = resp.unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        match status {
            200 => {
                ok += 1;
                billed += v["usage"]["total_tokens"].as_i64().unwrap();
            }
            429 => {
                assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
                assert_eq!(v["error"]["type"], "insufficient_quota");
                refused += 1;
            }
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    assert!(ok >= 30 && refused > 0, "ok {ok}, refused {refused}");
    assert!(billed <= budget, "billed {billed} > budget {budget}");
    // The ledger is written just after each response; give the last writes a moment.
    let mut rows: Vec<Value> = Vec::new();
    for _ in 0..50 {
        rows = serde_json::from_str(&cli(&["usage", "--format", "json", "--key-name", "burst"])).unwrap();
        if rows.first().is_some_and(|r| r["requests"] == ok) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["requests"], ok);
    let ledger = rows[0]["prompt_tokens"].as_i64().unwrap() + rows[0]["completion_tokens"].as_i64().unwrap();
    assert_eq!(ledger, billed);
    let shown: Value = serde_json::from_str(&cli(&["keys", "show", "burst", "--format", "json"])).unwrap();
    assert_eq!(shown["spend"]["tokens"], billed);
    assert_eq!(shown["spend"]["reserved_tokens"], 0);
}

#[tokio::test]
async fn expired_keys_and_models_a_key_may_not_use() {
    let s = TestServer::start(&[]);
    // A past expiry is refused on create (a key that never works), and expires a key on update.
    let refused = gantry()
        .args(["keys", "create", "--name", "old", "--expires", "2020-01-01", "--data-dir"])
        .arg(s.data_dir.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("already past"), "{refused:?}");
    let expired = last_line(&cli(&s, &["keys", "create", "--name", "old", "--expires", "2999-01-01"]));
    cli(&s, &["keys", "update", "old", "--expires", "2020-01-01"]);
    let resp = s.client().get(s.url("/v1/models")).bearer_auth(&expired).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert!(v["error"]["message"].as_str().unwrap().contains("expired"));

    let narrow = last_line(&cli(&s, &["keys", "create", "--name", "narrow", "--models", "some-other-model"]));
    let models: Value =
        s.client().get(s.url("/v1/models")).bearer_auth(&narrow).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"], json!([]));
    let resp = s
        .client()
        .post(s.url("/v1/chat/completions"))
        .bearer_auth(&narrow)
        .json(&hello(&s.model_id, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    // Allowing it again takes effect on the next request.
    cli(&s, &["keys", "update", "narrow", "--models", &format!("{},x", s.model_id)]);
    let resp = s
        .client()
        .post(s.url("/v1/chat/completions"))
        .bearer_auth(&narrow)
        .json(&hello(&s.model_id, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn the_admin_api_manages_keys_and_reports_usage() {
    let s = TestServer::start(&["--admin-token", ADMIN, "--price", "nonexistent=1,1"]);
    let c = s.client();
    // An API key is not an admin token.
    let resp = c.get(s.url("/admin/v1/keys")).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let created = c
        .post(s.url("/admin/v1/keys"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "svc", "tenant": "acme", "rpm_limit": 100, "budget_usd": 5, "budget_period": "month"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("sk-gantry-"));
    assert_eq!((created["tenant"].as_str(), created["budget_period"].as_str()), (Some("acme"), Some("month")));
    let id = created["id"].as_i64().unwrap();

    let chat = |key: String| c.post(s.url("/v1/chat/completions")).bearer_auth(key).json(&hello(&s.model_id, 3)).send();
    assert_eq!(chat(secret.clone()).await.unwrap().status(), 200);

    let patched: Value = c
        .patch(s.url(&format!("/admin/v1/keys/{id}")))
        .bearer_auth(ADMIN)
        .json(&json!({"rpm_limit": null, "tpm_limit": 5000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((patched["rpm_limit"].clone(), patched["tpm_limit"].clone()), (Value::Null, json!(5000)));
    let bad = c
        .patch(s.url(&format!("/admin/v1/keys/{id}")))
        .bearer_auth(ADMIN)
        .json(&json!({"colour": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let rotated: Value = c
        .post(s.url(&format!("/admin/v1/keys/{id}/rotate")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let new_secret = rotated["secret"].as_str().unwrap().to_string();
    assert_eq!(chat(secret.clone()).await.unwrap().status(), 401);
    assert_eq!(chat(new_secret.clone()).await.unwrap().status(), 200);

    let mut usage = Value::Null;
    for _ in 0..50 {
        usage = c
            .get(s.url("/admin/v1/usage?key_name=svc&group_by=day"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if usage["data"][0]["requests"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(usage["data"][0]["requests"], 2, "{usage}");
    assert_eq!(usage["data"][0]["tenant"], "acme");
    assert!(usage["data"][0]["day"].as_str().unwrap().starts_with("20"));
    // One row per request, with the server's request id.
    let per_request: Value = c
        .get(s.url("/admin/v1/usage/requests?key_name=svc"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows = per_request["data"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{per_request}");
    assert!(
        rows.iter().all(|r| r["request_id"].as_str().is_some_and(|id| id.len() == 32) && r["key_name"] == "svc"),
        "{per_request}"
    );
    // The test model does not think: its rows carry reasoning_tokens, as 0.
    assert!(rows.iter().all(|r| r["reasoning_tokens"] == 0), "{per_request}");
    assert_eq!(usage["data"][0]["reasoning_tokens"], 0, "{usage}");
    let refused = c.get(s.url("/admin/v1/usage/requests?group_by=day")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    let csv = c.get(s.url("/admin/v1/usage?format=csv")).bearer_auth(ADMIN).send().await.unwrap().text().await.unwrap();
    assert!(
        csv.starts_with(
            "key_name,tenant,model,day,requests,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,cost,key_id,\
             service_tier,batch_id\n"
        ),
        "{csv}"
    );
    assert!(csv.contains("svc,acme,"), "{csv}");
    assert!(rows.iter().all(|r| r["service_tier"] == "default"), "{per_request}");

    let revoked = c.delete(s.url(&format!("/admin/v1/keys/{id}"))).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(revoked.status(), 200);
    assert_eq!(chat(new_secret).await.unwrap().status(), 401);
    let missing = c.get(s.url("/admin/v1/keys/nobody")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn the_admin_api_is_off_without_a_token() {
    let s = TestServer::start(&[]);
    let resp = s.client().get(s.url("/admin/v1/keys")).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "admin_api_disabled");
}

#[tokio::test]
async fn a_crash_leaves_no_reservation_held_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    // A short heartbeat timeout: the dead server's reservations go a second after it stops.
    let args = ["--data-dir", data.as_str(), "--instance-id", "crash-test", "--heartbeat-timeout", "1"];
    let s = TestServer::start(&args);
    let key = last_line(&cli_in(&data, &["keys", "create", "--name", "crashy", "--budget-tokens", "1000000"]));
    // Long streams keep their reservations while the server is killed: no end-of-text token
    // may cut them short (the tiny model samples one now and then at temperature 1).
    let client = s.client();
    let mut streams = Vec::new();
    let no_end = common::ban_special_tokens(&s, &key).await;
    for _ in 0..3 {
        let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "go"}], "max_tokens": 480, "stream": true,
                          "stop": [], "temperature": 1.0, "logit_bias": no_end});
        let mut resp = client.post(s.url("/v1/chat/completions")).bearer_auth(&key).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.chunk().await.unwrap();
        streams.push(resp);
    }
    let held: Value = serde_json::from_str(&cli_in(&data, &["keys", "show", "crashy", "--format", "json"])).unwrap();
    drop(s); // SIGKILL
    drop(streams);
    let reserved = held["spend"]["reserved_tokens"].as_i64().unwrap();
    let spent = held["spend"]["tokens"].as_i64().unwrap();
    assert!(reserved > 0, "streams in flight hold reservations: {held} (spent {spent})");
    let _again = TestServer::start(&args);
    let mut after = Value::Null;
    for _ in 0..100 {
        after = serde_json::from_str(&cli_in(&data, &["keys", "show", "crashy", "--format", "json"])).unwrap();
        if after["spend"]["reserved_tokens"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(after["spend"]["reserved_tokens"], 0, "{after}");
}

fn cli_in(data: &str, args: &[&str]) -> String {
    let out = gantry().args(args).args(["--data-dir", data]).output().unwrap();
    assert!(out.status.success(), "gantry {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn cli_db(url: &str, args: &[&str]) -> String {
    let out = gantry().args(args).args(["--database-url", url]).output().unwrap();
    assert!(out.status.success(), "gantry {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn two_replicas_on_postgres_share_limits_budgets_and_revocations() {
    let Some(admin) = gantry_accounts::testing::postgres_admin_url_for(
        "two_replicas_on_postgres_share_limits_budgets_and_revocations",
    ) else {
        return;
    };
    let url = gantry_accounts::testing::fresh_postgres_database(&admin).await.unwrap();
    let a = TestServer::start(&["--database-url", &url, "--instance-id", "replica-a", "--admin-token", ADMIN]);
    let b = TestServer::start(&["--database-url", &url, "--instance-id", "replica-b"]);
    let replicas = [&a, &b];
    let send = |s: &TestServer, key: &str, max_tokens: u32| {
        s.client().post(s.url("/v1/chat/completions")).bearer_auth(key).json(&hello(&s.model_id, max_tokens)).send()
    };

    // One RPM limit across both replicas. Replicas count it per clock minute (`rate.rs`), so a
    // burst straddling a minute boundary may pass twice: the burst starts early in a minute.
    let into_minute = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 60;
    if into_minute > 40 {
        tokio::time::sleep(std::time::Duration::from_secs(61 - into_minute)).await;
    }
    let limited = last_line(&cli_db(&url, &["keys", "create", "--name", "limited", "--rpm", "4"]));
    let mut statuses = Vec::new();
    for i in 0..6 {
        statuses.push(send(replicas[i % 2], &limited, 2).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 4, "{statuses:?}");
    let refused = send(&b, &limited, 2).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.headers()["x-ratelimit-remaining-requests"], "0");

    // One budget across both replicas.
    let probe: Value = a.chat(hello(&a.model_id, 4)).send().await.unwrap().json().await.unwrap();
    let per_request = probe["usage"]["prompt_tokens"].as_i64().unwrap() + 4;
    let budget = 3 * per_request;
    let budgeted =
        last_line(&cli_db(&url, &["keys", "create", "--name", "budgeted", "--budget-tokens", &budget.to_string()]));
    let (mut billed, mut quota_refusals) = (0, 0);
    for i in 0..10 {
        let resp = send(replicas[i % 2], &budgeted, 4).await.unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        match status {
            200 => billed += v["usage"]["total_tokens"].as_i64().unwrap(),
            429 => {
                assert_eq!(v["error"]["code"], "insufficient_quota");
                quota_refusals += 1;
            }
            other => panic!("{other}: {v}"),
        }
        // Settlement is written just after the response; let it land before the next request.
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    assert!(quota_refusals > 0 && billed <= budget, "billed {billed} of {budget}, {quota_refusals} refusals");
    let rows: Vec<Value> =
        serde_json::from_str(&cli_db(&url, &["usage", "--format", "json", "--key-name", "budgeted"])).unwrap();
    let ledger = rows[0]["prompt_tokens"].as_i64().unwrap() + rows[0]["completion_tokens"].as_i64().unwrap();
    assert_eq!(ledger, billed);

    // A revocation made through one replica is seen by the other on the next request.
    let victim = last_line(&cli_db(&url, &["keys", "create", "--name", "victim"]));
    assert_eq!(send(&b, &victim, 2).await.unwrap().status(), 200);
    let revoked = a.client().delete(a.url("/admin/v1/keys/victim")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(revoked.status(), 200);
    assert_eq!(send(&b, &victim, 2).await.unwrap().status(), 401);
}

#[tokio::test]
async fn gantry_usage_shows_each_batchs_spend_and_filters_to_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let accounts = gantry_accounts::Accounts::open_data_dir(dir.path()).await.unwrap();
    let key_id = accounts.create_key("batcher").await.unwrap().key.id;
    for (id, batch) in [("i1", None), ("a1", Some("batch_a")), ("a2", Some("batch_a")), ("b1", Some("batch_b"))] {
        let record = gantry_accounts::UsageRecord {
            request_id: id.into(),
            client_request_id: None,
            key_id,
            model: "m".into(),
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 1,
            reasoning_tokens: 0,
            cost_nanos: 0,
            service_tier: if batch.is_some() { "batch" } else { "default" }.into(),
            batch_id: batch.map(String::from),
            outcome: "completed".into(),
            started_at_ms: 1_800_000_000_000,
            finished_at_ms: 1_800_000_000_100,
        };
        accounts.record_usage(&record).await.unwrap();
    }
    let rows: Vec<Value> = serde_json::from_str(&cli_in(&data, &["usage", "--format", "json"])).unwrap();
    let groups: Vec<Value> = rows.iter().map(|r| json!([r["service_tier"], r["batch_id"], r["requests"]])).collect();
    assert_eq!(groups, [json!(["batch", "batch_a", 2]), json!(["batch", "batch_b", 1]), json!(["default", null, 1])]);

    let table = cli_in(&data, &["usage", "--batch-id", "batch_a"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(lines[0].split_whitespace().any(|c| c == "BATCH"), "{table}");
    assert!(lines[1].split_whitespace().any(|c| c == "batch_a"), "{table}");
    let csv = cli_in(&data, &["usage", "--batch-id", "batch_b", "--format", "csv"]);
    assert!(csv.lines().nth(1).is_some_and(|l| l.ends_with(",batch,batch_b")), "{csv}");
    let requests = cli_in(&data, &["usage", "--requests", "--batch-id", "batch_a", "--format", "csv"]);
    let ids: Vec<&str> = requests.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(ids, ["a1", "a2"], "{requests}");
    assert!(requests.lines().skip(1).all(|l| l.ends_with(",batch,batch_a")), "{requests}");
}
