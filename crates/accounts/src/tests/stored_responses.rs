//! Stored responses: scoped to their key, chained into conversations, expiring, deleted with
//! the key.

use super::*;

const ROOMY: StoredQuota = StoredQuota { rows: 10_000, bytes: 1 << 30 };

fn new<'a>(id: &'a str, key_id: i64, previous_id: Option<&'a str>, expires_at_ms: i64) -> NewStoredResponse<'a> {
    NewStoredResponse {
        id,
        key_id,
        created_at_ms: 1_000,
        expires_at_ms,
        previous_id,
        items: format!("[\"{id}\"]"),
        response: format!("{{\"id\":\"{id}\"}}"),
    }
}

on_both!(a_key_reads_only_its_own_until_they_expire_and_loses_them_with_revocation, |acc: Accounts| async move {
    let mine = acc.create_key("mine").await.unwrap().key;
    let theirs = acc.create_key("theirs").await.unwrap().key;
    acc.store_response(&new("resp_a", mine.id, None, 10_000), ROOMY).await.unwrap();
    acc.store_response(&new("resp_b", mine.id, Some("resp_a"), 10_000), ROOMY).await.unwrap();
    acc.store_response(&new("resp_old", mine.id, None, 2_000), ROOMY).await.unwrap();
    assert_eq!(acc.stored_response(mine.id, "resp_a", 1_500).await.unwrap().as_deref(), Some("{\"id\":\"resp_a\"}"));
    let turns = acc.stored_conversation(mine.id, "resp_b", 1_500).await.unwrap().unwrap();
    assert_eq!(turns, ["[\"resp_a\"]", "[\"resp_b\"]"], "oldest first");
    assert_eq!(acc.stored_response(theirs.id, "resp_a", 1_500).await.unwrap(), None, "another key's is not found");
    assert_eq!(acc.stored_conversation(theirs.id, "resp_b", 1_500).await.unwrap(), None);
    // A chain through another key's response is not followed.
    acc.store_response(&new("resp_x", theirs.id, Some("resp_a"), 10_000), ROOMY).await.unwrap();
    assert_eq!(acc.stored_conversation(theirs.id, "resp_x", 1_500).await.unwrap(), None);
    assert!(!acc.delete_stored_response(theirs.id, "resp_a").await.unwrap(), "nor deletable");
    assert!(acc.stored_response(mine.id, "resp_old", 2_000).await.unwrap().is_none(), "expired");
    assert!(acc.delete_stored_response(mine.id, "resp_a").await.unwrap());
    assert_eq!(acc.stored_conversation(mine.id, "resp_b", 1_500).await.unwrap(), None, "its start is gone");
    acc.revoke_key(&mine.id.to_string()).await.unwrap();
    assert!(acc.stored_response(mine.id, "resp_b", 1_500).await.unwrap().is_none(), "deleted with the key");
    assert!(acc.stored_response(theirs.id, "resp_x", 1_500).await.unwrap().is_some());
});

on_both!(a_conversation_past_the_depth_limit_is_refused_not_walked, |acc: Accounts| async move {
    let key = acc.create_key("deep").await.unwrap().key;
    let ids: Vec<String> = (0..=MAX_CONVERSATION_DEPTH).map(|i| format!("resp_{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| ids[p].as_str());
        acc.store_response(&new(id, key.id, previous, 10_000), ROOMY).await.unwrap();
    }
    let at_limit = acc.stored_conversation(key.id, &ids[MAX_CONVERSATION_DEPTH - 1], 1_500).await.unwrap().unwrap();
    assert_eq!(at_limit.len(), MAX_CONVERSATION_DEPTH);
    assert_eq!(at_limit[0], "[\"resp_0\"]");
    let past = acc.stored_conversation(key.id, &ids[MAX_CONVERSATION_DEPTH], 1_500).await;
    assert!(matches!(past, Err(AccountsError::Invalid(_))), "{past:?}");
});

on_both!(a_key_past_its_quota_loses_its_oldest_responses_and_no_one_elses, |acc: Accounts| async move {
    let key = acc.create_key("busy").await.unwrap().key;
    let other = acc.create_key("other").await.unwrap().key;
    let sized = |id: &'static str, key_id: i64, at: i64, len: usize| NewStoredResponse {
        created_at_ms: at,
        items: "x".repeat(len),
        ..new(id, key_id, None, 100_000)
    };
    let quota = StoredQuota { rows: 3, bytes: 10_000 };
    acc.store_response(&sized("resp_o", other.id, 1_000, 100), quota).await.unwrap();
    for (i, id) in ["resp_1", "resp_2", "resp_3"].into_iter().enumerate() {
        assert_eq!(acc.store_response(&sized(id, key.id, 1_000 + i as i64, 100), quota).await.unwrap(), 0);
    }
    // A fourth row: the oldest goes.
    assert_eq!(acc.store_response(&sized("resp_4", key.id, 2_000, 100), quota).await.unwrap(), 1);
    let kept = |id: &'static str, key_id: i64| {
        let acc = acc.clone();
        async move { acc.stored_response(key_id, id, 3_000).await.unwrap().is_some() }
    };
    assert!(!kept("resp_1", key.id).await && kept("resp_2", key.id).await && kept("resp_4", key.id).await);
    // A large one: as many of the oldest go as its bytes need.
    let big = sized("resp_5", key.id, 2_001, 9_800);
    assert!(big.bytes() < quota.bytes);
    assert_eq!(acc.store_response(&big, quota).await.unwrap(), 2);
    assert!(!kept("resp_3", key.id).await && kept("resp_4", key.id).await && kept("resp_5", key.id).await);
    assert!(kept("resp_o", other.id).await, "another key's responses count apart");
});

on_both!(a_conversation_past_the_byte_bound_is_refused_not_read, |acc: Accounts| async move {
    let key = acc.create_key("wide").await.unwrap().key;
    let turn = (MAX_CONVERSATION_BYTES / 4) as usize;
    let ids = ["resp_a", "resp_b", "resp_c", "resp_d"];
    for (i, id) in ids.into_iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| ids[p]);
        let row = NewStoredResponse { items: "x".repeat(turn), ..new(id, key.id, previous, 10_000) };
        acc.store_response(&row, ROOMY).await.unwrap();
    }
    assert_eq!(acc.stored_conversation(key.id, "resp_c", 1_500).await.unwrap().map(|t| t.len()), Some(3));
    let past = acc.stored_conversation(key.id, "resp_d", 1_500).await;
    assert!(matches!(&past, Err(AccountsError::Invalid(why)) if why.contains("MiB")), "{past:?}");
});
