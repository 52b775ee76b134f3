//! The outbox: durability, adoption of dead processes' files, torn lines, and compaction
//! under steady traffic and across crashes between its steps. Test-only.

use super::*;

fn settle(id: &str) -> Entry {
    Entry::Settle {
        record: UsageRecord {
            request_id: id.into(),
            client_request_id: Some("client-1".into()),
            key_id: 1,
            model: "m".into(),
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 4,
            reasoning_tokens: 0,
            cost_nanos: 0,
            outcome: "completed".into(),
            service_tier: "default".into(),
            batch_id: None,
            started_at_ms: 1,
            finished_at_ms: 2,
        },
    }
}

#[test]
fn appended_entries_survive_a_crash_and_are_adopted_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = Outbox::open(dir.path(), "a").unwrap();
    let s1 = a.append(settle("r1")).unwrap();
    a.append(Entry::Release { request_id: "r2".into() }).unwrap();
    a.done(s1).unwrap();
    assert_eq!(a.pending_len(), 1);
    // A live owner's file is not adopted.
    let b = Outbox::open(dir.path(), "b").unwrap();
    assert_eq!(b.pending_len(), 0);
    drop(b);
    // "a" dies (its lock goes with it); the next process adopts everything "a" wrote that
    // was not confirmed... and also r1, which "a" confirmed but did not compact away:
    // replaying it is harmless because settlement is idempotent.
    drop(a);
    let c = Outbox::open(dir.path(), "c").unwrap();
    let ids: Vec<String> = c.pending().iter().map(|(_, e)| e.request_id().to_string()).collect();
    assert_eq!(ids, ["r1", "r2"]);
    assert!(!dir.path().join("a.jsonl").exists(), "the adopted file is deleted");
    assert!(!dir.path().join("b.jsonl").exists(), "an empty dead file is deleted too");
    // Adopted entries are durable in c's file before a's is removed.
    drop(c);
    let d = Outbox::open(dir.path(), "d").unwrap();
    assert_eq!(d.pending_len(), 2);
}

#[test]
fn lines_written_before_reasoning_tokens_existed_read_as_zero() {
    let dir = tempfile::tempdir().unwrap();
    let old = concat!(
        r#"{"op":"settle","record":{"request_id":"r1","client_request_id":"client-1","key_id":1,"#,
        r#""model":"m","prompt_tokens":3,"cached_tokens":0,"completion_tokens":4,"cost_nanos":0,"#,
        r#""outcome":"completed","started_at_ms":1,"finished_at_ms":2}}"#,
        "\n"
    );
    std::fs::write(dir.path().join("old.jsonl"), old).unwrap();
    let a = Outbox::open(dir.path(), "a").unwrap();
    assert_eq!(a.pending(), [(0, settle("r1"))]);
    let Entry::Settle { record } = &a.pending()[0].1 else { panic!("not a settlement") };
    assert_eq!(record.reasoning_tokens, 0);
}

#[test]
fn the_file_is_compacted_when_everything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let a = Outbox::open(dir.path(), "a").unwrap();
    let seqs: Vec<u64> = (0..5).map(|i| a.append(settle(&format!("r{i}"))).unwrap()).collect();
    assert!(a.file_len().unwrap() > 0);
    for s in &seqs[..4] {
        a.done(*s).unwrap();
        assert!(a.file_len().unwrap() > 0, "still one pending");
    }
    a.done(seqs[4]).unwrap();
    assert_eq!(a.file_len().unwrap(), 0);
    // Appends after compaction start a fresh file.
    a.append(settle("r9")).unwrap();
    drop(a);
    let b = Outbox::open(dir.path(), "b").unwrap();
    assert_eq!(b.pending().iter().map(|(_, e)| e.request_id().to_string()).collect::<Vec<_>>(), ["r9"]);
}

#[test]
fn a_torn_last_line_is_dropped_and_does_not_corrupt_later_appends() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = Outbox::open(dir.path(), "a").unwrap();
        a.append(settle("r1")).unwrap();
    }
    // A crash in the middle of writing the second line.
    let mut f = OpenOptions::new().append(true).open(dir.path().join("a.jsonl")).unwrap();
    f.write_all(br#"{"op":"settle","record":{"request_id":"r2","#).unwrap();
    drop(f);
    // The same owner name restarting reads its own file, drops the torn tail, and appends
    // cleanly after it.
    let a = Outbox::open(dir.path(), "a").unwrap();
    assert_eq!(a.pending().iter().map(|(_, e)| e.request_id().to_string()).collect::<Vec<_>>(), ["r1"]);
    a.append(settle("r3")).unwrap();
    drop(a);
    let b = Outbox::open(dir.path(), "b").unwrap();
    assert_eq!(b.pending().iter().map(|(_, e)| e.request_id().to_string()).collect::<Vec<_>>(), ["r1", "r3"]);
    assert_eq!(b.pending()[0].1, settle("r1"));
}

fn ids(outbox: &Outbox) -> Vec<String> {
    outbox.pending().iter().map(|(_, e)| e.request_id().to_string()).collect()
}

fn compacting(outbox: &Outbox) -> PathBuf {
    outbox.path().with_extension(format!("jsonl.{COMPACTING}"))
}

