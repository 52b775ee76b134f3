//! Request identity, the cancellation billing rule, replica identity and the durable ledger,
//! end to end through the real binary.

mod common;

use std::path::Path;
use std::time::Duration;

use common::postgres::OwnPostgres;
use common::{ban_special_tokens, gantry, sse_data, TestServer, KEY};
use serde_json::{json, Value};

fn cli(data_flag: &str, data: &str, args: &[&str]) -> String {
    let out = gantry().args(args).args([data_flag, data]).output().unwrap();
    assert!(out.status.success(), "gantry {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn requests_of(data_flag: &str, data: &str) -> Vec<Value> {
    serde_json::from_str(&cli(data_flag, data, &["usage", "--requests", "--format", "json"])).unwrap()
}

/// Polls the per-request listing until `done` holds (settlement lands just after responses).
async fn ledger_until(data_flag: &str, data: &str, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut rows = Vec::new();
    for _ in 0..300 {
        rows = requests_of(data_flag, data);
        if done(&rows) {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the ledger never reached: {what}; it holds {rows:#?}");
}

fn hello(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
}

#[tokio::test]
async fn one_client_request_id_on_many_requests_is_served_and_billed_each_time() {
    let s = TestServer::start(&["--max-queue", "50"]);
    let data = s.data_dir.path().to_str().unwrap().to_string();
    let send = || s.chat(hello(&s.model_id, 3)).header("x-request-id", "my-fixed-id").send();
    let mut told = 0;
    let mut completion_ids = std::collections::HashSet::new();
    let check = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-request-id"], "my-fixed-id", "the client's id is echoed back");
        resp.json::<Value>().await.unwrap()
    };
    for _ in 0..5 {
        let v = check(send().await.unwrap()).await;
        told += v["usage"]["total_tokens"].as_i64().unwrap();
        assert!(completion_ids.insert(v["id"].as_str().unwrap().to_string()), "completion ids are the server's: {v}");
    }
    for resp in futures_util::future::join_all((0..5).map(|_| send())).await {
        let v = check(resp.unwrap()).await;
        told += v["usage"]["total_tokens"].as_i64().unwrap();
        assert!(completion_ids.insert(v["id"].as_str().unwrap().to_string()), "{v}");
    }
    // Without a client id, the response names the server's id, which the completion id carries.
    let resp = s.chat(hello(&s.model_id, 3)).send().await.unwrap();
    let server_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], format!("chatcmpl-{server_id}"));

    let rows = ledger_until("--data-dir", &data, "11 requests", |rows| rows.len() == 11).await;
    let fixed: Vec<&Value> = rows.iter().filter(|r| r["client_request_id"] == "my-fixed-id").collect();
    assert_eq!(fixed.len(), 10, "{rows:#?}");
    let billed: i64 =
        fixed.iter().map(|r| r["prompt_tokens"].as_i64().unwrap() + r["completion_tokens"].as_i64().unwrap()).sum();
    assert_eq!(billed, told);
    for r in &fixed {
        assert!(completion_ids.contains(&format!("chatcmpl-{}", r["request_id"].as_str().unwrap())), "{r}");
        assert_eq!(r["key_name"], "serve --api-key");
        assert!(r["outcome"] == "length" || r["outcome"] == "completed", "{r}");
    }
    let own = rows.iter().find(|r| r["client_request_id"].is_null()).unwrap();
    assert_eq!(own["request_id"], server_id);
}

/// Reads SSE events until one carries content; returns how many content deltas were read.
async fn read_until_content(resp: &mut reqwest::Response) -> usize {
    let mut buf = String::new();
    loop {
        let chunk = resp.chunk().await.unwrap().expect("the stream ended before any content");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        let deltas = sse_data(&buf)
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|v| v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()))
            .count();
        if deltas > 0 {
            return deltas;
        }
    }
}

