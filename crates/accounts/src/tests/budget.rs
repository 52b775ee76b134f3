//! Budgets and keys: reservations never overspend a budget, settle once, are freed when released
//! or crashed, and reset with their period; keys are updated, rotated, expired and restricted;
//! the usage report and the shared rate windows.

use std::sync::Arc;

use super::*;

fn reservation(id: &str, tokens: i64, nanos: i64) -> Reservation {
    Reservation { request_id: id.into(), tokens, nanos, owner: "test-host".into(), at_ms: 1_800_000_000_000 }
}

fn record(id: &str, key_id: i64, prompt: u32, completion: u32, cost_nanos: i64) -> UsageRecord {
    UsageRecord {
        request_id: id.into(),
        client_request_id: None,
        key_id,
        model: "tiny".into(),
        prompt_tokens: prompt,
        cached_tokens: 0,
        completion_tokens: completion,
        reasoning_tokens: 0,
        cost_nanos,
        outcome: "completed".into(),
        service_tier: "default".into(),
        batch_id: None,
        started_at_ms: 1_800_000_000_000,
        finished_at_ms: 1_800_000_000_100,
    }
}

async fn key_with_budget(acc: &Accounts, tokens: Option<i64>, nanos: Option<i64>) -> KeyInfo {
    let spec = NewKey {
        name: "budgeted".into(),
        tenant: Some("acme".into()),
        budget: Budget { tokens, nanos, period: BudgetPeriod::Total },
        ..Default::default()
    };
    acc.create_key_from(&spec).await.unwrap().key
}

on_both!(concurrent_reservations_never_exceed_the_budget, |acc: Accounts| async move {
    // Room for exactly 30 requests of 100 tokens.
    let key = Arc::new(key_with_budget(&acc, Some(3_000), None).await);
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (acc, key) = (acc.clone(), key.clone());
        tasks.push(tokio::spawn(async move { acc.reserve(&key, &reservation(&format!("r{i}"), 100, 0)).await }));
    }
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => admitted += 1,
            Err(AccountsError::QuotaExceeded(m)) => assert!(m.contains("quota"), "{m}"),
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(admitted, 30);
    let spend = acc.spend(&key, 1_800_000_000_000).await.unwrap();
    assert_eq!(spend.reserved_tokens, 3_000);
    assert_eq!(spend.spent_tokens, 0);
});

on_both!(settlement_moves_reservation_to_spend_once, |acc: Accounts| async move {
    let key = key_with_budget(&acc, Some(1_000), None).await;
    acc.reserve(&key, &reservation("a", 600, 0)).await.unwrap();
    // 600 of 1000 held: another 600 does not fit.
    assert!(matches!(acc.reserve(&key, &reservation("b", 600, 0)).await, Err(AccountsError::QuotaExceeded(_))));
    // It actually used 150; settling twice books it once.
    acc.record_usage(&record("a", key.id, 100, 50, 0)).await.unwrap();
    acc.record_usage(&record("a", key.id, 100, 50, 0)).await.unwrap();
    let spend = acc.spend(&key, 1_800_000_000_000).await.unwrap();
    assert_eq!((spend.spent_tokens, spend.reserved_tokens), (150, 0));
    acc.reserve(&key, &reservation("b", 600, 0)).await.unwrap();
    let rows = acc.usage_summary().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].requests, rows[0].tenant.as_str()), (1, "acme"));
});

on_both!(changing_the_budget_period_keeps_what_the_key_spent, |acc: Accounts| async move {
    let key = key_with_budget(&acc, Some(1_000), None).await;
    let (at, next_month) = (1_800_000_000_000, 1_800_000_000_000 + 40 * 86_400_000);
    acc.reserve(&key, &reservation("a", 600, 0)).await.unwrap();
    acc.record_usage(&record("a", key.id, 100, 300, 0)).await.unwrap();
    // Monthly now: this month's 400 count, the next month starts afresh.
    let monthly = KeyInfo { budget: Budget { period: BudgetPeriod::Month, ..key.budget }, ..key.clone() };
    assert_eq!(acc.spend(&monthly, at).await.unwrap().spent_tokens, 400);
    assert_eq!(acc.spend(&monthly, next_month).await.unwrap().spent_tokens, 0);
    acc.reserve(&monthly, &reservation("b", 100, 0)).await.unwrap();
    acc.record_usage(&record("b", key.id, 50, 50, 0)).await.unwrap();
    assert_eq!(acc.spend(&monthly, at).await.unwrap().spent_tokens, 500);
    // Back to the lifetime budget: everything spent under either counts.
    assert_eq!(acc.spend(&key, at).await.unwrap().spent_tokens, 500);
    assert!(matches!(acc.reserve(&key, &reservation("c", 600, 0)).await, Err(AccountsError::QuotaExceeded(_))));
});

