//! The meter: a ticket settled books once and a dropped one releases; outbox entries of a dead
//! process are replayed; dead servers lose their reservations; rate limits count what they must.

use std::future::Future;
use std::time::Duration;

use super::*;

fn config(dir: &std::path::Path) -> MeterConfig {
    MeterConfig {
        instance_name: "test-host".into(),
        outbox_dir: dir.join("outbox"),
        // Long enough that a live meter on a loaded CI machine never misses it (its heartbeat is
        // written every 500 ms); a server with no heartbeat row is swept at the first tick anyway.
        heartbeat_timeout: Duration::from_secs(2),
        reservation_ttl: Duration::from_secs(6 * 3600),
        default_limits: DefaultLimits::default(),
    }
}

fn charge(id: &str, client: Option<&str>) -> Charge {
    Charge {
        request_id: id.into(),
        client_request_id: client.map(Into::into),
        model: "tiny".into(),
        price: Price::default(),
        service_tier: "default",
        batch_id: None,
        prompt_tokens: 10,
        max_completion_tokens: 90,
    }
}

async fn budgeted(acc: &Accounts) -> KeyInfo {
    let spec =
        NewKey { name: "k".into(), budget: Budget { tokens: Some(1_000), ..Default::default() }, ..Default::default() };
    acc.create_key_from(&spec).await.unwrap().key
}

/// Polls `check` until it holds (the outbox drains in the background).
async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

async fn reserved(acc: &Accounts, key: &KeyInfo) -> i64 {
    acc.spend(key, chrono_now()).await.unwrap().reserved_tokens
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

on_both!(a_dropped_ticket_releases_and_a_settled_one_books_once, |acc: Accounts| async move {
    let dir = tempfile::tempdir().unwrap();
    let meter = Meter::start(acc.clone(), config(dir.path())).await.unwrap();
    let key = budgeted(&acc).await;
    let ticket = meter.admit(&key, charge("r1", Some("same"))).await.unwrap();
    assert_eq!(reserved(&acc, &key).await, 100);
    // A handler dropped before the engine ever saw the request (client gone, queue full).
    drop(ticket);
    eventually("the dropped ticket's reservation is released", || async { reserved(&acc, &key).await == 0 }).await;

    // Two requests carrying the same client id are two ledger rows.
    for id in ["r2", "r3"] {
        let t = meter.admit(&key, charge(id, Some("same"))).await.unwrap();
        t.settle(Settlement {
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 5,
            reasoning_tokens: 0,
            outcome: Outcome::Completed,
        });
    }
    eventually("both settlements are stored", || async {
        acc.spend(&key, chrono_now()).await.unwrap().spent_tokens == 30
    })
    .await;
    assert_eq!(reserved(&acc, &key).await, 0);
    let rows = acc.usage_requests(&UsageQuery::default()).await.unwrap();
    let ids: Vec<(&str, Option<&str>)> =
        rows.iter().map(|r| (r.request_id.as_str(), r.client_request_id.as_deref())).collect();
    assert_eq!(ids, [("r2", Some("same")), ("r3", Some("same"))]);
    assert_eq!((rows[0].outcome.as_str(), rows[0].prompt_tokens, rows[0].completion_tokens), ("completed", 10, 5));
    meter.shutdown(Duration::from_secs(5)).await;
    assert_eq!(meter.pending(), 0);
    assert_eq!(std::fs::metadata(dir.path().join("outbox").join(format!("{}.jsonl", meter.owner()))).unwrap().len(), 0);
});

on_both!(reasoning_tokens_reach_the_ledger_and_the_daily_summary, |acc: Accounts| async move {
    let dir = tempfile::tempdir().unwrap();
    let meter = Meter::start(acc.clone(), config(dir.path())).await.unwrap();
    let key = budgeted(&acc).await;
    let priced = Charge {
        price: Price { input_per_mtok: 1.0, output_per_mtok: 2.0, cached_input_per_mtok: None },
        service_tier: "default",
        batch_id: None,
        ..charge("thinker", None)
    };
    let t = meter.admit(&key, priced).await.unwrap();
    // 7 of the 12 completion tokens were thinking: billed as completion tokens all the same.
    let used = Settlement {
        prompt_tokens: 10,
        cached_tokens: 0,
        completion_tokens: 12,
        reasoning_tokens: 7,
        outcome: Outcome::Completed,
    };
    t.settle(used);
    eventually("the settlement is stored", || async {
        acc.spend(&key, chrono_now()).await.unwrap().spent_tokens == 22
    })
    .await;
    let rows = acc.usage_requests(&UsageQuery::default()).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].completion_tokens, rows[0].reasoning_tokens), (12, 7));
    // 10 × $1/M + 12 × $2/M: the reasoning tokens cost nothing extra.
    assert_eq!(rows[0].cost, 34e-6);
    let days = acc.usage_report(&UsageQuery { by_day: true, ..Default::default() }).await.unwrap();
    assert_eq!(days.len(), 1);
    assert!(days[0].day.is_some());
    assert_eq!((days[0].completion_tokens, days[0].reasoning_tokens), (12, 7));
    meter.shutdown(Duration::from_secs(5)).await;
});

