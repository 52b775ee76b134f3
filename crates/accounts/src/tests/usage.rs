//! The usage ledger: each record written once and for a known key, summed by key, model, service
//! tier and batch.

use super::*;

fn usage(request_id: &str, key_id: i64, model: &str, p: u32, c: u32, o: u32) -> UsageRecord {
    UsageRecord {
        request_id: request_id.into(),
        client_request_id: None,
        key_id,
        model: model.into(),
        prompt_tokens: p,
        cached_tokens: c,
        completion_tokens: o,
        reasoning_tokens: 0,
        cost_nanos: 0,
        outcome: "completed".into(),
        service_tier: "default".into(),
        batch_id: None,
        started_at_ms: 1_700_000_000_000,
        finished_at_ms: 1_700_000_000_500,
    }
}

on_both!(usage_is_recorded_exactly_once, |acc: Accounts| async move {
    let k = acc.create_key("alice").await.unwrap();
    let rec = usage("req-1", k.key.id, "tiny", 10, 4, 7);
    acc.record_usage(&rec).await.unwrap();
    acc.record_usage(&rec).await.unwrap();
    // Same id, different numbers: still ignored.
    acc.record_usage(&usage("req-1", k.key.id, "tiny", 999, 0, 999)).await.unwrap();
    let summary = acc.usage_summary().await.unwrap();
    assert_eq!(
        summary,
        vec![UsageRow {
            key_id: k.key.id,
            key_name: "alice".into(),
            tenant: "default".into(),
            model: "tiny".into(),
            day: None,
            service_tier: "default".into(),
            batch_id: None,
            cost: 0.0,
            requests: 1,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 7,
            reasoning_tokens: 0,
        }]
    );
});

on_both!(usage_summary_sums_by_key_and_model, |acc: Accounts| async move {
    assert!(acc.usage_summary().await.unwrap().is_empty());
    let a = acc.create_key("alice").await.unwrap().key.id;
    let b = acc.create_key("bob").await.unwrap().key.id;
    // Reasoning tokens are part of the completion tokens, summed like cached ones.
    let thinking = |rec: UsageRecord, reasoning| UsageRecord { reasoning_tokens: reasoning, ..rec };
    acc.record_usage(&thinking(usage("r1", a, "m1", 10, 1, 5), 3)).await.unwrap();
    acc.record_usage(&thinking(usage("r2", a, "m1", 20, 2, 6), 4)).await.unwrap();
    acc.record_usage(&usage("r3", a, "m2", 30, 0, 7)).await.unwrap();
    acc.record_usage(&thinking(usage("r4", b, "m1", u32::MAX, u32::MAX, u32::MAX), u32::MAX)).await.unwrap();
    acc.record_usage(&thinking(usage("r5", b, "m1", u32::MAX, 0, 1), 1)).await.unwrap();

    let row = |k: &str, m: &str, r, p, c, o, t| UsageRow {
        key_id: if k == "alice" { a } else { b },
        key_name: k.into(),
        tenant: "default".into(),
        model: m.into(),
        day: None,
        service_tier: "default".into(),
        batch_id: None,
        cost: 0.0,
        requests: r,
        prompt_tokens: p,
        cached_tokens: c,
        completion_tokens: o,
        reasoning_tokens: t,
    };
    let max = u64::from(u32::MAX);
    assert_eq!(
        acc.usage_summary().await.unwrap(),
        vec![
            row("alice", "m1", 2, 30, 3, 11, 7),
            row("alice", "m2", 1, 30, 0, 7, 0),
            row("bob", "m1", 2, 2 * max, max, max + 1, max + 1),
        ]
    );
});

on_both!(keys_sharing_a_name_are_reported_apart, |acc: Accounts| async move {
    let first = acc.create_key("team").await.unwrap().key.id;
    let second = acc.create_key("team").await.unwrap().key.id;
    acc.record_usage(&usage("r1", first, "m", 10, 0, 1)).await.unwrap();
    acc.record_usage(&usage("r2", second, "m", 20, 0, 2)).await.unwrap();
    let rows = acc.usage_summary().await.unwrap();
    let seen: Vec<(i64, &str, u64)> = rows.iter().map(|r| (r.key_id, r.key_name.as_str(), r.prompt_tokens)).collect();
    assert_eq!(seen, [(first, "team", 10), (second, "team", 20)]);
});

