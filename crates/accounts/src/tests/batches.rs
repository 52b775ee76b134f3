//! Files and batches: scoped to their key, bounded per key, and a batch's lines claimed by one
//! server at a time, taken back from a dead one, and the batch finished once.

use super::*;

const ROOMY: FileQuota = FileQuota { files: 100, bytes: 1 << 20 };

fn file(id: &str, key_id: i64, created_at: i64, content: &str) -> NewFile {
    NewFile {
        id: id.into(),
        key_id,
        purpose: "batch".into(),
        filename: format!("{id}.jsonl"),
        created_at,
        content: content.into(),
    }
}

fn batch(id: &str, key_id: i64, created_at: i64, lines: usize) -> NewBatch {
    NewBatch {
        id: id.into(),
        key_id,
        endpoint: "/v1/chat/completions".into(),
        input_file_id: "file-x".into(),
        completion_window: "24h".into(),
        metadata: None,
        errors: None,
        created_at,
        expires_at: created_at + 86_400,
        lines: (0..lines)
            .map(|n| NewLine { custom_id: format!("c{n}"), request_id: format!("{id}-req-{n}"), body: "{}".into() })
            .collect(),
    }
}

on_both!(files_belong_to_their_key_within_its_quota, |acc: Accounts| async move {
    let mine = acc.create_key("mine").await.unwrap().key;
    let theirs = acc.create_key("theirs").await.unwrap().key;
    for n in 0..3 {
        acc.store_file(&file(&format!("file-{n}"), mine.id, 100 + n, "abc"), ROOMY).await.unwrap();
    }
    assert_eq!(acc.file_content(mine.id, "file-1").await.unwrap().as_deref(), Some("abc"));
    assert_eq!(acc.file_content(theirs.id, "file-1").await.unwrap(), None, "another key's is not found");
    assert_eq!(acc.file(theirs.id, "file-1").await.unwrap(), None);
    assert!(!acc.delete_file(theirs.id, "file-1").await.unwrap(), "nor deletable");
    let page = |after: Option<&str>, ascending| FileQuery {
        after: after.map(str::to_owned),
        limit: 2,
        ascending,
        ..Default::default()
    };
    let ids = |files: Vec<FileInfo>| files.into_iter().map(|f| f.id).collect::<Vec<_>>();
    assert_eq!(ids(acc.list_files(mine.id, &page(None, false)).await.unwrap()), ["file-2", "file-1", "file-0"]);
    assert_eq!(ids(acc.list_files(mine.id, &page(Some("file-2"), false)).await.unwrap()), ["file-1", "file-0"]);
    assert_eq!(ids(acc.list_files(mine.id, &page(Some("file-0"), true)).await.unwrap()), ["file-1", "file-2"]);
    assert!(acc.list_files(theirs.id, &page(None, false)).await.unwrap().is_empty());
    let tight = FileQuota { files: 3, bytes: 10 };
    assert!(matches!(
        acc.store_file(&file("file-3", mine.id, 200, "a"), tight).await,
        Err(AccountsError::QuotaExceeded(_))
    ));
    assert!(acc.delete_file(mine.id, "file-0").await.unwrap());
    let too_big = file("file-4", mine.id, 200, "abcdefg");
    assert!(matches!(acc.store_file(&too_big, tight).await, Err(AccountsError::QuotaExceeded(_))), "6 + 7 bytes > 10");
    acc.store_file(&file("file-5", mine.id, 200, "abcd"), tight).await.unwrap();
});