#[tokio::test]
async fn cancellation_is_billed_by_one_rule_queued_prefill_and_decode() {
    // One sequence, so a second request waits in the queue; small steps, so a long prompt
    // takes many steps to prefill.
    let s = TestServer::start(&["--parallel", "1", "--ctx-size", "2048", "--batch-size", "16", "--public-metrics"]);
    let data = s.data_dir.path().to_str().unwrap().to_string();
    let client = s.client();
    let post = |body: Value, id: &str| {
        client
            .post(s.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("x-request-id", id.to_string())
            .json(&body)
            .send()
    };
    let long_prompt = "tell me a story about the sea ".repeat(60);
    // A seed skips the prefix cache, so the probe does not make the later prefill instant.
    let probe: Value = post(
        json!({"model": s.model_id, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 1, "seed": 1}),
        "probe",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let long_prompt_tokens = probe["usage"]["prompt_tokens"].as_i64().unwrap();
    let short = json!({"model": s.model_id, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1900,
                       "stream": true, "stop": [], "seed": 2, "logit_bias": ban_special_tokens(&s, KEY).await});
    let short_probe: Value =
        post(json!({"model": s.model_id, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1}), "probe2")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let short_prompt_tokens = short_probe["usage"]["prompt_tokens"].as_i64().unwrap();

    // Decoding: cancelled after content arrived.
    let mut running = post(short.clone(), "decoding").await.unwrap();
    let read = read_until_content(&mut running).await as i64;
    // Queued behind it: the response opens (admitted, submitted), then the client goes.
    let mut queued = post(short.clone(), "queued").await.unwrap();
    assert_eq!(queued.status(), 200);
    let _opening = queued.chunk().await.unwrap();
    drop(queued);
    // The scheduler must see the queued request go before the running one frees the slot:
    // its ledger row (written once the scheduler answers it) says it has.
    ledger_until("--data-dir", &data, "the queued cancellation", |rows| {
        rows.iter().any(|r| r["client_request_id"] == "queued")
    })
    .await;
    // It counts among the finished requests too (the running one is still decoding).
    let metrics = client.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let cancelled = format!("gantry_requests_total{{model=\"{}\",outcome=\"cancelled\"}} 1\n", s.model_id);
    assert!(metrics.contains(&cancelled), "metrics lack {cancelled:?}:\n{metrics}");
    drop(running);
    // Prefill: once the slot is free again, a long prompt cancelled as soon as the response
    // opens. With the tiny model, prompt processing takes a few milliseconds, so the request
    // may be dropped still queued, while prefilling, or (rarely) already decoding; the rule is
    // checked for whichever phase it was.
    ledger_until("--data-dir", &data, "the first two cancellations", |rows| {
        ["decoding", "queued"].iter().all(|id| rows.iter().any(|r| r["client_request_id"] == *id))
    })
    .await;
    let mut prefill = post(
        json!({"model": s.model_id, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 600, "stream": true, "seed": 3}),
        "prefill",
    )
    .await
    .unwrap();
    assert_eq!(prefill.status(), 200);
    let _opening = prefill.chunk().await.unwrap();
    drop(prefill);

    let ids = ["decoding", "queued", "prefill"];
    let rows = ledger_until("--data-dir", &data, "the three cancelled requests", |rows| {
        ids.iter().all(|id| rows.iter().any(|r| r["client_request_id"] == *id))
    })
    .await;
    let row = |id: &str| rows.iter().find(|r| r["client_request_id"] == id).unwrap().clone();
    let (decoding, queued, prefill) = (row("decoding"), row("queued"), row("prefill"));
    eprintln!(
        "cancelled while decoding: {decoding}\ncancelled while queued: {queued}\ncancelled early (prefill): {prefill}"
    );
    for r in [&decoding, &queued, &prefill] {
        assert_eq!(r["outcome"], "cancelled", "{r}");
    }
    // Queued: never reached a sequence, nothing billed.
    assert_eq!(
        (queued["prompt_tokens"].as_i64(), queued["completion_tokens"].as_i64()),
        (Some(0), Some(0)),
        "{queued}"
    );
    // Admitted: the whole prompt plus every token generated.
    assert_eq!(decoding["prompt_tokens"].as_i64().unwrap(), short_prompt_tokens, "{decoding}");
    let generated = decoding["completion_tokens"].as_i64().unwrap();
    assert!(generated >= read && generated < 1900, "{decoding}, {read} content deltas read");
    let (prompt, completion) =
        (prefill["prompt_tokens"].as_i64().unwrap(), prefill["completion_tokens"].as_i64().unwrap());
    if prompt == 0 {
        assert_eq!(completion, 0, "dropped while queued, nothing is billed: {prefill}");
    } else {
        assert_eq!(prompt, long_prompt_tokens, "admitted: the whole prompt is billed: {prefill}");
        assert!(completion < 600, "{prefill}");
    }
    // Every reservation ended.
    let shown: Value =
        serde_json::from_str(&cli("--data-dir", &data, &["keys", "show", "serve --api-key", "--format", "json"]))
            .unwrap();
    assert_eq!(shown["spend"]["reserved_tokens"], 0, "{shown}");
}

/// The tests that keep long streams running through timed events (a heartbeat sweep, a database
/// outage) run one at a time: side by side on two cores, each starved the other's timers.
static ONE_TIMED_TEST_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn two_servers_with_the_default_instance_id_keep_each_others_reservations() {
    let _alone = ONE_TIMED_TEST_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    // Neither names an --instance-id: both default to this host's name. One sequence, so most
    // of A's requests wait in its queue, holding their reservations for a long while. A 5 s
    // heartbeat timeout: with 1 s, a fresh-clone `make test` saw A's heartbeat (every 250 ms,
    // an fsync'd SQLite write shared by two busy servers and the tests beside them) miss it, and
    // B rightly released the reservations of a server that looked dead.
    let args = ["--data-dir", data.as_str(), "--ctx-size", "2048", "--parallel", "1", "--heartbeat-timeout", "5"];
    let a = TestServer::start(&args);
    let key = cli("--data-dir", &data, &["keys", "create", "--name", "held", "--budget-tokens", "100000000"])
        .trim()
        .to_string();
    // Special tokens banned: no request can end early, so A's reservations stay live throughout.
    let streams = open_streams(&a, &key, 30, 1900).await;
    let reserved = || {
        let v: Value =
            serde_json::from_str(&cli("--data-dir", &data, &["keys", "show", "held", "--format", "json"])).unwrap();
        v["spend"]["reserved_tokens"].as_i64().unwrap()
    };
    assert!(reserved() > 0, "A's requests hold reservations");
    // The second server starts and sweeps (at once, then every 1.25 s) while A's requests run.
    let known = instance_heartbeats(&data).await;
    let b = TestServer::start(&args);
    a_new_server_has_swept(&data, &known).await;
    assert!(reserved() > 0, "B released A's live reservations");
    // A dies with reservations held; B releases them once A's heartbeat is stale.
    drop(a);
    drop(streams);
    let mut left = reserved();
    for _ in 0..150 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = reserved();
    }
    assert_eq!(left, 0, "the dead server's reservations are released by the live one");
    drop(b);
}

/// Each server's instance id and last heartbeat, read from the SQLite database in `data`.
async fn instance_heartbeats(data: &str) -> Vec<(String, i64)> {
    let path = std::path::Path::new(data).join(gantry_accounts::DB_FILE_NAME);
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path).read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let rows = sqlx::query_as("SELECT id, heartbeat_at_ms FROM instances").fetch_all(&pool).await.unwrap();
    pool.close().await;
    rows
}