on_both!(usage_for_unknown_key_is_rejected, |acc: Accounts| async move {
    let err = acc.record_usage(&usage("r1", 12345, "m", 1, 0, 1)).await;
    assert!(matches!(err, Err(AccountsError::NotFound(_))), "{err:?}");
    assert!(acc.usage_summary().await.unwrap().is_empty());
});

on_both!(usage_is_reported_by_service_tier, |acc: Accounts| async move {
    let a = acc.create_key("alice").await.unwrap().key.id;
    let tier = |rec: UsageRecord, tier: &str| UsageRecord { service_tier: tier.into(), cost_nanos: 10, ..rec };
    acc.record_usage(&tier(usage("t1", a, "m", 10, 0, 5), "default")).await.unwrap();
    acc.record_usage(&tier(usage("t2", a, "m", 20, 0, 6), "flex")).await.unwrap();
    acc.record_usage(&tier(usage("t3", a, "m", 30, 0, 7), "flex")).await.unwrap();
    let rows: Vec<_> =
        acc.usage_summary().await.unwrap().into_iter().map(|r| (r.service_tier, r.requests, r.prompt_tokens)).collect();
    assert_eq!(rows, [("default".to_string(), 1, 10), ("flex".to_string(), 2, 50)]);
    let requests = acc.usage_requests(&UsageQuery::default()).await.unwrap();
    let tiers: Vec<_> = requests.iter().map(|r| (r.request_id.as_str(), r.service_tier.as_str())).collect();
    assert_eq!(tiers, [("t1", "default"), ("t2", "flex"), ("t3", "flex")]);
});

on_both!(usage_is_reported_and_filtered_by_batch, |acc: Accounts| async move {
    let a = acc.create_key("alice").await.unwrap().key.id;
    let line = |rec: UsageRecord, batch: &str| UsageRecord {
        service_tier: "batch".into(),
        batch_id: Some(batch.into()),
        cost_nanos: 5,
        ..rec
    };
    acc.record_usage(&usage("i1", a, "m", 10, 0, 5)).await.unwrap();
    acc.record_usage(&line(usage("b1", a, "m", 20, 0, 6), "batch_b")).await.unwrap();
    acc.record_usage(&line(usage("b2", a, "m", 30, 0, 7), "batch_a")).await.unwrap();
    acc.record_usage(&line(usage("b3", a, "m", 40, 0, 8), "batch_a")).await.unwrap();
    // Each batch's lines are a row of their own, after the requests outside any batch.
    let accounts = &acc;
    let summary = |q: UsageQuery| async move {
        let rows = accounts.usage_report(&q).await.unwrap();
        rows.into_iter().map(|r| (r.service_tier, r.batch_id, r.requests, r.prompt_tokens, r.cost)).collect::<Vec<_>>()
    };
    let tiered = |tier: &str, batch: Option<&str>, n, p, cost| (tier.to_string(), batch.map(String::from), n, p, cost);
    assert_eq!(
        summary(UsageQuery::default()).await,
        [
            tiered("batch", Some("batch_a"), 2, 70, 10e-9),
            tiered("batch", Some("batch_b"), 1, 20, 5e-9),
            tiered("default", None, 1, 10, 0.0)
        ]
    );
    let one = UsageQuery { batch_id: Some("batch_a".into()), ..Default::default() };
    assert_eq!(summary(one.clone()).await, [tiered("batch", Some("batch_a"), 2, 70, 10e-9)]);
    let by_day = summary(UsageQuery { by_day: true, ..one.clone() }).await;
    assert_eq!(by_day, [tiered("batch", Some("batch_a"), 2, 70, 10e-9)]);
    assert!(summary(UsageQuery { batch_id: Some("batch_none".into()), ..Default::default() }).await.is_empty());
    let requests = acc.usage_requests(&one).await.unwrap();
    let ids: Vec<_> = requests.iter().map(|r| (r.request_id.as_str(), r.batch_id.as_deref())).collect();
    assert_eq!(ids, [("b2", Some("batch_a")), ("b3", Some("batch_a"))]);
});
