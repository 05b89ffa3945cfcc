//! [`DurableGate`]: the highest token per lock survives a restart of the resource.
//!
//! Why a hand-written log rather than `redb` (which the workspace already uses): the state is a
//! map from name to one number that only grows, so an append-only log with a checksum per record
//! is all the storage engine needed, it is short enough to verify by reading, and a resource that
//! embeds this crate does not inherit a database engine and its file-format upgrades.
//!
//! On disk, `<dir>/fence.log`:
//! - an 8-byte header, [`LOG_MAGIC`];
//! - records, each `len: u32 LE | crc: u32 LE | token: u64 LE | name: UTF-8`, where `len` counts
//!   token and name, and `crc` is the CRC-32 of the `len` bytes followed by token and name (so a
//!   damaged length cannot pass for a good one).
//!
//! Every raise of a lock's highest token appends one record and `fdatasync`s it *before* the
//! write it guards runs. Equal tokens write nothing. Replay on open keeps the largest token per
//! name.
//!
//! Crashes: an append that was not synced can leave a torn last record. Replay drops it (and
//! truncates the file so later appends do not follow garbage): it was never acknowledged, so no
//! write ran under it. A damaged record *followed by valid data* cannot come from a crash and is
//! reported as [`StorageError::Corrupt`] instead of being silently skipped, since skipping an
//! acknowledged record would readmit a stale holder.
//!
//! Compaction: once the log is [`limits::LOG_COMPACT_RATIO`] times larger than one record per
//! name (and at least `log_compact_bytes_min`), it is rewritten to `fence.log.tmp`, synced,
//! renamed over `fence.log`, and the directory is synced. The rename is the commit point; a crash
//! before it leaves the old log intact (the leftover temp file is removed on open).
//!
//! Failure is fail-stop: after a failed write or sync the gate refuses every raise until it is
//! reopened, because after a failed `fsync` the kernel may have dropped the data while a later
//! `fsync` reports success. Equal tokens are still admitted (they need no new durable state) and
//! lower ones still rejected.
//!
//! One gate per directory: two gates (or two processes) on the same directory each keep their
//! own highest values and void the guarantee.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::crc::crc32;
use crate::gate::{lock, Admitted, FenceError, FenceGate, Slots};
use crate::limits;

/// First bytes of a fence log; the last byte is the format version.
pub const LOG_MAGIC: [u8; 8] = *b"LKFENCE\x01";
/// File name of the log inside the gate's directory.
pub const LOG_FILE_NAME: &str = "fence.log";
const TMP_FILE_NAME: &str = "fence.log.tmp";
/// len (4) + crc (4).
const RECORD_HEADER_BYTES: usize = 8;
const TOKEN_BYTES: usize = 8;
const _: () = assert!(
    RECORD_HEADER_BYTES + TOKEN_BYTES + limits::LOCK_NAME_BYTES_MAX == limits::LOG_RECORD_BYTES_MAX
);

/// Fatal storage errors of the durable gate.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a latchkey fence log (missing or unknown header)")]
    BadHeader { path: PathBuf },
    #[error(
        "{path} is corrupt at byte {offset} ({reason}); valid data follows, so this is not a torn \
         write from a crash and is not repaired automatically"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: &'static str,
    },
    #[error("an earlier write to the fence log failed ({cause}); reopen the gate")]
    Poisoned { cause: String },
    #[error("invalid durable gate config: {0}")]
    InvalidConfig(&'static str),
}

/// Settings of a [`DurableGate`]; `Default` is right for production.
#[derive(Debug, Clone)]
pub struct DurableConfig {
    /// Lock names the gate admits (names already in the log are always kept).
    pub locks_max: usize,
    /// The log is never compacted below this size.
    pub log_compact_bytes_min: u64,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig {
            locks_max: limits::GATE_LOCKS_DEFAULT,
            log_compact_bytes_min: limits::LOG_COMPACT_BYTES_MIN_DEFAULT,
        }
    }
}

