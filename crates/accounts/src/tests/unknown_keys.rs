//! Unknown keys: a repeated one costs one database lookup, yet a key registered since works at
//! once, and a found key is looked up every time so that revocation is immediate.

use super::*;

on_both!(a_repeated_unknown_key_costs_one_lookup, |acc: Accounts| async move {
    let fake = format!("{SECRET_PREFIX}{}", "x".repeat(40));
    let before = acc.key_lookups();
    for _ in 0..50 {
        assert!(acc.authenticate(&fake).await.unwrap().is_none());
    }
    assert_eq!(acc.key_lookups() - before, 1, "one database lookup for 50 presentations of one unknown key");
    // Malformed secrets never reach the database.
    assert!(acc.authenticate("not-a-key").await.unwrap().is_none());
    assert_eq!(acc.key_lookups() - before, 1);
});

on_both!(a_key_registered_after_being_refused_works_at_once, |acc: Accounts| async move {
    let secret = format!("{SECRET_PREFIX}{}", "y".repeat(40));
    assert!(acc.authenticate(&secret).await.unwrap().is_none());
    // Another clone of the handle (another request task) shares the memory of unknown keys.
    let other = acc.clone();
    other.ensure_key(&secret, "late").await.unwrap();
    let key = acc.authenticate(&secret).await.unwrap().expect("the registered key is accepted");
    assert_eq!(key.name, "late");
});

on_both!(a_found_key_is_looked_up_every_time_so_revocation_is_immediate, |acc: Accounts| async move {
    let created = acc.create_key("revoke-me").await.unwrap();
    assert!(acc.authenticate(&created.secret).await.unwrap().is_some());
    acc.revoke_key("revoke-me").await.unwrap();
    assert!(acc.authenticate(&created.secret).await.unwrap().is_none());
    // A rotated key's new secret works at once.
    let kept = acc.create_key("rotate-me").await.unwrap();
    let rotated = acc.rotate_key("rotate-me").await.unwrap();
    assert!(acc.authenticate(&kept.secret).await.unwrap().is_none());
    assert!(acc.authenticate(&rotated.secret).await.unwrap().is_some());
});