on_both!(money_budget_and_cost, |acc: Accounts| async move {
    let price = Price { input_per_mtok: 1.0, output_per_mtok: 2.0, cached_input_per_mtok: None };
    // 1000 prompt + 1000 completion tokens = $0.003.
    assert_eq!(price.cost_nanos(1_000, 0, 1_000), 3_000_000);
    assert_eq!(price.cost_nanos(1_000, 600, 1_000), 3_000_000, "no cached price: cached tokens cost the input price");
    let discounted = Price { cached_input_per_mtok: Some(0.1), ..price };
    // 400 uncached at $1 + 600 cached at $0.10 + 1000 completion at $2 per million.
    assert_eq!(discounted.cost_nanos(1_000, 600, 1_000), 400_000 + 60_000 + 2_000_000);
    assert_eq!(discounted.cost_nanos(10, 50, 0), 1_000, "never more cached tokens than the prompt");
    let key = key_with_budget(&acc, None, Some(5_000_000)).await;
    acc.reserve(&key, &reservation("a", 2_000, 3_000_000)).await.unwrap();
    let err = acc.reserve(&key, &reservation("b", 2_000, 3_000_000)).await.unwrap_err();
    assert!(matches!(&err, AccountsError::QuotaExceeded(m) if m.contains('$')), "{err}");
    acc.record_usage(&record("a", key.id, 1_000, 1_000, 3_000_000)).await.unwrap();
    let rows = acc.usage_summary().await.unwrap();
    assert!((rows[0].cost - 0.003).abs() < 1e-12);
});

on_both!(released_and_crashed_reservations_free_the_budget, |acc: Accounts| async move {
    let key = key_with_budget(&acc, Some(1_000), None).await;
    acc.reserve(&key, &reservation("a", 500, 0)).await.unwrap();
    acc.release("a").await.unwrap();
    acc.release("a").await.unwrap();
    let mut other = reservation("b", 700, 0);
    other.owner = "other-host".into();
    acc.reserve(&key, &other).await.unwrap();
    acc.reserve(&key, &reservation("c", 300, 0)).await.unwrap();
    // This host restarts: only its own reservation goes.
    assert_eq!(acc.release_reservations_of("test-host").await.unwrap(), 1);
    let spend = acc.spend(&key, 1_800_000_000_000).await.unwrap();
    assert_eq!(spend.reserved_tokens, 700);
    // The other host never comes back: its reservation expires by age.
    assert_eq!(acc.release_reservations_before(1_800_000_000_000).await.unwrap(), 0);
    assert_eq!(acc.release_reservations_before(1_800_000_000_001).await.unwrap(), 1);
    assert_eq!(acc.spend(&key, 1_800_000_000_000).await.unwrap().reserved_tokens, 0);
});

on_both!(monthly_budgets_reset_each_month, |acc: Accounts| async move {
    let spec = NewKey {
        name: "monthly".into(),
        budget: Budget { tokens: Some(100), nanos: None, period: BudgetPeriod::Month },
        ..Default::default()
    };
    let key = acc.create_key_from(&spec).await.unwrap().key;
    let nov = 1_795_000_000_000; // 2026-11
    let dec = nov + 31 * 24 * 3600 * 1000;
    assert_eq!(BudgetPeriod::Month.bucket(nov), "2026-11");
    let mut r = reservation("n1", 100, 0);
    r.at_ms = nov;
    acc.reserve(&key, &r).await.unwrap();
    r.request_id = "n2".into();
    assert!(acc.reserve(&key, &r).await.is_err());
    r.at_ms = dec;
    acc.reserve(&key, &r).await.unwrap();
});