#[test]
fn steady_traffic_keeps_the_file_bounded_though_it_is_never_empty() {
    let dir = tempfile::tempdir().unwrap();
    let compact_after = 4096;
    let a = Outbox::open_compacting_after(dir.path(), "a", compact_after).unwrap();
    let line = settle("r0000").line().unwrap().len() as u64;
    // Four requests in flight at every moment: each settles as the next arrives.
    let in_flight = 4;
    let mut seqs = std::collections::VecDeque::new();
    let mut appended = 0;
    for i in 0..2000 {
        seqs.push_back(a.append(settle(&format!("r{i:04}"))).unwrap());
        appended += line;
        if seqs.len() > in_flight {
            a.done(seqs.pop_front().unwrap()).unwrap();
        }
        assert!(a.pending_len() > 0);
        let on_disk = std::fs::metadata(a.path()).unwrap().len();
        assert_eq!(on_disk, a.file_len().unwrap(), "the outbox's name holds the file appended to");
        // Stored bytes stay within the threshold or the pending bytes, plus the latest line.
        let bound = compact_after + 2 * (in_flight as u64 + 1) * line + line;
        assert!(on_disk <= bound, "after {i} appends the file holds {on_disk} bytes (bound {bound})");
    }
    assert!(appended > 50 * compact_after, "the traffic outweighs the bound many times");
    // What a crash now leaves is adopted: every pending entry, no entry twice.
    let pending = ids(&a);
    drop(a);
    let b = Outbox::open(dir.path(), "b").unwrap();
    let replayed = ids(&b);
    assert!(pending.iter().all(|id| replayed.contains(id)), "{pending:?} in {replayed:?}");
    let unique: std::collections::HashSet<&String> = replayed.iter().collect();
    assert_eq!(unique.len(), replayed.len(), "no entry twice: {replayed:?}");
}

/// An outbox whose first five of ten entries are stored, and that compacts at any size.
fn half_stored(dir: &Path) -> Outbox {
    let a = Outbox::open_compacting_after(dir, "a", u64::MAX).unwrap();
    let seqs: Vec<u64> = (0..10).map(|i| a.append(settle(&format!("r{i}"))).unwrap()).collect();
    for s in &seqs[..5] {
        a.done(*s).unwrap();
    }
    a
}

const STILL_PENDING: [&str; 5] = ["r5", "r6", "r7", "r8", "r9"];

#[test]
fn a_crash_while_the_new_file_is_written_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = half_stored(dir.path());
    // Written whole but not renamed, then a crash (the process's locks go with it)...
    let state = a.state();
    let fresh = write_snapshot(&compacting(&a), state.pending.values().map(|p| &p.entry)).unwrap();
    drop(fresh);
    drop(state);
    drop(a);
    let b = Outbox::open(dir.path(), "b").unwrap();
    let replayed = ids(&b);
    // ...leaves the old file, which holds everything (stored entries replay harmlessly), and
    // the new one is neither adopted (no entry twice) nor left behind.
    assert_eq!(replayed, ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"]);
    assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| e.unwrap().path() == b.path()));
    drop(b);
    // A torn new file (a crash mid-write) is the same.
    let c = Outbox::open(dir.path(), "c").unwrap();
    std::fs::write(dir.path().join("d.jsonl.compacting"), br#"{"op":"settle","rec"#).unwrap();
    drop(c);
    let e = Outbox::open(dir.path(), "e").unwrap();
    assert_eq!(ids(&e).len(), 10);
    assert!(!dir.path().join("d.jsonl.compacting").exists());
}

#[test]
fn a_crash_after_the_rename_leaves_exactly_the_pending_entries() {
    let dir = tempfile::tempdir().unwrap();
    let a = half_stored(dir.path());
    let state = a.state();
    let fresh = write_snapshot(&compacting(&a), state.pending.values().map(|p| &p.entry)).unwrap();
    install(&compacting(&a), a.path()).unwrap();
    drop(fresh);
    drop(state);
    drop(a);
    let b = Outbox::open(dir.path(), "b").unwrap();
    assert_eq!(ids(&b), STILL_PENDING);
    assert!(!dir.path().join("a.jsonl").exists());
}

#[test]
fn compaction_keeps_the_pending_entries_and_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let a = Outbox::open_compacting_after(dir.path(), "a", 0).unwrap();
    let seqs: Vec<u64> = (0..10).map(|i| a.append(settle(&format!("r{i}"))).unwrap()).collect();
    // A process starting now opens a's file; a compacts before it looks at the lock.
    let opened_early = OpenOptions::new().read(true).write(true).open(a.path()).unwrap();
    let before = a.file_len().unwrap();
    for s in &seqs[..5] {
        a.done(*s).unwrap();
    }
    assert_eq!(a.file_len().unwrap(), before / 2, "rewritten with the five pending entries");
    assert_eq!(ids(&a), STILL_PENDING);
    // The old file is unlocked now, but it no longer has the name: adopting it takes nothing
    // and leaves a's new file alone.
    let b = Outbox::open(dir.path(), "b").unwrap();
    b.adopt_opened(a.path(), opened_early).unwrap();
    assert_eq!(b.pending_len(), 0);
    assert!(a.path().exists());
    // The new file is locked: a live owner's file is never adopted.
    let c = Outbox::open(dir.path(), "c").unwrap();
    assert_eq!(c.pending_len(), 0);
    assert!(a.path().exists());
    // Appends after compaction go to the named file, and a's death leaves them all.
    a.append(settle("r10")).unwrap();
    drop(a);
    let d = Outbox::open(dir.path(), "d").unwrap();
    assert_eq!(ids(&d), ["r5", "r6", "r7", "r8", "r9", "r10"]);
}