on_both!(outbox_entries_left_by_a_dead_process_are_replayed_at_start, |acc: Accounts| async move {
    let dir = tempfile::tempdir().unwrap();
    let key = budgeted(&acc).await;
    // A process reserved, journalled its settlement, and died before the database took it.
    acc.reserve(
        &key,
        &Reservation { request_id: "lost".into(), tokens: 100, nanos: 0, owner: "dead-1".into(), at_ms: chrono_now() },
    )
    .await
    .unwrap();
    {
        let outbox = crate::outbox::Outbox::open(&dir.path().join("outbox"), "dead-1").unwrap();
        let record = UsageRecord {
            request_id: "lost".into(),
            client_request_id: None,
            key_id: key.id,
            model: "tiny".into(),
            prompt_tokens: 7,
            cached_tokens: 0,
            completion_tokens: 3,
            reasoning_tokens: 0,
            cost_nanos: 0,
            outcome: "completed".into(),
            service_tier: "default".into(),
            batch_id: None,
            started_at_ms: chrono_now(),
            finished_at_ms: chrono_now(),
        };
        outbox.append(crate::outbox::Entry::Settle { record }).unwrap();
    }
    let meter = Meter::start(acc.clone(), config(dir.path())).await.unwrap();
    eventually("the journalled settlement reaches the ledger", || async {
        acc.spend(&key, chrono_now()).await.unwrap().spent_tokens == 10
    })
    .await;
    eventually("and its reservation is gone", || async { reserved(&acc, &key).await == 0 }).await;
    assert_eq!(acc.usage_requests(&UsageQuery::default()).await.unwrap().len(), 1);
    assert!(!dir.path().join("outbox/dead-1.jsonl").exists());
    meter.shutdown(Duration::from_secs(5)).await;
});

on_both!(live_servers_keep_their_reservations_and_dead_ones_lose_them, |acc: Accounts| async move {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Two servers with the same instance name: their identities still differ.
    let a = Meter::start(acc.clone(), config(dir_a.path())).await.unwrap();
    let b = Meter::start(acc.clone(), config(dir_b.path())).await.unwrap();
    assert_ne!(a.owner(), b.owner());
    assert!(a.owner().starts_with("test-host-"));
    let key = budgeted(&acc).await;
    let held = a.admit(&key, charge("live", None)).await.unwrap();
    // A server that died holds a reservation too (no heartbeat row).
    acc.reserve(
        &key,
        &Reservation {
            request_id: "ghost".into(),
            tokens: 50,
            nanos: 0,
            owner: "gone-1234".into(),
            at_ms: chrono_now(),
        },
    )
    .await
    .unwrap();
    // The sweep runs every heartbeat period and may already have released the ghost's 50 here
    // (a fresh-clone `make test` saw 100): held 150, or 100 once swept; never less.
    let now = reserved(&acc, &key).await;
    assert!(now == 150 || now == 100, "reserved {now}");
    eventually("the dead server's reservation is released", || async { reserved(&acc, &key).await == 100 }).await;
    // Several heartbeat periods later, the live server's reservation is still held.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(reserved(&acc, &key).await, 100);
    held.settle(Settlement {
        prompt_tokens: 10,
        cached_tokens: 0,
        completion_tokens: 1,
        reasoning_tokens: 0,
        outcome: Outcome::Completed,
    });
    eventually("settled", || async { reserved(&acc, &key).await == 0 }).await;
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
});

