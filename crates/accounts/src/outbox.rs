//! A local, append-only journal of settlements and releases not yet in the database.
//!
//! A settlement is first written here (one JSON line, fsync'd) and only then to the database,
//! so a database outage, a crash or a restart never loses a usage record: entries are replayed
//! until the database takes them (settling and releasing are idempotent on the request id).
//! Each server process writes its own file `<dir>/<owner>.jsonl` and holds an exclusive lock on
//! it; a file nobody holds belongs to a process that died, and the next server to start adopts
//! its entries. The file is emptied whenever everything in it has reached the database.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::usage::UsageRecord;

/// One pending change to the accounts database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Entry {
    /// Write the ledger row and move its reservation to spend.
    Settle { record: UsageRecord },
    /// Give back the reservation of a request that never reached the engine.
    Release { request_id: String },
}

impl Entry {
    pub fn request_id(&self) -> &str {
        match self {
            Entry::Settle { record } => &record.request_id,
            Entry::Release { request_id } => request_id,
        }
    }
}

pub struct Outbox {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    /// Opened for appending; holds the exclusive lock that marks this file as alive.
    file: File,
    next_seq: u64,
    pending: BTreeMap<u64, Entry>,
}

impl Outbox {
    /// Creates `<dir>/<owner>.jsonl` and adopts the entries of files no live process holds
    /// (left by a crash or a shutdown that could not reach the database).
    pub fn open(dir: &Path, owner: &str) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.jsonl", sanitize(owner)));
        let file = OpenOptions::new().create(true).append(true).read(true).open(&path)?;
        file.try_lock().map_err(|e| io::Error::other(format!("outbox {} is locked: {e}", path.display())))?;
        let outbox = Self { path, state: Mutex::new(State { file, next_seq: 0, pending: BTreeMap::new() }) };
        // Our own file is new unless the owner name was reused; read it like any other.
        let own = read_entries(&mut outbox.state().file)?;
        {
            let mut state = outbox.state();
            for entry in own {
                let seq = state.next_seq;
                state.next_seq += 1;
                state.pending.insert(seq, entry);
            }
            // Rewrite so that a torn last line cannot glue itself to the next append.
            rewrite(&mut state)?;
        }
        for entry in std::fs::read_dir(dir)? {
            let other = entry?.path();
            if other == outbox.path || other.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            if let Err(e) = outbox.adopt(&other) {
                tracing::warn!(error = %e, file = %other.display(), "could not adopt an outbox file");
            }
        }
        Ok(outbox)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves a dead process's entries into this outbox (durably) and deletes its file.
    fn adopt(&self, other: &Path) -> io::Result<()> {
        let mut file = OpenOptions::new().read(true).write(true).open(other)?;
        if file.try_lock().is_err() {
            return Ok(()); // a live server owns it
        }
        let entries = read_entries(&mut file)?;
        if !entries.is_empty() {
            tracing::warn!(entries = entries.len(), file = %other.display(), "replaying usage records a previous run left unsaved");
        }
        for entry in entries {
            self.append(entry)?;
        }
        std::fs::remove_file(other)?;
        Ok(())
    }

    /// Appends `entry` and waits until it is on disk. Returns its sequence number.
    pub fn append(&self, entry: Entry) -> io::Result<u64> {
        let mut line = serde_json::to_vec(&entry).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut state = self.state();
        state.file.write_all(&line)?;
        state.file.sync_data()?;
        let seq = state.next_seq;
        state.next_seq += 1;
        state.pending.insert(seq, entry);
        Ok(seq)
    }

    /// Entries not yet confirmed by the database, oldest first.
    pub fn pending(&self) -> Vec<(u64, Entry)> {
        self.state().pending.iter().map(|(s, e)| (*s, e.clone())).collect()
    }

    pub fn pending_len(&self) -> usize {
        self.state().pending.len()
    }

    /// Marks an entry as stored in the database; empties the file once nothing is pending.
    pub fn done(&self, seq: u64) -> io::Result<()> {
        let mut state = self.state();
        state.pending.remove(&seq);
        if state.pending.is_empty() {
            state.file.set_len(0)?;
            state.file.sync_data()?;
        }
        Ok(())
    }

    /// Size of the file on disk (bytes).
    pub fn file_len(&self) -> io::Result<u64> {
        Ok(self.state().file.metadata()?.len())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Keeps file names to characters every file system accepts.
fn sanitize(owner: &str) -> String {
    owner.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

/// Every complete, parseable line. A torn last line (a crash mid-append, before the write was
/// acknowledged) is dropped; a damaged line elsewhere is logged and skipped.
fn read_entries(file: &mut File) -> io::Result<Vec<Entry>> {
    file.seek(SeekFrom::Start(0))?;
    let mut entries = Vec::new();
    let mut reader = BufReader::new(&mut *file);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            tracing::warn!(bytes = line.len(), "dropping a torn last line of the outbox");
            break;
        }
        match serde_json::from_slice::<Entry>(&line) {
            Ok(entry) => entries.push(entry),
            Err(e) => {
                tracing::error!(error = %e, line = %String::from_utf8_lossy(&line), "skipping a damaged outbox line")
            }
        }
    }
    Ok(entries)
}

/// Replaces the file's content with exactly the pending entries.
fn rewrite(state: &mut State) -> io::Result<()> {
    let mut out = Vec::new();
    for entry in state.pending.values() {
        out.extend(serde_json::to_vec(entry).map_err(io::Error::other)?);
        out.push(b'\n');
    }
    state.file.set_len(0)?;
    state.file.write_all(&out)?;
    state.file.sync_data()
}

#[cfg(test)]
mod tests {
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
}
