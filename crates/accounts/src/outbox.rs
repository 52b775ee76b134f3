//! A local, append-only journal of settlements and releases not yet in the database.
//!
//! A settlement is first written here (one JSON line, fsync'd) and only then to the database,
//! so a database outage, a crash or a restart never loses a usage record: entries are replayed
//! until the database takes them (settling and releasing are idempotent on the request id).
//! Each server process writes its own file `<dir>/<owner>.jsonl` and holds an exclusive lock on
//! it; a file nobody holds belongs to a process that died, and the next server to start adopts
//! its entries.
//!
//! The file is emptied whenever everything in it has reached the database, and under steady
//! traffic, where something is always pending, it is compacted once the entries already stored
//! outweigh the pending ones and [`COMPACT_AFTER_BYTES`]: the pending entries are written to a
//! new file, which is fsync'd, locked, renamed over the old one and its directory fsync'd. A
//! crash at any point leaves one of the two files, each holding every pending entry (the old one
//! also stored ones, whose replay is harmless).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::usage::UsageRecord;

/// Bytes of entries already in the database the file may hold before it is compacted (while
/// others are still pending; it is emptied as soon as none is).
pub const COMPACT_AFTER_BYTES: u64 = 1 << 20;

/// The extension of a compaction's new file until it is renamed into place; other processes
/// never adopt it (it holds copies of entries the old file still has).
const COMPACTING: &str = "compacting";

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

    /// The entry as one line of the file.
    fn line(&self) -> io::Result<Vec<u8>> {
        let mut line = serde_json::to_vec(self).map_err(io::Error::other)?;
        line.push(b'\n');
        Ok(line)
    }
}

pub struct Outbox {
    path: PathBuf,
    /// Stored bytes past which the file is compacted ([`COMPACT_AFTER_BYTES`]).
    compact_after: u64,
    state: Mutex<State>,
}

struct State {
    /// Opened for appending; holds the exclusive lock that marks this file as alive.
    file: File,
    next_seq: u64,
    pending: BTreeMap<u64, Pending>,
    /// Bytes of the lines in the file.
    file_bytes: u64,
    /// Bytes of the pending entries' lines: what a compaction keeps.
    pending_bytes: u64,
}

struct Pending {
    entry: Entry,
    bytes: u64,
}

impl Outbox {
    /// Creates `<dir>/<owner>.jsonl` and adopts the entries of files no live process holds
    /// (left by a crash or a shutdown that could not reach the database).
    pub fn open(dir: &Path, owner: &str) -> io::Result<Self> {
        Self::open_compacting_after(dir, owner, COMPACT_AFTER_BYTES)
    }