impl DurableConfig {
    pub fn validate(&self) -> Result<(), StorageError> {
        if !(1..=limits::GATE_LOCKS_MAX).contains(&self.locks_max) {
            return Err(StorageError::InvalidConfig(
                "locks_max must be between 1 and limits::GATE_LOCKS_MAX",
            ));
        }
        Ok(())
    }
}

/// A [`FenceGate`] whose highest tokens are fsynced before a write is admitted.
pub struct DurableGate {
    slots: Slots,
    log: Mutex<Log>,
}

struct Log {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    /// Current size of the log file.
    bytes: u64,
    /// Size of a compacted log: header plus one record per name.
    live_bytes: u64,
    /// What the log says, kept so compaction needs no per-lock guard (lock order is always
    /// slot, then log).
    persisted: HashMap<String, u64>,
    compact_bytes_min: u64,
    poisoned: Option<String>,
}

impl DurableGate {
    /// Opens (creating if needed) the gate stored in `dir`, replaying its log.
    pub fn open(dir: impl AsRef<Path>, config: DurableConfig) -> Result<Self, StorageError> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        let path = dir.join(LOG_FILE_NAME);
        let tmp = dir.join(TMP_FILE_NAME);
        // A leftover temp file is an interrupted compaction or creation; the rename never
        // happened, so the log it was meant to replace is complete.
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &tmp)(e)),
        }
        let mut file = match open_log(&path) {
            Ok(f) => f,
            Err(StorageError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                // Created atomically so that a crash never leaves a log without its header.
                replace_durably(&dir, &tmp, &path, &LOG_MAGIC)?;
                open_log(&path)?
            }
            Err(e) => return Err(e),
        };
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).map_err(io_err("read", &path))?;
        let replayed = replay(&buf).map_err(|e| match e {
            ReplayError::BadHeader => StorageError::BadHeader { path: path.clone() },
            ReplayError::Corrupt { offset, reason } => StorageError::Corrupt {
                path: path.clone(),
                offset: offset as u64,
                reason,
            },
        })?;
        if replayed.valid_len < buf.len() {
            file.set_len(replayed.valid_len as u64)
                .and_then(|()| file.sync_all())
                .map_err(io_err("truncate torn tail of", &path))?;
        }
        let slots = Slots::new(config.locks_max);
        let mut live_bytes = LOG_MAGIC.len() as u64;
        for (name, token) in &replayed.highest {
            slots.load(name.clone(), *token);
            live_bytes += record_len(name) as u64;
        }
        Ok(DurableGate {
            slots,
            log: Mutex::new(Log {
                dir,
                path,
                file,
                bytes: replayed.valid_len as u64,
                live_bytes,
                persisted: replayed.highest,
                compact_bytes_min: config.log_compact_bytes_min,
                poisoned: None,
            }),
        })
    }

    /// Size of the log file in bytes (for monitoring compaction).
    pub fn log_bytes(&self) -> u64 {
        lock(&self.log).bytes
    }

    fn persist(&self, name: &str, token: u64) -> Result<(), FenceError> {
        lock(&self.log)
            .append(name, token)
            .map_err(FenceError::from)
    }
}

impl FenceGate for DurableGate {
    fn admit_then<T>(
        &self,
        lock: &str,
        token: u64,
        f: impl FnOnce() -> T,
    ) -> Result<T, FenceError> {
        let (_, out) = self
            .slots
            .admit(lock, token, |t| self.persist(lock, t), f)?;
        Ok(out)
    }

    fn check(&self, lock: &str, token: u64) -> Result<Admitted, FenceError> {
        let (admitted, ()) = self
            .slots
            .admit(lock, token, |t| self.persist(lock, t), || ())?;
        Ok(admitted)
    }

    fn highest(&self, lock: &str) -> Option<u64> {
        self.slots.highest(lock)
    }
}

