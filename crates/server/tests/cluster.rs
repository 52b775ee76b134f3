//! Three replicas behind nginx on one PostgreSQL, under faults. A mixed load (streamed and not,
//! some cancelled by the client; three keys: one with a token budget, one with an RPM limit,
//! one without limits) runs while one replica is SIGKILLed, another gets SIGTERM, and
//! PostgreSQL crashes and restarts. Afterwards: every request got an answer (or was cut only by
//! the SIGKILL), the ledger equals what the clients were told to the token, the budget and the
//! RPM limit held across replicas, and no reservation is left.
//!
//! `make test` runs the short form (tiny model, 20 s of load); `make test-cluster` runs it with
//! `GANTRY_CLUSTER_SECONDS` and `GANTRY_CLUSTER_MODEL` (a .gguf) set for a longer, real-model run.
//!
//! Also a routing simulation (no database or load balancer needed): a picker that scores two
//! replicas by their published load gauges, as the inference gateway's endpoint picker does,
//! sends no new request to the one with a long queue.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::cluster::{nginx_binary, start_replicas, Balance, Nginx, Replica};
use common::cluster_load::{load, Answer, Sent};
use common::metrics::{one, scrape, scrape_until, Sample};
use common::postgres::OwnPostgres;
use common::{gantry, long_streams, tiny_model, TestServer};
use serde_json::{json, Value};

const BUDGET_TOKENS: i64 = 6000;
const RPM: i64 = 40;
/// How long after its pre-admission (where the request is counted) a request may start.
const STRADDLE_MS: i64 = 5_000;

