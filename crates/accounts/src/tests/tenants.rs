//! Share weights: a key's own, and its tenant's as every key of the tenant reads it.

use super::*;

on_both!(weights_are_stored_validated_and_read_with_each_key, |acc: Accounts| async move {
    let plain = acc.create_key("plain").await.unwrap();
    assert_eq!((plain.key.weight, plain.key.tenant_weight), (1, 1), "unset, both weigh 1");
    let spec = NewKey { name: "big".into(), tenant: Some("acme".into()), weight: Some(4), ..Default::default() };
    let big = acc.create_key_from(&spec).await.unwrap();
    assert_eq!((big.key.weight, big.key.tenant_weight), (4, 1));
    for bad in [0, -1, MAX_WEIGHT + 1] {
        let spec = NewKey { name: "bad".into(), weight: Some(bad), ..Default::default() };
        let err = acc.create_key_from(&spec).await.unwrap_err().to_string();
        assert!(err.contains("weight"), "{bad}: {err}");
        let update = KeyUpdate { weight: Some(bad), ..Default::default() };
        assert!(acc.update_key("big", &update).await.is_err(), "{bad}");
        assert!(acc.set_tenant_weight("acme", bad).await.is_err(), "{bad}");
    }
    // The tenant's weight reaches every key of it, on every path that reads a key.
    let acme = acc.set_tenant_weight("acme", 3).await.unwrap();
    assert_eq!((acme.name.as_str(), acme.weight, acme.active_keys), ("acme", 3, 1));
    assert_eq!(acc.authenticate(&big.secret).await.unwrap().unwrap().tenant_weight, 3);
    assert_eq!(acc.find_key("big").await.unwrap().tenant_weight, 3);
    let moved = KeyUpdate { tenant: Some("acme".into()), weight: Some(2), ..Default::default() };
    let plain = acc.update_key("plain", &moved).await.unwrap();
    assert_eq!((plain.weight, plain.tenant_weight), (2, 3), "read back as the update returns it");
    let spec = NewKey { name: "second".into(), tenant: Some("acme".into()), ..Default::default() };
    assert_eq!(acc.create_key_from(&spec).await.unwrap().key.tenant_weight, 3, "a new key of it");
    // Set again, the weight changes; another tenant's keys are untouched.
    acc.set_tenant_weight("acme", 5).await.unwrap();
    let other = NewKey { name: "o".into(), tenant: Some("other".into()), ..Default::default() };
    assert_eq!(acc.create_key_from(&other).await.unwrap().key.tenant_weight, 1);
    assert_eq!(acc.find_key("plain").await.unwrap().tenant_weight, 5);
    // An update that does not name the weight leaves it alone.
    let limited = KeyUpdate { rpm_limit: Some(Some(9)), ..Default::default() };
    assert_eq!(acc.update_key("plain", &limited).await.unwrap().weight, 2);
});

on_both!(tenants_are_listed_from_keys_and_settings, |acc: Accounts| async move {
    acc.create_key("a").await.unwrap();
    let spec = NewKey { name: "b".into(), tenant: Some("acme".into()), ..Default::default() };
    acc.create_key_from(&spec).await.unwrap();
    // A weight may be given ahead of the tenant's first key.
    acc.set_tenant_weight("later", 7).await.unwrap();
    let listed: Vec<_> =
        acc.list_tenants().await.unwrap().into_iter().map(|t| (t.name, t.weight, t.active_keys)).collect();
    assert_eq!(listed, [("acme".into(), 1, 1), ("default".into(), 1, 1), ("later".into(), 7, 0)]);
    acc.revoke_key("b").await.unwrap();
    assert_eq!(acc.find_tenant("acme").await.unwrap().active_keys, 0);
    assert!(matches!(acc.find_tenant("nobody").await, Err(AccountsError::NotFound(_))));
    assert!(acc.set_tenant_weight(" ", 2).await.is_err(), "a blank name");
});

on_both!(priority_tier_is_off_unless_set_and_kept_until_changed, |acc: Accounts| async move {
    let plain = acc.create_key("plain").await.unwrap();
    assert!(!plain.key.priority_tier);
    let spec = NewKey { name: "fast".into(), priority_tier: true, ..Default::default() };
    let fast = acc.create_key_from(&spec).await.unwrap();
    assert!(acc.authenticate(&fast.secret).await.unwrap().unwrap().priority_tier);
    let limited = KeyUpdate { rpm_limit: Some(Some(9)), ..Default::default() };
    assert!(acc.update_key("fast", &limited).await.unwrap().priority_tier, "left alone");
    let off = KeyUpdate { priority_tier: Some(false), ..Default::default() };
    assert!(!acc.update_key("fast", &off).await.unwrap().priority_tier);
    assert!(!acc.authenticate(&fast.secret).await.unwrap().unwrap().priority_tier);
});