impl Log {
    fn append(&mut self, name: &str, token: u64) -> Result<(), StorageError> {
        if let Some(cause) = &self.poisoned {
            return Err(StorageError::Poisoned {
                cause: cause.clone(),
            });
        }
        let record = encode_record(name, token);
        if let Err(e) = self
            .file
            .write_all(&record)
            .and_then(|()| self.file.sync_data())
        {
            let err = io_err("append to", &self.path)(e);
            self.poisoned = Some(err.to_string());
            return Err(err);
        }
        self.bytes += record.len() as u64;
        let previous = self.persisted.insert(name.to_owned(), token);
        debug_assert!(
            previous.is_none_or(|p| p < token),
            "tokens in the log only grow"
        );
        if previous.is_none() {
            self.live_bytes += record.len() as u64;
        }
        if self.bytes >= self.compact_bytes_min
            && self.bytes > self.live_bytes.saturating_mul(limits::LOG_COMPACT_RATIO)
        {
            // The record above is durable in whichever file survives, so this admission stands
            // even if compaction fails; later raises are refused (fail-stop).
            if let Err(e) = self.compact() {
                self.poisoned = Some(e.to_string());
            }
        }
        Ok(())
    }

    fn compact(&mut self) -> Result<(), StorageError> {
        let mut buf = Vec::with_capacity(self.live_bytes as usize);
        buf.extend_from_slice(&LOG_MAGIC);
        for (name, token) in &self.persisted {
            buf.extend_from_slice(&encode_record(name, *token));
        }
        let tmp = self.dir.join(TMP_FILE_NAME);
        replace_durably(&self.dir, &tmp, &self.path, &buf)?;
        self.file = open_log(&self.path)?;
        self.bytes = buf.len() as u64;
        Ok(())
    }
}

fn open_log(path: &Path) -> Result<File, StorageError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(io_err("open", path))
}

/// Writes `contents` to `tmp`, syncs it, renames it to `dest` and syncs the directory, so that
/// after a crash `dest` is either the old file or the new one, complete. The same steps as
/// `latchkey_log_store::write_durably`, kept here on purpose: this crate depends on no other
/// latchkey crate, so that a protected resource can take it alone.
fn replace_durably(
    dir: &Path,
    tmp: &Path,
    dest: &Path,
    contents: &[u8],
) -> Result<(), StorageError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(io_err("create", tmp))?;
    f.write_all(contents)
        .and_then(|()| f.sync_all())
        .map_err(io_err("write", tmp))?;
    drop(f);
    fs::rename(tmp, dest).map_err(io_err("rename into place", dest))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync directory", dir))
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Io { op, path, source }
}

fn record_len(name: &str) -> usize {
    RECORD_HEADER_BYTES + TOKEN_BYTES + name.len()
}

fn encode_record(name: &str, token: u64) -> Vec<u8> {
    debug_assert!(crate::gate::validate_lock_name(name).is_ok());
    let len = ((TOKEN_BYTES + name.len()) as u32).to_le_bytes();
    let token = token.to_le_bytes();
    let crc = crc32(&[&len, &token, name.as_bytes()]).to_le_bytes();
    let mut rec = Vec::with_capacity(record_len(name));
    rec.extend_from_slice(&len);
    rec.extend_from_slice(&crc);
    rec.extend_from_slice(&token);
    rec.extend_from_slice(name.as_bytes());
    rec
}

enum Decoded<'a> {
    Record {
        name: &'a str,
        token: u64,
        end: usize,
    },
    Bad(&'static str),
}

fn decode_at(buf: &[u8], off: usize) -> Decoded<'_> {
    let Some(header) = buf.get(off..off + RECORD_HEADER_BYTES) else {
        return Decoded::Bad("incomplete record header");
    };
    let len_bytes = [header[0], header[1], header[2], header[3]];
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let len = u32::from_le_bytes(len_bytes) as usize;
    if !(TOKEN_BYTES + 1..=TOKEN_BYTES + limits::LOCK_NAME_BYTES_MAX).contains(&len) {
        return Decoded::Bad("record length out of range");
    }
    let start = off + RECORD_HEADER_BYTES;
    let end = start + len;
    let Some(body) = buf.get(start..end) else {
        return Decoded::Bad("record runs past the end of the file");
    };
    if crc32(&[&len_bytes, body]) != crc {
        return Decoded::Bad("checksum mismatch");
    }
    let (token, name) = body.split_at(TOKEN_BYTES);
    let mut token_bytes = [0u8; TOKEN_BYTES];
    token_bytes.copy_from_slice(token);
    match std::str::from_utf8(name) {
        Ok(name) => Decoded::Record {
            name,
            token: u64::from_le_bytes(token_bytes),
            end,
        },
        Err(_) => Decoded::Bad("lock name is not UTF-8"),
    }
}