on_both!(lines_are_claimed_once_taken_back_from_dead_servers_and_the_batch_finished_once, |acc: Accounts| async move {
    let mine = acc.create_key("mine").await.unwrap().key;
    let theirs = acc.create_key("theirs").await.unwrap().key;
    let b = acc.create_batch(&batch("batch_a", mine.id, 1_000, 3), ROOMY).await.unwrap();
    assert_eq!((b.status.as_str(), b.total, b.completed, b.failed), ("in_progress", 3, 0, 0));
    assert_eq!(acc.batch(theirs.id, "batch_a").await.unwrap(), None, "another key's is not found");
    crate::instances::heartbeat(&acc.pool, "alive", 10_000).await.unwrap();
    crate::instances::heartbeat(&acc.pool, "doomed", 10_000).await.unwrap();
    let first = acc.claim_batch_line("doomed", 2_000).await.unwrap().unwrap();
    assert_eq!((first.line, first.key_id, first.request_id.as_str()), (1, mine.id, "batch_a-req-0"));
    // A second key's batch goes first while the first key has a line running.
    acc.create_batch(&batch("batch_b", theirs.id, 1_500, 1), ROOMY).await.unwrap();
    let other = acc.claim_batch_line("alive", 2_000).await.unwrap().unwrap();
    assert_eq!(other.batch_id, "batch_b");
    let second = acc.claim_batch_line("alive", 2_000).await.unwrap().unwrap();
    assert_eq!((second.batch_id.as_str(), second.line), ("batch_a", 2));
    assert!(acc.finish_batch_line(&second, "alive", 200, "{\"ok\":2}").await.unwrap());
    assert!(!acc.finish_batch_line(&second, "alive", 200, "{}").await.unwrap(), "answered once");
    // "doomed" stops beating: its line is pending again, and its late answer is dropped.
    crate::instances::heartbeat(&acc.pool, "alive", 20_000).await.unwrap();
    assert_eq!(acc.reclaim_dead_lines(15_000).await.unwrap(), 1);
    assert!(!acc.finish_batch_line(&first, "doomed", 200, "{}").await.unwrap());
    let mut claimed = Vec::new();
    while let Some(line) = acc.claim_batch_line("alive", 2_000).await.unwrap() {
        claimed.push(line);
    }
    assert_eq!(
        claimed.iter().map(|l| (l.batch_id.as_str(), l.line)).collect::<Vec<_>>(),
        [("batch_a", 1), ("batch_a", 3)]
    );
    assert!(acc.finishable_batches(2_000).await.unwrap().iter().all(|f| f.id != "batch_a"), "lines still running");
    for (line, status) in claimed.iter().zip([200, 400]) {
        assert!(acc.finish_batch_line(line, "alive", status, "{}").await.unwrap());
    }
    let finishable = acc.finishable_batches(2_000).await.unwrap();
    let done = finishable.iter().find(|f| f.id == "batch_a").unwrap();
    assert_eq!((done.from.as_str(), done.to), ("in_progress", "completed"));
    let output = file("file-out", mine.id, 2_000, "out");
    let finished = acc.finish_batch(done, 2_000, Some(&output), None).await.unwrap().unwrap();
    assert_eq!((finished.status.as_str(), finished.completed, finished.failed), ("completed", 2, 1));
    assert_eq!(finished.output_file_id.as_deref(), Some("file-out"));
    assert_eq!(acc.file_content(mine.id, "file-out").await.unwrap().as_deref(), Some("out"));
    let again = file("file-out-2", mine.id, 2_000, "out");
    assert_eq!(acc.finish_batch(done, 2_000, Some(&again), None).await.unwrap(), None, "finished once");
    assert_eq!(acc.file(mine.id, "file-out-2").await.unwrap(), None, "and its files written once");
    // Its answers are in its files: its lines are gone, its counts stay.
    assert!(acc.batch_lines("batch_a").await.unwrap().is_empty());
    let kept = acc.batch(mine.id, "batch_a").await.unwrap().unwrap();
    assert_eq!((kept.total, kept.completed, kept.failed), (3, 2, 1));
    // A server restarted under the same id takes back what its killed process held.
    acc.create_batch(&batch("batch_f", mine.id, 1_000, 2), ROOMY).await.unwrap();
    let held = acc.claim_batch_line("alive", 2_000).await.unwrap().unwrap();
    assert_eq!(held.batch_id, "batch_f");
    assert_eq!(acc.release_lines_of("someone-else").await.unwrap(), 0);
    assert_eq!(acc.release_lines_of("alive").await.unwrap(), 2, "batch_b's line and batch_f's");
    let mut again = Vec::new();
    while let Some(line) = acc.claim_batch_line("alive", 2_000).await.unwrap() {
        again.push((line.batch_id, line.line));
    }
    again.sort();
    assert_eq!(again, [("batch_b".to_string(), 1), ("batch_f".to_string(), 1), ("batch_f".to_string(), 2)]);
});