    /// [`Self::open`], compacting past `compact_after` stored bytes.
    pub(crate) fn open_compacting_after(dir: &Path, owner: &str, compact_after: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.jsonl", sanitize(owner)));
        let file = OpenOptions::new().create(true).append(true).read(true).open(&path)?;
        file.try_lock().map_err(|e| io::Error::other(format!("outbox {} is locked: {e}", path.display())))?;
        let state = State { file, next_seq: 0, pending: BTreeMap::new(), file_bytes: 0, pending_bytes: 0 };
        let outbox = Self { path, compact_after, state: Mutex::new(state) };
        // Our own file is new unless the owner name was reused; read it like any other.
        let own = read_entries(&mut outbox.state().file)?;
        {
            let mut state = outbox.state();
            for entry in own {
                let bytes = entry.line()?.len() as u64;
                let seq = state.next_seq;
                state.next_seq += 1;
                state.pending.insert(seq, Pending { entry, bytes });
                state.pending_bytes += bytes;
            }
            // Rewritten so that a torn last line cannot glue itself to the next append.
            outbox.compact(&mut state)?;
        }
        for entry in std::fs::read_dir(dir)? {
            let other = entry?.path();
            if other == outbox.path {
                continue;
            }
            let result = match other.extension().and_then(|e| e.to_str()) {
                Some("jsonl") => outbox.adopt(&other),
                Some(COMPACTING) => remove_abandoned(&other),
                _ => continue,
            };
            if let Err(e) = result {
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
        self.adopt_opened(other, OpenOptions::new().read(true).write(true).open(other)?)
    }

    /// [`Self::adopt`] of the file opened at `other`, perhaps before its owner compacted.
    fn adopt_opened(&self, other: &Path, mut file: File) -> io::Result<()> {
        if file.try_lock().is_err() {
            return Ok(()); // a live server owns it
        }
        // A live owner may have compacted since we opened it: the name now holds its new file
        // (locked), and what we hold is the old one, which must not cost the new its name.
        if !names(other, &file)? {
            return Ok(());
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
        let line = entry.line()?;
        let bytes = line.len() as u64;
        let mut state = self.state();
        state.file.write_all(&line)?;
        state.file.sync_data()?;
        let seq = state.next_seq;
        state.next_seq += 1;
        state.pending.insert(seq, Pending { entry, bytes });
        state.file_bytes += bytes;
        state.pending_bytes += bytes;
        Ok(seq)
    }

    /// Entries not yet confirmed by the database, oldest first.
    pub fn pending(&self) -> Vec<(u64, Entry)> {
        self.state().pending.iter().map(|(s, p)| (*s, p.entry.clone())).collect()
    }

    pub fn pending_len(&self) -> usize {
        self.state().pending.len()
    }

    /// Marks an entry as stored in the database; empties the file once nothing is pending, and
    /// compacts it once the stored entries outweigh the pending ones and `compact_after`.
    pub fn done(&self, seq: u64) -> io::Result<()> {
        let mut state = self.state();
        if let Some(done) = state.pending.remove(&seq) {
            state.pending_bytes -= done.bytes;
        }
        if state.pending.is_empty() {
            // Nothing left to lose: emptied in place.
            state.file.set_len(0)?;
            state.file.sync_data()?;
            state.file_bytes = 0;
            return Ok(());
        }
        let stored = state.file_bytes - state.pending_bytes;
        // Rewriting costs the pending bytes; waiting until at least as many stored ones have
        // piled up keeps that below what was appended since the last compaction.
        if stored > self.compact_after && stored >= state.pending_bytes {
            self.compact(&mut state)?;
        }
        Ok(())
    }

    /// Replaces the file with one holding exactly the pending entries, so that a crash at any
    /// point leaves a file with all of them under this name (see [`write_snapshot`]).
    fn compact(&self, state: &mut State) -> io::Result<()> {
        let fresh = self.path.with_extension(format!("jsonl.{COMPACTING}"));
        let file = write_snapshot(&fresh, state.pending.values().map(|p| &p.entry))?;
        install(&fresh, &self.path)?;
        // The old file's lock goes with it; the new one was locked before it took the name.
        state.file = file;
        state.file_bytes = state.pending_bytes;
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

/// A compaction's first step: `entries` written to a new file at `fresh`, locked (so that once
/// it takes the outbox's name no other process adopts it) and on disk. Returns it opened for
/// appending. Until [`install`] renames it, the old file is the outbox.
pub(crate) fn write_snapshot<'a>(fresh: &Path, entries: impl Iterator<Item = &'a Entry>) -> io::Result<File> {
    match std::fs::remove_file(fresh) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = OpenOptions::new().create_new(true).append(true).read(true).open(fresh)?;
    file.try_lock().map_err(|e| io::Error::other(format!("{} is locked: {e}", fresh.display())))?;
    let mut out = Vec::new();
    for entry in entries {
        out.extend(entry.line()?);
    }
    file.write_all(&out)?;
    file.sync_data()?;
    Ok(file)
}

/// A compaction's second step: the new file takes the outbox's name (atomically: a crash
/// leaves the old file or the new one there), and the rename is made durable.
pub(crate) fn install(fresh: &Path, path: &Path) -> io::Result<()> {
    std::fs::rename(fresh, path)?;
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Deletes a compaction's new file that its process left before renaming it (it died then;
/// its old file, adopted as any other, holds every entry).
fn remove_abandoned(fresh: &Path) -> io::Result<()> {
    let file = File::open(fresh)?;
    if file.try_lock().is_err() {
        return Ok(()); // being written by a live server
    }
    if names(fresh, &file)? {
        std::fs::remove_file(fresh)?;
    }
    Ok(())
}

/// Whether `path` still names the file `file` has open.
fn names(path: &Path, file: &File) -> io::Result<bool> {
    let named = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(same_file(&named, &file.metadata()?))
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    // Windows does not rename over a file that is open, so the name cannot have moved on.
    true
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
