//! A key's prompt-cache scope: stored, updated, and `tenant` for keys written before it existed.

use super::*;

on_both!(key_cache_scope_is_stored_updated_and_defaults_to_tenant, |acc: Accounts| async move {
    // A row written without the column, as every key was before it existed, reads as `tenant`.
    let old = acc.ensure_key("sk-gantry-an-old-key-written-before-scopes", "old").await.unwrap();
    assert_eq!(old.cache_scope, CacheScopeSetting::Tenant);
    let plain = acc.create_key("plain").await.unwrap();
    assert_eq!(plain.key.cache_scope, CacheScopeSetting::Tenant);
    let spec = NewKey { name: "own".into(), cache_scope: CacheScopeSetting::Key, ..Default::default() };
    let own = acc.create_key_from(&spec).await.unwrap();
    assert_eq!(own.key.cache_scope, CacheScopeSetting::Key);
    assert_eq!(acc.authenticate(&own.secret).await.unwrap().unwrap().cache_scope, CacheScopeSetting::Key);
    let update = KeyUpdate { cache_scope: Some(CacheScopeSetting::Shared), ..Default::default() };
    assert_eq!(acc.update_key("own", &update).await.unwrap().cache_scope, CacheScopeSetting::Shared);
    // An update that does not name it leaves it alone.
    let renamed = acc.update_key("own", &KeyUpdate { rpm_limit: Some(Some(9)), ..Default::default() }).await.unwrap();
    assert_eq!(renamed.cache_scope, CacheScopeSetting::Shared);
    assert_eq!(acc.find_key("own").await.unwrap().cache_scope, CacheScopeSetting::Shared);
    let listed: Vec<_> = acc.list_keys().await.unwrap().into_iter().map(|k| (k.name, k.cache_scope)).collect();
    assert!(listed.contains(&("own".to_string(), CacheScopeSetting::Shared)), "{listed:?}");
    assert!(listed.contains(&("plain".to_string(), CacheScopeSetting::Tenant)), "{listed:?}");
});