on_both!(a_cancelled_batch_starts_no_line_and_ends_once_its_running_lines_do, |acc: Accounts| async move {
    let mine = acc.create_key("mine").await.unwrap().key;
    let theirs = acc.create_key("theirs").await.unwrap().key;
    crate::instances::heartbeat(&acc.pool, "s", 10_000).await.unwrap();
    acc.create_batch(&batch("batch_c", mine.id, 1_000, 3), ROOMY).await.unwrap();
    let running = acc.claim_batch_line("s", 2_000).await.unwrap().unwrap();
    assert!(matches!(acc.cancel_batch(theirs.id, "batch_c", 2_000).await, Err(AccountsError::NotFound(_))));
    let cancelling = acc.cancel_batch(mine.id, "batch_c", 2_000).await.unwrap();
    assert_eq!((cancelling.status.as_str(), cancelling.cancelling_at), ("cancelling", Some(2_000)));
    assert_eq!(acc.claim_batch_line("s", 2_000).await.unwrap(), None, "no new line starts");
    assert!(acc.finishable_batches(2_000).await.unwrap().is_empty(), "one line still runs");
    assert!(acc.finish_batch_line(&running, "s", 200, "{}").await.unwrap());
    let finishable = acc.finishable_batches(2_000).await.unwrap();
    assert_eq!(finishable.len(), 1);
    assert_eq!(finishable[0].to, "cancelled");
    let done = acc.finish_batch(&finishable[0], 2_001, None, None).await.unwrap().unwrap();
    assert_eq!((done.status.as_str(), done.completed, done.cancelled_at), ("cancelled", 1, Some(2_001)));
    assert!(matches!(acc.cancel_batch(mine.id, "batch_c", 2_002).await.unwrap().status.as_str(), "cancelled"));
    // An expired batch starts no line either. It is closed (finalizing) first; its line claimed
    // just before its expiry runs on, and the batch is finished as expired once that line ended
    // and a second went by (a claim racing the close would show as running by then).
    acc.create_batch(&batch("batch_d", mine.id, 1_000, 2), ROOMY).await.unwrap();
    let expiry = 1_000 + 86_400;
    let late = acc.claim_batch_line("s", expiry - 1).await.unwrap().unwrap();
    assert_eq!(acc.claim_batch_line("s", expiry).await.unwrap(), None);
    assert!(acc.finishable_batches(expiry).await.unwrap().is_empty(), "still in progress");
    assert_eq!(acc.close_expired_batches(expiry).await.unwrap(), 1);
    assert_eq!(acc.close_expired_batches(expiry).await.unwrap(), 0, "closed once");
    assert_eq!(acc.batch(mine.id, "batch_d").await.unwrap().unwrap().status, "finalizing");
    assert_eq!(acc.claim_batch_line("s", expiry - 1).await.unwrap(), None, "no line starts once closed");
    assert!(acc.finish_batch_line(&late, "s", 200, "{}").await.unwrap(), "the running line is kept");
    assert!(acc.finishable_batches(expiry).await.unwrap().is_empty(), "not in the second it was closed");
    let expired = acc.finishable_batches(expiry + 1).await.unwrap();
    assert_eq!(expired.iter().map(|f| (f.id.as_str(), f.to)).collect::<Vec<_>>(), [("batch_d", "expired")]);
    let done = acc.finish_batch(&expired[0], expiry + 1, None, None).await.unwrap().unwrap();
    assert_eq!((done.status.as_str(), done.completed), ("expired", 1));
    assert_eq!((done.finalizing_at, done.expired_at), (Some(expiry), Some(expiry + 1)));
    // A failed validation is a batch with no line, failed from the start.
    let failed = NewBatch { errors: Some("[]".into()), lines: Vec::new(), ..batch("batch_e", mine.id, 3_000, 0) };
    let failed = acc.create_batch(&failed, ROOMY).await.unwrap();
    assert_eq!((failed.status.as_str(), failed.failed_at), ("failed", Some(3_000)));
    let listed = acc.list_batches(mine.id, None, 2).await.unwrap();
    assert_eq!(listed.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["batch_e", "batch_d", "batch_c"]);
    let after = acc.list_batches(mine.id, Some("batch_d"), 2).await.unwrap();
    assert_eq!(after.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["batch_c"]);
});

on_both!(unfinished_batches_count_toward_the_keys_quota_and_finished_ones_do_not, |acc: Accounts| async move {
    let mine = acc.create_key("mine").await.unwrap().key;
    let theirs = acc.create_key("theirs").await.unwrap().key;
    // Each batch copies 10 requests of 2 characters: 20 bytes, and one file to come.
    let quota = FileQuota { files: 3, bytes: 50 };
    acc.store_file(&file("file-in", mine.id, 100, "0123456789"), quota).await.unwrap();
    acc.create_batch(&batch("batch_1", mine.id, 1_000, 10), quota).await.unwrap();
    assert_eq!(acc.file_usage(mine.id).await.unwrap(), (2, 30));
    // The same file submitted again would bring the key past its bytes: refused, nothing kept.
    let again = acc.create_batch(&batch("batch_2", mine.id, 1_001, 30), quota).await;
    assert!(matches!(again, Err(AccountsError::QuotaExceeded(_))), "{again:?}");
    assert_eq!(acc.batch(mine.id, "batch_2").await.unwrap(), None);
    assert_eq!(acc.file_usage(mine.id).await.unwrap(), (2, 30), "the refused batch left nothing");
    // Another key's quota is its own.
    acc.create_batch(&batch("batch_t", theirs.id, 1_002, 10), quota).await.unwrap();
    // A second small one fits; a third is past the files (two files and three batches to come).
    acc.create_batch(&batch("batch_3", mine.id, 1_003, 5), quota).await.unwrap();
    let third = acc.create_batch(&batch("batch_4", mine.id, 1_004, 1), quota).await;
    assert!(matches!(third, Err(AccountsError::QuotaExceeded(_))), "{third:?}");
    // Once a batch is finished its lines are gone: only its output file counts.
    acc.cancel_batch(mine.id, "batch_1", 2_000).await.unwrap();
    let finishable = acc.finishable_batches(2_000).await.unwrap();
    let done = finishable.iter().find(|f| f.id == "batch_1").unwrap();
    let output = file("file-out", mine.id, 2_000, "0123456789");
    acc.finish_batch(done, 2_000, None, Some(&output)).await.unwrap().unwrap();
    assert_eq!(acc.file_usage(mine.id).await.unwrap(), (3, 30), "two files and batch_3: 10 + 10 + 10 bytes");
});