on_both!(keys_update_rotate_expire_and_restrict_models, |acc: Accounts| async move {
    let created = acc
        .create_key_from(&NewKey {
            name: "k".into(),
            allowed_models: Some(vec!["a".into()]),
            expires_at: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let k = acc.authenticate(&created.secret).await.unwrap().unwrap();
    assert!(k.is_expired() && k.allows_model("a") && !k.allows_model("b"));
    let update = KeyUpdate {
        expires_at: Some(None),
        allowed_models: Some(None),
        rpm_limit: Some(Some(5)),
        tenant: Some("t2".into()),
        ..Default::default()
    };
    let k = acc.update_key("k", &update).await.unwrap();
    assert!(!k.is_expired() && k.allows_model("b"));
    assert_eq!((k.rpm_limit, k.tenant.as_str(), k.name.as_str()), (Some(5), "t2", "k"));
    let rotated = acc.rotate_key(&k.id.to_string()).await.unwrap();
    assert_eq!(rotated.key.id, k.id);
    assert!(acc.authenticate(&created.secret).await.unwrap().is_none());
    assert_eq!(acc.authenticate(&rotated.secret).await.unwrap().unwrap().id, k.id);
    assert!(matches!(
        acc.update_key("k", &KeyUpdate { rpm_limit: Some(Some(0)), ..Default::default() }).await,
        Err(AccountsError::Invalid(_))
    ));
});

on_both!(usage_report_filters_and_groups_by_day, |acc: Accounts| async move {
    let key = key_with_budget(&acc, None, None).await;
    let day = 24 * 3600 * 1000;
    for (i, start) in [1_800_000_000_000, 1_800_000_000_000 + day, 1_800_000_000_000 + day].iter().enumerate() {
        let mut r = record(&format!("u{i}"), key.id, 10, 5, 0);
        r.started_at_ms = *start;
        acc.record_usage(&r).await.unwrap();
    }
    let by_day = acc.usage_report(&UsageQuery { by_day: true, ..Default::default() }).await.unwrap();
    assert_eq!(by_day.iter().map(|r| r.requests).collect::<Vec<_>>(), vec![1, 2]);
    assert!(by_day[0].day.as_deref().unwrap() < by_day[1].day.as_deref().unwrap());
    let since =
        acc.usage_report(&UsageQuery { since_ms: Some(1_800_000_000_000 + day), ..Default::default() }).await.unwrap();
    assert_eq!((since[0].requests, since[0].prompt_tokens), (2, 20));
    let none = acc.usage_report(&UsageQuery { key_name: Some("nobody".into()), ..Default::default() }).await.unwrap();
    assert!(none.is_empty());
});

on_both!(shared_rate_windows_count_per_minute, |acc: Accounts| async move {
    let key = key_with_budget(&acc, None, None).await;
    let t0: i64 = 1_800_000_000_000; // a minute boundary
    for i in 1..=3 {
        let w = acc.rate_admit(key.id, t0 + i, 10, Some(3), Some(100)).await.unwrap();
        assert!(w.admitted);
        assert_eq!((w.requests, w.tokens), (i, 10 * i));
    }
    let refused = acc.rate_admit(key.id, t0 + 10, 10, Some(3), Some(100)).await.unwrap();
    assert!(!refused.admitted);
    assert_eq!(refused.requests, 3);
    assert_eq!(refused.reset_ms, 60_000 - 10);
    // Tokens: 30 used, 80 more would pass 100.
    let too_big = acc.rate_admit(key.id, t0 + 20, 80, None, Some(100)).await.unwrap();
    assert!(!too_big.admitted);
    // The next minute starts afresh.
    assert!(acc.rate_admit(key.id, t0 + 60_000, 10, Some(3), Some(100)).await.unwrap().admitted);
});

on_both!(shared_windows_count_a_pre_admitted_request_once, |acc: Accounts| async move {
    let key = key_with_budget(&acc, None, None).await;
    let t0: i64 = 1_800_000_000_000; // a minute boundary
    let (rpm, tpm) = (Some(2), Some(100));
    let (status, verdict) =
        crate::rate::admit_shared(&acc.pool, key.id, rpm, tpm, crate::Count::Request, t0).await.unwrap();
    assert!(verdict.is_ok());
    assert_eq!(status.requests.unwrap().remaining, 1);
    let (status, verdict) =
        crate::rate::admit_shared(&acc.pool, key.id, rpm, tpm, crate::Count::Tokens(100), t0 + 1).await.unwrap();
    assert!(verdict.is_ok());
    assert_eq!((status.requests.unwrap().remaining, status.tokens.unwrap().remaining), (1, 0));
    // No token left: refused before its size is known, and not counted.
    let (status, verdict) =
        crate::rate::admit_shared(&acc.pool, key.id, rpm, tpm, crate::Count::Request, t0 + 2).await.unwrap();
    assert!(matches!(verdict, Err(crate::RateRefusal::Tokens { limit: 100, .. })), "{verdict:?}");
    assert_eq!(status.requests.unwrap().remaining, 1);
});