on_both!(a_caller_dropped_during_admission_leaves_no_reservation, |acc: Accounts| async move {
    let dir = tempfile::tempdir().unwrap();
    let meter = Meter::start(acc.clone(), config(dir.path())).await.unwrap();
    let key = budgeted(&acc).await;
    // Polled once (admission starts), then dropped: the client went away mid-admission.
    let mut cut = Box::pin(meter.admit(&key, charge("cut", None)));
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(cut.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "admission cannot finish within one poll");
    drop(cut);
    eventually("admission ran to the end and its ticket released the reservation", || async {
        let rows: Vec<(i64,)> = sqlx::query_as("SELECT reserved_tokens FROM key_spend WHERE key_id = $1")
            .bind(key.id)
            .fetch_all(&acc.pool)
            .await
            .unwrap();
        let held: Vec<(String,)> =
            sqlx::query_as("SELECT request_id FROM reservations").fetch_all(&acc.pool).await.unwrap();
        rows == [(0,)] && held.is_empty() && meter.pending() == 0
    })
    .await;
    meter.shutdown(Duration::from_secs(5)).await;
});

on_both!(requests_cancelled_before_they_start_still_count_against_the_rpm_limit, |acc: Accounts| async move {
    let dir = tempfile::tempdir().unwrap();
    let meter = Meter::start(acc.clone(), config(dir.path())).await.unwrap();
    let spec = NewKey {
        name: "k".into(),
        rpm_limit: Some(3),
        budget: Budget { tokens: Some(1_000), ..Default::default() },
        ..Default::default()
    };
    let key = acc.create_key_from(&spec).await.unwrap().key;
    // Three requests queued and cancelled before the engine started them: settled as cancelled
    // with nothing used (the engine's report), or dropped unsettled (the handler went away).
    for id in ["q1", "q2"] {
        let t = meter.admit(&key, charge(id, None)).await.unwrap();
        t.settle(Settlement {
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            reasoning_tokens: 0,
            outcome: Outcome::Cancelled,
        });
    }
    drop(meter.admit(&key, charge("q3", None)).await.unwrap());
    eventually("the cancelled requests hold no budget", || async { reserved(&acc, &key).await == 0 }).await;
    assert_eq!(acc.spend(&key, chrono_now()).await.unwrap().spent_tokens, 0, "nothing ran, nothing is billed");
    // They were requests all the same: the fourth within the minute is refused.
    match meter.admit(&key, charge("q4", None)).await {
        Err(Refused { reason: Refusal::RateLimited(RateRefusal::Requests { limit: 3, .. }), .. }) => {}
        Err(other) => panic!("refused for another reason: {:?}", other.reason),
        Ok(_) => panic!("a key that cancelled its whole RPM allowance was admitted again"),
    }
    meter.shutdown(Duration::from_secs(5)).await;
});

on_both!(a_request_its_budget_refuses_uses_none_of_the_tokens_per_minute, |acc: Accounts| async move {
    let dir = tempfile::tempdir().unwrap();
    let meter = Meter::start(acc.clone(), config(dir.path())).await.unwrap();
    let spec = NewKey {
        name: "k".into(),
        tpm_limit: Some(250),
        budget: Budget { tokens: Some(150), ..Default::default() },
        ..Default::default()
    };
    let key = acc.create_key_from(&spec).await.unwrap().key;
    // Each charge counts 100 tokens: the first fits the budget, the second does not.
    let first = meter.admit(&key, charge("a", None)).await.unwrap();
    let Err(refused) = meter.admit(&key, charge("b", None)).await else { panic!("the budget admits one request") };
    assert!(matches!(refused.reason, Refusal::Quota(_)), "{:?}", refused.reason);
    assert_eq!(refused.rate.tokens.map(|t| t.remaining), Some(150), "the refused request's tokens came back");
    drop(first);
    eventually("the first reservation is released", || async { reserved(&acc, &key).await == 0 }).await;
    // Within the same minute: 100 + 100 counted of 250, not 300.
    if let Err(third) = meter.admit(&key, charge("c", None)).await {
        panic!("100 + 100 of 250 tokens a minute: {:?}", third.reason);
    }
    meter.shutdown(Duration::from_secs(5)).await;
});

// A replica whose own clock is 45 s ahead reads the database's time on PostgreSQL, which every
// replica shares: its heartbeats, cutoffs and rate minutes agree with its peers'. SQLite's
// database is on this machine, whose clock it keeps.
on_both!(the_meters_clock_is_the_databases, |acc: Accounts| async move {
    let clock = crate::metering::clock::DbClock::skewed(45_000);
    clock.sync(&acc).await.unwrap();
    let local = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let off = clock.now_ms() - local;
    match acc.backend() {
        crate::Backend::Postgres => assert!(off.abs() < 2_000, "{off} ms off the database"),
        crate::Backend::Sqlite => assert!((off - 45_000).abs() < 2_000, "{off} ms"),
    }
});