fn cli(url: &str, args: &[&str]) -> String {
    let out = gantry().args(args).args(["--database-url", url]).output().unwrap();
    assert!(out.status.success(), "gantry {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The tests here each run several replicas on the machine's cores: one at a time.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// nginx's binary when this test can run: PostgreSQL and nginx are there (or `make test`, which
/// promises both, fails the test); otherwise a visible skip.
fn prerequisites(test: &str) -> Option<std::path::PathBuf> {
    gantry_accounts::testing::postgres_admin_url_for(test)?;
    let nginx = nginx_binary();
    if nginx.is_none() {
        assert!(
            std::env::var("GANTRY_REQUIRE_NGINX").is_err(),
            "GANTRY_REQUIRE_NGINX is set but nginx is not installed"
        );
        eprintln!("SKIPPED (nginx): {test}: nginx is not installed (make test installs it)");
    }
    nginx
}

#[tokio::test]
async fn replicas_behind_a_load_balancer_keep_the_ledger_exact_through_kills_drains_and_a_database_crash() {
    let Some(nginx_bin) = prerequisites(
        "replicas_behind_a_load_balancer_keep_the_ledger_exact_through_kills_drains_and_a_database_crash",
    ) else {
        return;
    };
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
    let seconds: u64 = std::env::var("GANTRY_CLUSTER_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let model = std::env::var("GANTRY_CLUSTER_MODEL").ok().unwrap_or_else(|| tiny_model().display().to_string());

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let pg = OwnPostgres::start(&dir.path().join("pg"), common::cluster::free_port());
    let url = gantry_accounts::testing::fresh_postgres_database(&pg.admin_url()).await.unwrap();
    let create = |args: &[&str]| cli(&url, &[&["keys", "create"], args].concat()).trim().to_string();
    let secrets = vec![
        create(&["--name", "budgeted", "--budget-tokens", &BUDGET_TOKENS.to_string(), "--budget-period", "total"]),
        create(&["--name", "limited", "--rpm", &RPM.to_string()]),
        create(&["--name", "plain"]),
    ];
    let names = ["budgeted", "limited", "plain"];

    let args = [
        "--model",
        &model,
        "--database-url",
        &url,
        "--threads",
        "1",
        "--ctx-size",
        "4096",
        "--parallel",
        "4",
        // Well past the 1.5 s database outage below: a live replica's heartbeat must not look
        // stale to another's sweep when the database comes back.
        "--heartbeat-timeout",
        "10",
        "--drain-delay",
        "1",
        "--shutdown-grace",
        "10",
    ];
    let mut replicas = start_replicas(&["r1", "r2", "r3"], dir.path(), &args).await;
    let nginx = Nginx::start(
        &nginx_bin,
        dir.path(),
        &replicas.iter().map(Replica::addr).collect::<Vec<_>>(),
        Balance::LeastConnections,
    );
    let model_id = std::path::Path::new(&model).file_stem().unwrap().to_string_lossy().into_owned();

    let t0 = Instant::now();
    let at = |fraction: f64| t0 + Duration::from_secs_f64(seconds as f64 * fraction);
    let load = tokio::spawn(load(nginx.url("/v1/chat/completions"), secrets.clone(), model_id.clone(), 6, at(1.0)));

    // A long stream straight to the replica about to be killed (end of text banned on the tiny
    // model; a real model, the long form, is asked for something long): its client sees the cut,
    // and it is never billed. It starts when the kill is due and is struck once it is seen in
    // flight (a chunk streamed, the stream still open): started earlier, a fast machine could
    // finish it before the kill.
    let victim_base = format!("http://{}", replicas[0].addr());
    let bias = if std::env::var("GANTRY_CLUSTER_MODEL").is_ok() {
        json!({})
    } else {
        common::ban_special_tokens_at(&victim_base, &model_id, &secrets[2]).await
    };
    let ask = "Count from 1 to 5000, one number per line, and do not stop before 5000.";
    let victim_body = json!({
        "model": model_id, "messages": [{"role": "user", "content": ask}],
        "max_tokens": 4000, "stream": true, "logit_bias": bias,
    });

    // The faults, spread over the run.
    tokio::time::sleep_until(at(0.15).into()).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut resp = client
        .post(format!("{victim_base}/v1/chat/completions"))
        .bearer_auth(&secrets[2])
        .header("x-request-id", "victim")
        .json(&victim_body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.chunk().await.unwrap().expect("the victim stream starts");
    let (in_flight_tx, in_flight) = tokio::sync::oneshot::channel();
    let victim = tokio::spawn(async move {
        // One more chunk: it is producing tokens, not only holding its first frame.
        let outcome = match resp.chunk().await {
            Ok(Some(_)) => None,
            Ok(None) => Some("ended before the kill".to_string()),
            Err(e) => Some(format!("failed before the kill: {e}")),
        };
        let _ = in_flight_tx.send(());
        if let Some(outcome) = outcome {
            return outcome;
        }
        loop {
            match resp.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => return "ended".to_string(),
                Err(e) => return format!("cut: {e}"),
            }
        }
    });
    in_flight.await.unwrap();
    let killed_at = Instant::now();
    replicas[0].sigkill();
    let killed_addr = replicas[0].addr();
    let victim = victim.await.unwrap();
    assert!(victim.starts_with("cut"), "the stream on the killed replica was cut, not finished: {victim}");
    tokio::time::sleep_until(at(0.3).into()).await;
    replicas[1].sigterm();
    tokio::time::sleep_until(at(0.45).into()).await;
    pg.stop();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pg.run();
    tokio::time::sleep_until(at(0.6).into()).await;
    replicas[0].spawn(); // the killed replica comes back: same port, data dir and instance id
    let drained = replicas[1].wait_exit(Duration::from_secs(30)).await;
    assert!(drained.success(), "the drained replica exits 0: {drained:?}\n{}", replicas[1].log_tail());
    replicas[1].spawn();
    for r in &replicas {
        r.wait_ready().await;
    }
    let sent = load.await.unwrap();

    // 1. Every request got an answer; only requests in flight on the killed replica at the kill
    //    may have been cut.
    let mut counts: HashMap<String, usize> = HashMap::new();
    for s in &sent {
        let label = match &s.answer {
            Answer::Completed(_) => "completed".to_string(),
            Answer::Refused(status, code) => format!("{status} {code}"),
            Answer::StreamError => "stream error event".into(),
            Answer::Cancelled => "cancelled by the client".into(),
            Answer::Cut(_) => "cut by the SIGKILL".into(),
            Answer::Hung => panic!("{} hung: {s:?}", s.client_id),
            Answer::Unexpected(what) => {
                panic!("{} got an unexpected answer: {what}\nnginx: {}", s.client_id, nginx.error_log())
            }
        };
        if let Answer::Cut(why) = &s.answer {
            let in_flight = s.started <= killed_at && s.ended >= killed_at;
            let on_killed = s.upstream.is_empty() || s.upstream.contains(&killed_addr);
            assert!(
                in_flight && on_killed,
                "{} was cut ({why}) but was not in flight on the killed replica: {s:?}",
                s.client_id
            );
        }
        *counts.entry(label).or_default() += 1;
    }
    let completed = counts.get("completed").copied().unwrap_or(0);
    assert!(completed >= sent.len() / 4, "a good share of requests complete: {counts:?}");
    // Every replica answered, the killed one after its restart too.
    let served_by = |r: &Replica, after: Option<Instant>| {
        sent.iter().filter(|s| s.upstream.ends_with(&r.addr()) && after.is_none_or(|t| s.started > t)).count()
    };
    let per_replica: Vec<(String, usize)> = replicas.iter().map(|r| (r.name.clone(), served_by(r, None))).collect();
    assert!(per_replica.iter().all(|(_, n)| *n > 0), "{per_replica:?}");
    assert!(served_by(&replicas[0], Some(killed_at)) > 0, "the killed replica serves again after its restart");

    // 2. The ledger equals what clients were told; nothing is billed twice; cut and cancelled
    //    requests are billed at most their max_tokens (the killed replica's not at all).
    //    One exception, a window of a few milliseconds: a request the killed replica finished
    //    and journalled just before the kill, its answer not yet sent. nginx passes it on to
    //    the next replica (`proxy_next_upstream error … non_idempotent`, as docs/replicas.md
    //    configures it), whose answer the client gets: a refusal (the budget spent meanwhile) or
    //    a second run. The killed replica books its run when it comes back (its journal
    //    replays), so such a request may have one row more than its client was told of, at
    //    most its max_tokens.
    let passed_on_at_the_kill = |s: &Sent| {
        let tried: Vec<&str> = s.upstream.split(", ").collect();
        tried.len() > 1 && tried[0] == killed_addr && s.started <= killed_at && s.ended >= killed_at
    };
    let settle_deadline = Instant::now() + Duration::from_secs(90);
    let told: Vec<&Sent> = sent.iter().filter(|s| matches!(s.answer, Answer::Completed(_))).collect();
    let (rows, by_client) = loop {
        let rows: Vec<Value> = serde_json::from_str(&cli(&url, &["usage", "--requests", "--format", "json"])).unwrap();
        let mut by_client: HashMap<String, Vec<Value>> = HashMap::new();
        for r in &rows {
            if let Some(id) = r["client_request_id"].as_str() {
                by_client.entry(id.to_string()).or_default().push(r.clone());
            }
        }
        if told.iter().all(|s| by_client.contains_key(&s.client_id)) || Instant::now() > settle_deadline {
            break (rows, by_client);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(by_client.values().map(Vec::len).sum::<usize>(), rows.len(), "every row names its request");
    assert!(
        !by_client.contains_key("victim"),
        "the stream cut by the SIGKILL is billed nothing (its server never settled)"
    );
    let billed = |r: &Value| r["prompt_tokens"].as_u64().unwrap() + r["completion_tokens"].as_u64().unwrap();
    let within_max_tokens = |s: &Sent, r: &Value| r["completion_tokens"].as_u64().unwrap() <= s.kind.max_tokens();
    let mut mismatched = Vec::new();
    for s in &sent {
        let rows = by_client.get(&s.client_id).map_or(&[][..], Vec::as_slice);
        let passed_on = passed_on_at_the_kill(s);
        // One row more than the client was told of: the killed replica's run of a request
        // passed on.
        let extra = usize::from(passed_on);
        match &s.answer {
            Answer::Completed(t) if !rows.iter().any(|r| billed(r) == *t) || rows.len() > 1 + extra => {
                mismatched.push(format!("{}: told {t}, billed {rows:?}", s.client_id))
            }
            Answer::Refused(..) if rows.len() > extra || !rows.iter().all(|r| within_max_tokens(s, r)) => {
                mismatched.push(format!("{}: refused, yet billed {rows:?} (upstream {})", s.client_id, s.upstream))
            }
            Answer::Cut(_) | Answer::Cancelled | Answer::StreamError => {
                assert!(rows.len() <= 1 + extra, "{}: billed {} times: {rows:?}", s.client_id, rows.len());
                for r in rows {
                    assert!(within_max_tokens(s, r), "{}: {r}", s.client_id);
                }
            }
            _ => {}
        }
    }
    assert!(mismatched.is_empty(), "the ledger differs from what clients were told: {mismatched:#?}");
    let billed_total: u64 = rows.iter().map(billed).sum();
    let told_total: u64 = told.iter().map(|s| if let Answer::Completed(t) = s.answer { t } else { 0 }).sum();

    // 3. Budgets and the RPM limit held across replicas, and 4. no reservation is left.
    let mut reserved = vec![i64::MAX; names.len()];
    let mut spent = vec![0; names.len()];
    for _ in 0..120 {
        for (i, name) in names.iter().enumerate() {
            let v: Value = serde_json::from_str(&cli(&url, &["keys", "show", name, "--format", "json"])).unwrap();
            (spent[i], reserved[i]) =
                (v["spend"]["tokens"].as_i64().unwrap(), v["spend"]["reserved_tokens"].as_i64().unwrap());
        }
        if reserved.iter().all(|&r| r == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(reserved, vec![0; names.len()], "no reservation is left unsettled");
    assert!(spent[0] <= BUDGET_TOKENS, "the budgeted key spent {} of {BUDGET_TOKENS}", spent[0]);
    // A request is counted against its minute at pre-admission, before it is parsed and
    // prepared; its row's `started_at` is the full admission's, a little later. One counted in
    // a minute's last moments may start in the next, so rows that started in a minute's first
    // moments are not held against it.
    let mut per_minute: HashMap<i64, i64> = HashMap::new();
    for r in rows.iter().filter(|r| r["key_name"] == "limited") {
        let started = r["started_at_ms"].as_i64().unwrap();
        if started.rem_euclid(60_000) >= STRADDLE_MS {
            *per_minute.entry(started.div_euclid(60_000)).or_default() += 1;
        }
    }
    let busiest = per_minute.values().copied().max().unwrap_or(0);
    assert!(busiest <= RPM, "the limited key was admitted {busiest} times in one minute (limit {RPM}): {per_minute:?}");
    let limited_refusals =
        sent.iter().filter(|s| s.key == 1 && s.answer == Answer::Refused(429, "rate_limit_exceeded".into())).count();

    eprintln!(
        "cluster run: {} requests in {seconds} s through nginx over 3 replicas (one SIGKILLed, one drained, PostgreSQL crashed once)\n\
         answers: {counts:?}\n\
         answered by: {per_replica:?}; plus one long stream straight to r1, cut by the kill and billed nothing\n\
         ledger: {} rows, {billed_total} tokens; clients were told {told_total} tokens by {} completed requests, every one matched\n\
         budgeted key: spent {} of {BUDGET_TOKENS} tokens; limited key: at most {busiest} requests in a minute (limit {RPM}), {limited_refusals} refused with 429\n\
         reservations left: {reserved:?}",
        sent.len(),
        rows.len(),
        told.len(),
        spent[0],
    );
}

/// Prefix affinity: conversations of four turns, each with its own long system prompt, through
/// nginx hashing an `x-session-id` header and through plain least-connections. With affinity each
/// turn finds its conversation's prefix in the replica's cache; without, the next turn usually
/// lands on another replica and recomputes it.
#[tokio::test]
async fn a_session_header_hashed_by_the_load_balancer_brings_each_conversation_back_to_its_cache() {
    let Some(nginx_bin) =
        prerequisites("a_session_header_hashed_by_the_load_balancer_brings_each_conversation_back_to_its_cache")
    else {
        return;
    };
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let admin = gantry_accounts::testing::postgres_admin_url().unwrap();
    let url = gantry_accounts::testing::fresh_postgres_database(&admin).await.unwrap();
    let secret = cli(&url, &["keys", "create", "--name", "chat"]).trim().to_string();
    let model = tiny_model().display().to_string();
    let args = ["--model", &model, "--database-url", &url, "--threads", "1", "--ctx-size", "2048", "--parallel", "4"];
    let replicas = start_replicas(&["a1", "a2", "a3"], dir.path(), &args).await;
    let upstreams: Vec<String> = replicas.iter().map(Replica::addr).collect();
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap();
    let mut shares = Vec::new();
    for balance in [Balance::SessionAffinity, Balance::LeastConnections] {
        let nginx = Nginx::start(&nginx_bin, dir.path(), &upstreams, balance);
        let (mut cached, mut prompt) = (0, 0);
        for conversation in 0..6 {
            let session = format!("{balance:?}-{conversation}");
            let system: String = (0..60).map(|w| format!("{session} rule {w}; ")).collect();
            let mut messages = vec![json!({"role": "system", "content": system})];
            for turn in 0..4 {
                messages.push(json!({"role": "user", "content": format!("turn {turn}: go on")}));
                let body = json!({"model": "tiny-chatml", "messages": messages, "max_tokens": 8, "temperature": 0});
                let resp = client
                    .post(nginx.url("/v1/chat/completions"))
                    .bearer_auth(&secret)
                    .header("x-session-id", &session)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                let v: Value = resp.json().await.unwrap();
                if turn > 0 {
                    prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
                    cached += v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
                }
                messages.push(json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}));
            }
        }
        shares.push(cached as f64 / prompt as f64);
    }
    eprintln!(
        "prefix affinity: cached share of prompt tokens in turns 2-4 of 6 conversations over 3 replicas: {:.0}% with a hashed x-session-id, {:.0}% with least connections",
        shares[0] * 100.0,
        shares[1] * 100.0
    );
    assert!(shares[0] > 0.8, "with affinity nearly every later turn is cached: {shares:?}");
    assert!(shares[0] > shares[1] + 0.2, "affinity caches much more than least connections: {shares:?}");
}

/// Routes as the inference gateway's endpoint picker does with its queue and KV-cache scorers:
/// each replica's whole-server gauges scraped now, the one with the fewest requests waiting,
/// then the fewest running, then the lowest KV-cache utilisation (the first on a tie).
async fn pick(metrics: &[String]) -> usize {
    let mut best = (0, (f64::INFINITY, f64::INFINITY, f64::INFINITY));
    for (i, url) in metrics.iter().enumerate() {
        let m = scrape(url).await;
        let load = (
            one(&m, "gantry_requests_waiting").value,
            one(&m, "gantry_requests_running").value,
            one(&m, "gantry_kv_cache_utilization").value,
        );
        if load < best.1 {
            best = (i, load);
        }
    }
    best.0
}

/// One replica's metrics listener, from its banner.
fn metrics_url(s: &TestServer) -> String {
    s.stdout_lines
        .iter()
        .find_map(|l| l.strip_prefix("/metrics also at ")?.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| panic!("no metrics listener in {:?}", s.stdout_lines))
}

#[tokio::test]
async fn a_picker_reading_the_load_gauges_sends_nothing_to_a_replica_with_a_long_queue() {
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
    let args = ["--parallel", "1", "--ctx-size", "4096", "--metrics-listen", "127.0.0.1:0"];
    let replicas = [TestServer::start(&args), TestServer::start(&args)];
    let metrics: Vec<String> = replicas.iter().map(metrics_url).collect();
    let queued = |m: &[Sample]| one(m, "gantry_requests_waiting").value == 4.0;
    let idle = |m: &[Sample]| one(m, "gantry_requests_waiting").value + one(m, "gantry_requests_running").value == 0.0;
    // Each new request routed by the gauges as they stand, and answered where it was sent.
    let route = |busy: usize| {
        let (metrics, replicas) = (&metrics, &replicas);
        async move {
            let mut sent = Vec::new();
            for i in 0..4 {
                let to = pick(metrics).await;
                let body = json!({"model": replicas[to].model_id, "max_tokens": 4,
                                  "messages": [{"role": "user", "content": format!("hi {i}")}]});
                let resp = replicas[to].chat(body).send().await.unwrap();
                assert_eq!(resp.status(), 200, "request {i} sent to replica {to}");
                sent.push(to);
            }
            assert!(sent.iter().all(|&to| to != busy), "sent to the replica with the queue: {sent:?}");
        }
    };
    for busy in [0, 1] {
        // One answer runs on its one sequence, four wait.
        let held = long_streams(&replicas[busy], 5).await;
        scrape_until(&metrics[busy], "a long queue", queued).await;
        route(busy).await;
        // The queue is still there: the picker, not its end, kept requests away.
        let left = one(&scrape(&metrics[busy]).await, "gantry_requests_waiting").value;
        assert!(left > 0.0, "the queue drained during the test: it proves nothing");
        drop(held);
        scrape_until(&metrics[busy], "the queue gone once its clients left", idle).await;
    }
}