struct Replayed {
    highest: HashMap<String, u64>,
    /// Bytes up to the end of the last good record; anything after is a torn tail.
    valid_len: usize,
}

#[derive(Debug, PartialEq, Eq)]
enum ReplayError {
    BadHeader,
    Corrupt { offset: usize, reason: &'static str },
}

fn replay(buf: &[u8]) -> Result<Replayed, ReplayError> {
    if buf.get(..LOG_MAGIC.len()) != Some(&LOG_MAGIC[..]) {
        return Err(ReplayError::BadHeader);
    }
    let mut highest: HashMap<String, u64> = HashMap::new();
    let mut off = LOG_MAGIC.len();
    while off < buf.len() {
        match decode_at(buf, off) {
            Decoded::Record { name, token, end } => {
                let h = highest.entry(name.to_owned()).or_insert(token);
                *h = (*h).max(token);
                off = end;
            }
            Decoded::Bad(_) if is_torn_tail(buf, off) => break,
            Decoded::Bad(reason) => {
                return Err(ReplayError::Corrupt {
                    offset: off,
                    reason,
                })
            }
        }
    }
    Ok(Replayed {
        highest,
        valid_len: off,
    })
}

/// Whether a bad record at `off` can be the torn last append of a crash. Each admission appends
/// one record and syncs it before returning, so a crash damages at most the bytes of the last
/// record: the bad bytes must fit in one record, and no complete record may start after them.
/// Anything else is corruption, reported rather than guessed at.
fn is_torn_tail(buf: &[u8], off: usize) -> bool {
    buf.len() - off <= limits::LOG_RECORD_BYTES_MAX
        && !(off + 1..buf.len()).any(|p| matches!(decode_at(buf, p), Decoded::Record { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(records: &[(&str, u64)]) -> Vec<u8> {
        let mut buf = LOG_MAGIC.to_vec();
        for (n, t) in records {
            buf.extend_from_slice(&encode_record(n, *t));
        }
        buf
    }

    #[test]
    fn replay_keeps_the_largest_token_per_name() {
        let buf = log_with(&[("a", 1), ("b", 9), ("a", 5)]);
        let r = replay(&buf).expect("valid log");
        assert_eq!(r.highest.get("a"), Some(&5));
        assert_eq!(r.highest.get("b"), Some(&9));
        assert_eq!(r.valid_len, buf.len());
    }

    #[test]
    fn every_truncation_of_the_last_record_is_a_torn_tail() {
        let good = log_with(&[("orders", 7)]);
        let full = log_with(&[("orders", 7), ("orders", 8)]);
        for cut in good.len() + 1..full.len() {
            let r = replay(&full[..cut]).expect("a torn tail is not fatal");
            assert_eq!(r.valid_len, good.len(), "cut at {cut}");
            assert_eq!(r.highest.get("orders"), Some(&7));
        }
    }

    #[test]
    fn zeroed_or_garbled_last_record_is_a_torn_tail() {
        let good = log_with(&[("orders", 7)]);
        let mut zeroed = log_with(&[("orders", 7), ("orders", 8)]);
        zeroed[good.len()..].fill(0);
        assert_eq!(replay(&zeroed).expect("torn").valid_len, good.len());

        let mut flipped = log_with(&[("orders", 7), ("orders", 8)]);
        let last = flipped.len() - 1;
        flipped[last] ^= 0x01;
        assert_eq!(replay(&flipped).expect("torn").valid_len, good.len());
    }

    #[test]
    fn damage_followed_by_a_valid_record_is_corruption_not_a_torn_tail() {
        let first = log_with(&[("a", 1)]);
        let mut buf = log_with(&[("a", 1), ("a", 2), ("a", 3)]);
        buf[first.len() + RECORD_HEADER_BYTES] ^= 0xFF; // the token of ("a", 2)
        assert_eq!(
            replay(&buf).err(),
            Some(ReplayError::Corrupt {
                offset: first.len(),
                reason: "checksum mismatch"
            })
        );
    }

    #[test]
    fn a_log_without_header_is_refused() {
        assert_eq!(replay(b"").err(), Some(ReplayError::BadHeader));
        assert_eq!(replay(b"LKFENCE\x02").err(), Some(ReplayError::BadHeader));
    }

    #[test]
    fn reopen_after_a_torn_append_truncates_it_and_keeps_working() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("open");
            gate.check("orders", 7).expect("admit 7");
        }
        // A crash in the middle of appending ("orders", 9): half the record reached the disk.
        let path = dir.path().join(LOG_FILE_NAME);
        let torn = encode_record("orders", 9);
        let mut f = OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open log");
        f.write_all(&torn[..torn.len() / 2]).expect("write torn");
        drop(f);

        let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("reopen");
        assert_eq!(
            gate.highest("orders"),
            Some(7),
            "the torn 9 was never acknowledged"
        );
        gate.check("orders", 8).expect("8 > 7 is admitted");
        drop(gate);

        // The record of 8 must not sit behind the torn bytes, or the next open would call it
        // corruption.
        let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("reopen again");
        assert_eq!(gate.highest("orders"), Some(8));
    }

    #[test]
    fn corruption_in_the_middle_is_fatal_on_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("open");
            for t in 1..=3 {
                gate.check("orders", t).expect("admit");
            }
        }
        let path = dir.path().join(LOG_FILE_NAME);
        let mut bytes = fs::read(&path).expect("read");
        bytes[LOG_MAGIC.len() + RECORD_HEADER_BYTES] ^= 0xFF;
        fs::write(&path, &bytes).expect("write");
        match DurableGate::open(dir.path(), DurableConfig::default()) {
            Err(StorageError::Corrupt { offset, .. }) => assert_eq!(offset, 8),
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("expected Corrupt, got a gate"),
        }
    }

