//! Stored responses: scoped to their key, chained into conversations, expiring, deleted with
//! the key.

use super::*;

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
    acc.store_response(&new("resp_a", mine.id, None, 10_000)).await.unwrap();
    acc.store_response(&new("resp_b", mine.id, Some("resp_a"), 10_000)).await.unwrap();
    acc.store_response(&new("resp_old", mine.id, None, 2_000)).await.unwrap();
    assert_eq!(acc.stored_response(mine.id, "resp_a", 1_500).await.unwrap().as_deref(), Some("{\"id\":\"resp_a\"}"));
    let turns = acc.stored_conversation(mine.id, "resp_b", 1_500).await.unwrap().unwrap();
    assert_eq!(turns, ["[\"resp_a\"]", "[\"resp_b\"]"], "oldest first");
    assert_eq!(acc.stored_response(theirs.id, "resp_a", 1_500).await.unwrap(), None, "another key's is not found");
    assert_eq!(acc.stored_conversation(theirs.id, "resp_b", 1_500).await.unwrap(), None);
    // A chain through another key's response is not followed.
    acc.store_response(&new("resp_x", theirs.id, Some("resp_a"), 10_000)).await.unwrap();
    assert_eq!(acc.stored_conversation(theirs.id, "resp_x", 1_500).await.unwrap(), None);
    assert!(!acc.delete_stored_response(theirs.id, "resp_a").await.unwrap(), "nor deletable");
    assert!(acc.stored_response(mine.id, "resp_old", 2_000).await.unwrap().is_none(), "expired");
    assert!(acc.delete_stored_response(mine.id, "resp_a").await.unwrap());
    assert_eq!(acc.stored_conversation(mine.id, "resp_b", 1_500).await.unwrap(), None, "its start is gone");
    acc.revoke_key(&mine.id.to_string()).await.unwrap();
    assert!(acc.stored_response(mine.id, "resp_b", 1_500).await.unwrap().is_none(), "deleted with the key");
    assert!(acc.stored_response(theirs.id, "resp_x", 1_500).await.unwrap().is_some());
});
