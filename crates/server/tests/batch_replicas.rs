//! A batch on two replicas sharing PostgreSQL: the first runs its lines and is SIGKILLed
//! mid-batch; the second, started after, takes back the lines the first held once its heartbeat
//! is stale, and finishes the batch.
//! Afterwards (the killed replica restarted under its own id, so its outbox replays) every line
//! is in the output once, answered 200, and in the ledger once, in tier `batch`, under its
//! `batch_req_…` id.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::cluster::{start_replicas, Replica};
use common::{gantry, tiny_model};
use serde_json::{json, Value};

const TEST: &str = "a_batch_survives_a_killed_replica_each_line_answered_and_billed_once";
const ADMIN_TOKEN: &str = "cb2957c03eef9cb4de41133ecdd8bd8f7b99aabf0ea563c8";
const LINES: usize = 24;

fn create_key(url: &str) -> String {
    let out = gantry().args(["keys", "create", "--name", "batcher", "--database-url", url]).output().unwrap();
    assert!(out.status.success(), "keys create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `POST /v1/files` as a multipart form, written by hand (the one form this test sends).
async fn upload(client: &reqwest::Client, base: &str, key: &str, content: &str) -> String {
    let boundary = "gantry-test-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let resp = client
        .post(format!("{base}/v1/files"))
        .bearer_auth(key)
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn get_json(client: &reqwest::Client, url: String, bearer: &str) -> Value {
    let resp = client.get(url).bearer_auth(bearer).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Polls the batch through `base` until `done` holds of it.
async fn wait_for(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let batch = get_json(client, format!("{base}/v1/batches/{id}"), key).await;
        if done(&batch) {
            return batch;
        }
        assert!(Instant::now() < deadline, "the batch never reached {what}: {batch}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_batch_survives_a_killed_replica_each_line_answered_and_billed_once() {
    let Some(admin) = gantry_accounts::testing::postgres_admin_url_for(TEST) else { return };
    let url = gantry_accounts::testing::fresh_postgres_database(&admin).await.unwrap();
    let key = create_key(&url);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model().display().to_string();
    let args = [
        "--model",
        &model,
        "--database-url",
        &url,
        "--admin-token",
        ADMIN_TOKEN,
        "--threads",
        "1",
        "--ctx-size",
        "1024",
        "--parallel",
        "2",
        "--batch-concurrency",
        "2",
        "--heartbeat-timeout",
        "3",
    ];
    let mut replicas = start_replicas(&["b1"], dir.path(), &args).await;
    let first = format!("http://{}", replicas[0].addr());
    let model_id = tiny_model().file_stem().unwrap().to_string_lossy().into_owned();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    // Lines long enough (end of text banned) that the kill lands while some run.
    let bias = common::ban_special_tokens_at(&first, &model_id, &key).await;
    let lines: String = (0..LINES)
        .map(|i| {
            let body = json!({"model": model_id, "messages": [{"role": "user", "content": format!("line {i}")}],
                              "max_tokens": 200, "logit_bias": bias});
            json!({"custom_id": format!("l{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body})
                .to_string()
                + "\n"
        })
        .collect();
    let file = upload(&client, &first, &key, &lines).await;
    let created = client
        .post(format!("{first}/v1/batches"))
        .bearer_auth(&key)
        .json(&json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 200);
    let id = created.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();

    let completed = |b: &Value| b["request_counts"]["completed"].as_u64().unwrap_or(0);
    let at_kill = wait_for(&client, &first, &key, &id, "4 completed lines", |b| completed(b) >= 4).await;
    replicas[0].sigkill();
    assert!(completed(&at_kill) < LINES as u64, "the batch ended before the kill: nothing to take over");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    replicas.push(Replica::new("b2", dir.path(), &args));
    replicas[1].spawn();
    replicas[1].wait_ready().await;
    let second = format!("http://{}", replicas[1].addr());
    let done = wait_for(&client, &second, &key, &id, "a final status", |b| b["status"] != "in_progress").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"], json!({"total": LINES, "completed": LINES, "failed": 0}), "{done}");
    let output_id = done["output_file_id"].as_str().unwrap();
    let output = client.get(format!("{second}/v1/files/{output_id}/content")).bearer_auth(&key).send().await.unwrap();
    let output: Vec<Value> = output.text().await.unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let customs: HashSet<&str> = output.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
    assert_eq!((output.len(), customs.len()), (LINES, LINES), "every line once");
    assert!(output.iter().all(|l| l["response"]["status_code"] == 200), "{output:?}");
    let ids: HashSet<String> = output.iter().map(|l| l["id"].as_str().unwrap().to_string()).collect();

    // The killed replica's outbox replays once it is back; then the ledger holds each line once.
    replicas[0].spawn();
    replicas[0].wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = get_json(&client, format!("{second}/admin/v1/usage/requests?key_name=batcher"), ADMIN_TOKEN).await;
        let rows: Vec<&Value> =
            rows["data"].as_array().unwrap().iter().filter(|r| r["batch_id"] == id.as_str()).collect();
        let billed: HashSet<String> = rows.iter().map(|r| r["request_id"].as_str().unwrap().to_string()).collect();
        if billed == ids {
            assert_eq!(rows.len(), LINES, "one row per line");
            assert!(rows.iter().all(|r| r["service_tier"] == "batch"), "{rows:?}");
            break;
        }
        assert!(billed.is_subset(&ids), "a row that is no line of the output: {rows:?}");
        let logs = replicas.iter().map(Replica::log_tail).collect::<Vec<_>>().join("\n---\n");
        assert!(Instant::now() < deadline, "the ledger holds {} of {LINES} lines:\n{logs}", billed.len());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