    #[test]
    fn compaction_bounds_the_log_and_keeps_every_highest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = DurableConfig {
            log_compact_bytes_min: 0,
            ..DurableConfig::default()
        };
        let names = ["a", "b", "c"];
        let live = (LOG_MAGIC.len() + names.iter().map(|n| record_len(n)).sum::<usize>()) as u64;
        {
            let gate = DurableGate::open(dir.path(), config.clone()).expect("open");
            for t in 1..=200u64 {
                for n in names {
                    gate.check(n, t).expect("admit");
                    assert!(gate.log_bytes() <= live * limits::LOG_COMPACT_RATIO);
                }
            }
        }
        assert!(!dir.path().join(TMP_FILE_NAME).exists());
        let gate = DurableGate::open(dir.path(), config).expect("reopen");
        for n in names {
            assert_eq!(gate.highest(n), Some(200));
        }
        assert!(gate.check("a", 199).is_err());
    }

    /// Hostile input (issue #13): the fence log is read back from a disk that may hold
    /// anything. Replaying mutated logs and noise returns a result or an error, never panics,
    /// and a replay that succeeds reports a valid length inside the file.
    mod hostile_input {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

            #[test]
            fn a_mutated_log_replays_or_is_refused(
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                cut in any::<usize>(),
            ) {
                let mut buf = log_with(&[("a", 3), ("b/c", 9), ("a", 7), ("d", 1)]);
                for (at, v) in edits {
                    let at = at % buf.len();
                    buf[at] = v;
                }
                buf.truncate(cut % (buf.len() + 1));
                if let Ok(r) = replay(&buf) {
                    prop_assert!(r.valid_len <= buf.len());
                }
            }

            #[test]
            fn noise_replays_or_is_refused(tail in proptest::collection::vec(any::<u8>(), 0..600)) {
                let mut buf = LOG_MAGIC.to_vec();
                buf.extend(tail);
                if let Ok(r) = replay(&buf) {
                    prop_assert!(r.valid_len <= buf.len());
                }
            }
        }
    }
}