/// Waits until a server not among `known` has written its heartbeat twice. A server sweeps right
/// after each heartbeat, in the same loop, so by its second heartbeat its first sweep is done.
async fn a_new_server_has_swept(data: &str, known: &[(String, i64)]) {
    let mut first = None;
    // A deadline only: the event itself is what the loop waits for.
    for _ in 0..600 {
        let rows = instance_heartbeats(data).await;
        let new = rows.iter().find(|(id, _)| !known.iter().any(|(k, _)| k == id)).map(|&(_, at)| at);
        match (first, new) {
            (None, Some(at)) => first = Some(at),
            (Some(before), Some(at)) if at != before => return,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the second server never wrote a second heartbeat");
}

/// Opens `n` streams (each admitted once its first chunk arrives) that each generate exactly
/// `max_tokens` (special tokens banned), so they outlast whatever the test does meanwhile.
async fn open_streams(s: &TestServer, key: &str, n: usize, max_tokens: u32) -> Vec<reqwest::Response> {
    let body = json!({"model": s.model_id, "messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens, "stream": true,
                      "stream_options": {"include_usage": true}, "stop": [], "temperature": 1.0,
                      "logit_bias": ban_special_tokens(s, key).await});
    // The streams run one after another (one sequence): the last one ends long after the first,
    // and the longer the slower the machine, so only silence counts as a failure, not duration.
    let client = reqwest::Client::builder().read_timeout(Duration::from_secs(120)).build().unwrap();
    let mut streams = Vec::new();
    for _ in 0..n {
        let mut resp = client.post(s.url("/v1/chat/completions")).bearer_auth(key).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.chunk().await.unwrap();
        streams.push(resp);
    }
    streams
}

/// Reads every stream to its end and sums the usage each reported to its client.
async fn told_usage(streams: Vec<reqwest::Response>) -> i64 {
    let mut total = 0;
    for resp in streams {
        let body = resp.text().await.unwrap();
        let usage = sse_data(&body)
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find_map(|v| v["usage"]["total_tokens"].as_i64())
            .unwrap_or_else(|| panic!("no usage in {body}"));
        total += usage;
    }
    total
}

fn outbox_bytes(data_dir: &Path) -> u64 {
    std::fs::read_dir(data_dir.join("outbox")).map_or(0, |d| d.map(|e| e.unwrap().metadata().unwrap().len()).sum())
}

#[tokio::test]
async fn no_usage_record_is_lost_when_postgres_goes_down_mid_load() {
    database_outage("no_usage_record_is_lost_when_postgres_goes_down_mid_load", false).await;
}

/// The test cluster runs with `synchronous_commit = off`: the second immediate stop would lose
/// the first outage's records, just replayed, unless Gantry's connections commit durably (they
/// did, before it did: 3 of 8 records lost in about half the runs).
#[tokio::test]
async fn no_usage_record_is_lost_when_a_server_dies_during_a_database_outage() {
    database_outage("no_usage_record_is_lost_when_a_server_dies_during_a_database_outage", true).await;
}

/// The database stops while streams run and comes back: the ledger equals what the clients were
/// told. With `kill_while_down`, it stops again and the server is SIGKILLed before it returns.
async fn database_outage(test: &str, kill_while_down: bool) {
    // This test needs PostgreSQL's binaries; they are there whenever the suite's database is.
    if gantry_accounts::testing::postgres_admin_url_for(test).is_none() {
        return;
    }
    let _alone = ONE_TIMED_TEST_AT_A_TIME.lock().await;
    let pg_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(pg_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // Each outage test has its own cluster and port.
    let port = common::cluster::free_port();
    let pg = OwnPostgres::start(&pg_dir.path().join("cluster"), port);
    let url = gantry_accounts::testing::fresh_postgres_database(&pg.admin_url()).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let data_path = data.path().to_str().unwrap().to_string();
    // One sequence and long answers: most requests are still queued or running when the
    // database stops, and settle while it is down.
    let args = [
        "--database-url",
        url.as_str(),
        "--data-dir",
        data_path.as_str(),
        "--heartbeat-timeout",
        "2",
        "--ctx-size",
        "2048",
        "--parallel",
        "1",
    ];
    let key = cli("--database-url", &url, &["keys", "create", "--name", "loaded"]).trim().to_string();
    let ledger = || async {
        let rows: Vec<Value> =
            serde_json::from_str(&cli("--database-url", &url, &["usage", "--format", "json", "--key-name", "loaded"]))
                .unwrap();
        rows.first().map_or(0, |r| r["prompt_tokens"].as_i64().unwrap() + r["completion_tokens"].as_i64().unwrap())
    };

    // 1. The database stops while streams run, and comes back.
    let s = TestServer::start(&args);
    let streams = open_streams(&s, &key, 8, 1900).await;
    pg.stop();
    let mut told = told_usage(streams).await;
    assert!(outbox_bytes(data.path()) > 0, "settlements wait in the outbox while the database is down");
    pg.run();
    let mut billed = 0;
    for _ in 0..300 {
        billed = ledger().await;
        if billed == told {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(billed, told, "the ledger equals what the clients were told");
    if !kill_while_down {
        let v: Value =
            serde_json::from_str(&cli("--database-url", &url, &["keys", "show", "loaded", "--format", "json"]))
                .unwrap();
        assert_eq!(v["spend"]["tokens"].as_i64().unwrap(), told, "{v}");
        assert_eq!(v["spend"]["reserved_tokens"], 0, "{v}");
        return;
    }

    // 2. The database stops again and the server is killed before it comes back: the next
    //    start replays the outbox.
    let streams = open_streams(&s, &key, 8, 1900).await;
    pg.stop();
    told += told_usage(streams).await;
    assert!(outbox_bytes(data.path()) > 0);
    drop(s); // SIGKILL
    pg.run();
    let _again = TestServer::start(&args);
    for i in 0..600 {
        billed = ledger().await;
        if billed == told {
            break;
        }
        // A server restarted right after its database can wait on dead pooled connections for a
        // while before the replay goes through; say where it stands while waiting.
        if i % 25 == 24 {
            eprintln!("replay pending: billed {billed} of {told} tokens, outbox {} bytes", outbox_bytes(data.path()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(billed, told, "records journalled before the kill are replayed at the next start");
    let shown: Value =
        serde_json::from_str(&cli("--database-url", &url, &["keys", "show", "loaded", "--format", "json"])).unwrap();
    assert_eq!(shown["spend"]["tokens"].as_i64().unwrap(), told);
    for _ in 0..100 {
        let v: Value =
            serde_json::from_str(&cli("--database-url", &url, &["keys", "show", "loaded", "--format", "json"]))
                .unwrap();
        if v["spend"]["reserved_tokens"] == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("reservations were never released");
}
