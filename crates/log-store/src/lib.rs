//! latchkey's Raft log store: openraft's `RaftLogStorage` on an append-only segment log.
//!
//! Layout:
//! - [`LogStore`] (this file): the cheap, cloneable handle openraft and the server hold. Reads
//!   run on the caller from the in-memory index; writes update the index and are queued to
//!   the writer. [`LogReader`] is openraft's weak reader handle.
//! - `index`: the in-memory view every read is served from, updated at submit time: live
//!   entries (their bytes while unsynced, then a bounded tail cache, then a location in a
//!   segment), the vote, committed log id, purge point and meta keys.
//! - `writer`: the one thread that writes each batch of queued requests with one `write` and
//!   one `fdatasync` (group commit), then acknowledges them.
//! - `disk`: the segment files: appending, rotation with a checkpoint, deletion after a purge,
//!   replay and the crash rules on open.
//! - `format`: the bytes of a segment (header with its salt, frames tagged under it and
//!   numbered, checksummed records), pure.
//! - `codec`: the versioned value encoding (format byte + postcard).
//! - `migrate`: reading a log written by the previous (redb) build into a segment directory.
//! - [`durable`]: replacing a small file atomically and durably (the server's `cluster` file,
//!   the snapshot file).
//!
//! On disk, a directory (`<data-dir>/raft-log/`) of segment files `<number:020>.seg`, numbered
//! consecutively; see `format` for the bytes and `disk` for the crash rules.
//!
//! Groups (issue #16): [`LogStore::open_groups`] opens one directory for several Raft groups
//! of a member and answers a handle per group. The handles share the files and the writer, so
//! one `write` and one `fdatasync` commit what all of them queued; each has its own index
//! (entries, vote, committed log id, purge point, meta keys). [`LogStore::open`] is the store
//! of one group, group 0, whose files hold no group records.
//!
//! Durability rule: an append's `IOFlushed` callback fires, and `save_vote` and `write_meta`
//! return, only after the frame that holds the write was written and `fdatasync`ed.

mod codec;
mod disk;
pub mod durable;
mod format;
mod index;
mod migrate;
mod writer;

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds, RangeInclusive};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use openraft::{LogState, OptionalSend, RaftLogReader, RaftTypeConfig};
use tokio::sync::{mpsc, oneshot};

// Every bound of the store (queue, batch, cache, segment size), with its reason, is in the
// core's limits.
use latchkey_core::limits;

pub use codec::VALUE_FORMAT_VERSION;
use disk::{Disk, Group, Indexes};
pub use durable::{create_dir_durably, write_durably};
pub use format::SEGMENT_MAGIC;
use index::{Index, Source};
pub use migrate::{migrate_from_redb, Migrated};
use writer::{BeforeCommit, Op, Request};

/// Why the log store could not be opened, migrated, or a metadata operation failed. Failures
/// inside the openraft traits are `io::Error`s (what the traits return), which openraft turns
/// into a `StorageError` naming the subject.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error("log store: cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Another store (in this process or another) has the directory open.
    #[error("log store {path} is in use by another process or store: {source}")]
    Locked {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Fatal: the log holds something this build cannot read, or damage a crash cannot explain.
    #[error("log store is corrupt: {0}")]
    Corrupt(String),
    /// An earlier write or fsync failed; the store writes nothing more until it is reopened.
    #[error("log store refuses writes after a failure: {0}")]
    Failed(String),
    /// A meta key's length must fit the record's 16-bit length field.
    #[error("log store meta key of {0} bytes is too long")]
    MetaKeyTooLong(usize),
    #[error("cannot start the log store writer thread: {0}")]
    SpawnWriter(io::Error),
    /// `open_groups` needs at least one group, each named once.
    #[error("log store: the groups to open, {0:?}, are empty or name a group twice")]
    Groups(Vec<u32>),
    /// The old (redb) log could not be read for migration.
    #[error("cannot read the old log {path} to migrate it: {source}")]
    OldLog {
        path: PathBuf,
        #[source]
        source: redb::Error,
    },
}

/// Counters of the writer, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStoreStats {
    /// Group commits written (each is one `write` and one `fdatasync`).
    pub write_transactions: u64,
    /// Requests (appends, vote and committed saves, truncations, purges) those commits held.
    pub requests_written: u64,
}

/// Told the duration of each group commit (write and fdatasync) once it returned; the server
/// feeds its `latchkey_fsync_seconds` histogram from it.
pub type CommitObserver = Box<dyn Fn(std::time::Duration) + Send + Sync>;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) write_transactions: AtomicU64,
    pub(crate) requests_written: AtomicU64,
    pub(crate) commit_observer: ObserverSlot,
}

/// The commit observer, set at most once after the store is opened.
#[derive(Default)]
pub(crate) struct ObserverSlot(pub(crate) std::sync::OnceLock<CommitObserver>);

impl Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "ObserverSlot(set)"
        } else {
            "ObserverSlot(unset)"
        })
    }
}

/// How a store is opened; `Default` is production. Tests shrink the segments (so rotation and
/// deletion happen often) and the tail cache (so reads go to the files), and hold the writer.
pub(crate) struct Options {
    pub(crate) segment_bytes: u64,
    /// Zeros written ahead of the appends (`limits::LOG_PREALLOCATE_BYTES`).
    pub(crate) preallocate_bytes: u64,
    pub(crate) cache_bytes: usize,
    pub(crate) before_commit: Option<BeforeCommit>,
    /// See [`LogStore::held_back_upto`].
    pub(crate) held_back_max: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_bytes: limits::LOG_SEGMENT_BYTES,
            preallocate_bytes: limits::LOG_PREALLOCATE_BYTES,
            cache_bytes: limits::LOG_TAIL_CACHE_BYTES,
            before_commit: None,
            held_back_max: limits::LOG_SEGMENTS_HELD_BACK_MAX,
        }
    }
}

/// Handle to one Raft group's log. Clones share the files, the writer and the index; the
/// handles of the other groups opened with it share the files and the writer.
pub struct LogStore<C: RaftTypeConfig> {
    shared: Arc<Shared<C>>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            shared: self.shared.clone(),
        }
    }
}

impl<C: RaftTypeConfig> Debug for LogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// One group's part: its index, and the files and writer it shares.
struct Shared<C: RaftTypeConfig> {
    group: Group,
    index: Arc<Mutex<Index<LogIdOf<C>>>>,
    core: Arc<Core<C>>,
}

/// What the groups of one directory share.
struct Core<C: RaftTypeConfig> {
    disk: Arc<Mutex<Disk>>,
    /// Every group's index, for a failure that stops them all.
    indexes: Indexes<LogIdOf<C>>,
    held_back_max: usize,
    counters: Arc<Counters>,
    /// `None` only while dropping: closing the channel is what stops the writer.
    tx: Option<mpsc::Sender<Request<C>>>,
    writer: Option<JoinHandle<()>>,
}

impl<C: RaftTypeConfig> Drop for Core<C> {
    fn drop(&mut self) {
        // The writer finishes what is queued, sees the closed channel and returns; joining it
        // means every acknowledged write is on disk when the last handle is gone.
        self.tx.take();
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!("log store writer thread panicked");
            }
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding this lock is a bug in this crate; the state may be half updated.
    m.lock().expect("log store lock poisoned")
}

fn writer_gone() -> io::Error {
    io::Error::other("log store writer has stopped")
}

fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The indexes of `range` that are also in `allowed`, as one inclusive range, or `None` if
/// there are none. (Turning both into inclusive bounds avoids `BTreeMap::range` panics on
/// empty ranges.)
fn intersect(
    range: &impl RangeBounds<u64>,
    allowed: &impl RangeBounds<u64>,
) -> Option<RangeInclusive<u64>> {
    fn low(b: Bound<&u64>) -> Option<u64> {
        match b {
            Bound::Included(&x) => Some(x),
            Bound::Excluded(&x) => x.checked_add(1),
            Bound::Unbounded => Some(0),
        }
    }
    fn high(b: Bound<&u64>) -> Option<u64> {
        match b {
            Bound::Included(&x) => Some(x),
            Bound::Excluded(&x) => x.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        }
    }
    let lo = low(range.start_bound())?.max(low(allowed.start_bound())?);
    let hi = high(range.end_bound())?.min(high(allowed.end_bound())?);
    (lo <= hi).then_some(lo..=hi)
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// Opens (creating if needed) the log store of one group in the segment directory `dir`,
    /// e.g. `<data-dir>/raft-log`, replays it and starts its writer thread. A log of the
    /// previous (redb) build is migrated first with [`migrate_from_redb`].
    pub fn open(dir: &Path) -> Result<LogStore<C>, LogStoreError> {
        Self::open_with(dir, Options::default())
    }

    /// Opens `dir` as the shared log of the Raft groups `groups` (at least one, each once),
    /// answering each group's handle in the order given: one writer and one `fdatasync` per
    /// batch for all of them. A log of one group, written by [`LogStore::open`], is group 0's
    /// here. Refuses, as corrupt, a log holding a group not in `groups`.
    pub fn open_groups(dir: &Path, groups: &[u32]) -> Result<Vec<LogStore<C>>, LogStoreError> {
        Self::open_groups_with(dir, groups, Options::default())
    }

    /// [`LogStore::open_groups`] with segments of `segment_bytes` instead of
    /// `limits::LOG_SEGMENT_BYTES`, for tests that need rotation, deletion and the held-back
    /// rule to happen within a few entries.
    pub fn open_groups_with_segment_bytes(
        dir: &Path,
        groups: &[u32],
        segment_bytes: u64,
    ) -> Result<Vec<LogStore<C>>, LogStoreError> {
        let options = Options {
            segment_bytes,
            ..Options::default()
        };
        Self::open_groups_with(dir, groups, options)
    }

    pub(crate) fn open_with(dir: &Path, options: Options) -> Result<LogStore<C>, LogStoreError> {
        let mut stores = Self::open_groups_with(dir, &[0], options)?;
        Ok(stores.pop().expect("one group asked for"))
    }

    pub(crate) fn open_groups_with(
        dir: &Path,
        groups: &[u32],
        options: Options,
    ) -> Result<Vec<LogStore<C>>, LogStoreError> {
        let distinct: std::collections::BTreeSet<_> = groups.iter().collect();
        if groups.is_empty() || distinct.len() != groups.len() {
            return Err(LogStoreError::Groups(groups.to_vec()));
        }
        let entry = |index: u64, bytes: &[u8]| -> Result<LogIdOf<C>, String> {
            let entry: C::Entry = codec::decode(bytes, &format_args!("log entry {index}"))
                .map_err(|e| e.to_string())?;
            if entry.index() != index {
                return Err(format!(
                    "log entry stored at {index} has index {}",
                    entry.index()
                ));
            }
            Ok(entry.log_id())
        };
        let log_id = |bytes: &[u8]| -> Result<(LogIdOf<C>, u64), String> {
            let log_id: LogIdOf<C> =
                codec::decode(bytes, &"last purged log id").map_err(|e| e.to_string())?;
            let index = log_id.index();
            Ok((log_id, index))
        };
        let decoders = disk::Decoders {
            entry: &entry,
            log_id: &log_id,
        };
        let (loaded, disk) = disk::load(
            dir,
            groups,
            options.segment_bytes,
            options.preallocate_bytes,
            options.cache_bytes,
            &decoders,
        )?;
        // Refuse a log we cannot read now, rather than when Raft first needs it.
        for (group, index) in &loaded {
            let corrupt = |e: io::Error| {
                LogStoreError::Corrupt(format!("{} (Raft group {group}): {e}", dir.display()))
            };
            if let Some(v) = &index.vote {
                codec::decode::<VoteOf<C>>(v, &"vote").map_err(corrupt)?;
            }
            if let Some(c) = &index.committed {
                codec::decode::<Option<LogIdOf<C>>>(c, &"committed log id").map_err(corrupt)?;
            }
        }

        let indexes: Indexes<LogIdOf<C>> = loaded
            .into_iter()
            .map(|(group, index)| (group, Arc::new(Mutex::new(index))))
            .collect();
        let disk = Arc::new(Mutex::new(disk));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel(limits::LOG_WRITE_QUEUE_CAPACITY);
        let (before_commit, held_back_max) = (options.before_commit, options.held_back_max);
        let writer = std::thread::Builder::new()
            .name("latchkey-log-writer".into())
            .spawn({
                let (disk, indexes, counters) = (disk.clone(), indexes.clone(), counters.clone());
                move || writer::run::<C>(disk, indexes, counters, rx, before_commit)
            })
            .map_err(LogStoreError::SpawnWriter)?;
        let core = Arc::new(Core {
            disk,
            indexes: indexes.clone(),
            held_back_max,
            counters,
            tx: Some(tx),
            writer: Some(writer),
        });
        Ok(groups
            .iter()
            .map(|group| LogStore {
                shared: Arc::new(Shared {
                    group: *group,
                    index: indexes[group].clone(),
                    core: core.clone(),
                }),
            })
            .collect())
    }

    /// Tells `observer` the duration of every group commit from now on (the first observer set
    /// stays; a second is refused with `false`). The groups of a shared log share their
    /// commits, so they share the observer too.
    pub fn observe_commits(&self, observer: CommitObserver) -> bool {
        self.shared
            .core
            .counters
            .commit_observer
            .0
            .set(observer)
            .is_ok()
    }

    /// What the writer has done since the store was opened (for every group it writes).
    pub fn stats(&self) -> LogStoreStats {
        let c = &self.shared.core.counters;
        LogStoreStats {
            write_transactions: c.write_transactions.load(Ordering::Relaxed),
            requests_written: c.requests_written.load(Ordering::Relaxed),
        }
    }

    /// Reads an application key (the server's cluster identity, member list, ...).
    pub fn read_meta(&self, key: &str) -> Result<Option<Vec<u8>>, LogStoreError> {
        Ok(lock(&self.shared.index).meta.get(key).cloned())
    }

    /// Writes an application key durably (one write and fdatasync of its own) before
    /// returning. Blocks the calling thread for one sync: call it at start-up or from a
    /// blocking task.
    ///
    /// It does not go through the writer's queue (that would need an async API or risk
    /// blocking a runtime thread on the queue): it writes under the same lock the writer holds
    /// for each batch, so it is ordered with the batches, and a rotation's checkpoint, taken
    /// under that lock too, holds every meta key written before it. App keys are independent
    /// of the Raft log, so their order relative to log writes does not matter otherwise.
    pub fn write_meta(&self, key: &str, value: &[u8]) -> Result<(), LogStoreError> {
        // Refused before the writer sees it: an encoding failure there is fail-stop.
        if u16::try_from(key.len()).is_err() {
            return Err(LogStoreError::MetaKeyTooLong(key.len()));
        }
        let group = self.shared.group;
        let marker = (group != 0).then_some(format::Record::Group(group));
        let mut disk = lock(&self.shared.core.disk);
        match disk.write_batch(
            marker
                .into_iter()
                .chain([format::Record::Meta { key, value }]),
        ) {
            Ok(_) => {
                lock(&self.shared.index)
                    .meta
                    .insert(key.to_owned(), value.to_vec());
                Ok(())
            }
            Err(msg) => {
                // The groups share the files: every one of them stops, as after a failed batch.
                writer::fail_all(&self.shared.core.indexes, &msg);
                Err(LogStoreError::Failed(msg))
            }
        }
    }

    /// Returns once everything submitted to this log before the call is durable (for a caller
    /// that must know its queued purges and saves are on disk, such as a restore).
    pub async fn sync(&self) -> Result<(), io::Error> {
        let (done, synced) = oneshot::channel();
        self.submit(|_, _| Ok(Op::Sync { done })).await?;
        synced.await.map_err(|_| writer_gone())?
    }

    /// The index this group must purge up to (a snapshot covering it, then a purge) for the
    /// log's oldest segment to be deleted, when its entries there hold that segment back and
    /// the log has grown past `limits::LOG_SEGMENTS_HELD_BACK_MAX` segments; `None` otherwise,
    /// and always in a log of one group (its snapshot policy alone decides its purges).
    /// A member's groups share one log and only whole segments are deleted, from the front:
    /// a quiet group, whose few entries never reach the snapshot policy, would otherwise keep
    /// every later segment on disk. The server asks this (`compact_log`) through a
    /// [`LogWatch`].
    pub fn held_back_upto(&self) -> Option<u64> {
        self.shared.held_back_upto()
    }

    /// A handle that asks [`LogStore::held_back_upto`] without keeping the store open.
    pub fn watch(&self) -> LogWatch<C> {
        LogWatch {
            shared: Arc::downgrade(&self.shared),
        }
    }

    fn sender(&self) -> &mpsc::Sender<Request<C>> {
        self.shared
            .core
            .tx
            .as_ref()
            .expect("the sender lives until the store is dropped")
    }

    /// Queues one write. `make` updates the index and builds the request under the index
    /// lock, and the request enters the queue under the same lock, so queue order (file order)
    /// equals the order in which reads saw the changes.
    async fn submit(
        &self,
        make: impl FnOnce(&mut Index<LogIdOf<C>>, u64) -> Result<Op<C>, io::Error>,
    ) -> Result<(), io::Error> {
        let permit = self.sender().reserve().await.map_err(|_| writer_gone())?;
        let mut index = lock(&self.shared.index);
        if let Some(msg) = &index.failed {
            return Err(io::Error::other(format!(
                "log store refuses writes after a failure: {msg}"
            )));
        }
        let seq = index.take_seq();
        let op = make(&mut index, seq)?;
        permit.send(Request {
            group: self.shared.group,
            seq,
            op,
        });
        Ok(())
    }

    /// Makes the disk full `room` bytes past the active segment's current length (see
    /// `Disk::fill_disk`).
    #[cfg(test)]
    pub(crate) fn fill_disk(&self, room: u64) {
        lock(&self.shared.core.disk).fill_disk(room);
    }

    /// Segment numbers on disk, oldest first.
    #[cfg(test)]
    pub(crate) fn segment_numbers(&self) -> Vec<u64> {
        lock(&self.shared.core.disk).segment_numbers()
    }
}

/// A weak handle to one group's log: [`LogStore::held_back_upto`] while the store is open,
/// `None` once it is closed.
pub struct LogWatch<C: RaftTypeConfig> {
    shared: Weak<Shared<C>>,
}

impl<C: RaftTypeConfig> Clone for LogWatch<C> {
    fn clone(&self) -> Self {
        LogWatch {
            shared: self.shared.clone(),
        }
    }
}

impl<C: RaftTypeConfig> LogWatch<C> {
    pub fn held_back_upto(&self) -> Option<u64> {
        self.shared.upgrade()?.held_back_upto()
    }
}

impl<C: RaftTypeConfig> Shared<C> {
    fn held_back_upto(&self) -> Option<u64> {
        if self.core.indexes.len() < 2 {
            return None;
        }
        lock(&self.core.disk).held_back_by(self.group, self.core.held_back_max)
    }

    fn index(&self) -> Result<MutexGuard<'_, Index<LogIdOf<C>>>, io::Error> {
        let index = lock(&self.index);
        if let Some(msg) = &index.failed {
            return Err(io::Error::other(format!("log store failed earlier: {msg}")));
        }
        Ok(index)
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<C::Entry>, io::Error> {
        let Some(range) = intersect(&range, &(..)) else {
            return Ok(Vec::new());
        };
        let sources = self.index()?.sources(range).map_err(invalid_data)?;
        let mut out = Vec::with_capacity(sources.len());
        let decode = |index: u64, bytes: &[u8]| -> Result<C::Entry, io::Error> {
            let entry: C::Entry = codec::decode(bytes, &format_args!("log entry {index}"))?;
            if entry.index() != index {
                return Err(invalid_data(format!(
                    "log entry stored at {index} has index {}",
                    entry.index()
                )));
            }
            Ok(entry)
        };
        let mut i = 0;
        while i < sources.len() {
            let (index, source) = &sources[i];
            let (file, first) = match source {
                Source::Memory(bytes) => {
                    out.push(decode(*index, bytes)?);
                    i += 1;
                    continue;
                }
                Source::Disk(file, loc) => (file, *loc),
            };
            // Entries next to each other in one segment are read with one positioned read.
            let mut end = first.offset + u64::from(first.len);
            let mut j = i + 1;
            while let Some((_, Source::Disk(_, loc))) = sources.get(j) {
                if loc.segment != first.segment || loc.offset != end {
                    break;
                }
                end += u64::from(loc.len);
                j += 1;
            }
            let mut buf = vec![0u8; (end - first.offset) as usize];
            file.read_exact_at(&mut buf, first.offset).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("read log entries from segment {}: {e}", first.segment),
                )
            })?;
            for (index, source) in &sources[i..j] {
                let Source::Disk(_, loc) = source else {
                    unreachable!("the run holds disk entries only")
                };
                let at = (loc.offset - first.offset) as usize;
                let record = &buf[at..at + loc.len as usize];
                out.push(decode(*index, entry_bytes(record, *index)?)?);
            }
            i = j;
        }
        Ok(out)
    }

    fn log_state(&self) -> Result<LogState<C>, io::Error> {
        let index = self.index()?;
        let last_purged_log_id = index.last_purged.clone();
        Ok(LogState {
            last_log_id: index.last_log_id().or_else(|| last_purged_log_id.clone()),
            last_purged_log_id,
        })
    }

    fn read_vote(&self) -> Result<Option<VoteOf<C>>, io::Error> {
        let bytes = self.index()?.vote.clone();
        bytes.map(|b| codec::decode(&b, &"vote")).transpose()
    }
}

/// The entry bytes of the record read back from `loc`, after checking its checksum, kind and
/// index: a positioned read of a damaged sector is an error, not a wrong entry.
fn entry_bytes(record: &[u8], index: u64) -> Result<&[u8], io::Error> {
    let bad = |why: &dyn std::fmt::Display| {
        invalid_data(format!(
            "log entry {index} read back from its segment: {why}"
        ))
    };
    let frame = format::record_at(record, 0).map_err(|e| bad(&e))?;
    if frame.body.end != record.len() {
        return Err(bad(&"record length changed"));
    }
    match format::decode_record(frame.kind, &record[frame.body]).map_err(|e| bad(&e))? {
        format::Record::Entry { index: at, bytes } if at == index => Ok(bytes),
        other => Err(bad(&format_args!("found {other:?}"))),
    }
}

// Reads run on the caller's task: they are served from memory, or from one positioned read of
// the page cache for older entries; a `spawn_blocking` per read would cost more than the read.
impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        self.shared.entries(range)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        // Vote saves wait for their sync, and the vote becomes readable only then.
        self.shared.read_vote()
    }
}

/// The reader openraft hands to its replication and state-machine tasks. It holds the store
/// weakly: those tasks may outlive `Raft::shutdown` by a moment, and a strong handle would keep
/// the writer running and the files open, so an in-process restart would open a second writer
/// on the same directory.
pub struct LogReader<C: RaftTypeConfig> {
    shared: Weak<Shared<C>>,
}

impl<C: RaftTypeConfig> Clone for LogReader<C> {
    fn clone(&self) -> Self {
        LogReader {
            shared: self.shared.clone(),
        }
    }
}

impl<C: RaftTypeConfig> LogReader<C> {
    fn shared(&self) -> Result<Arc<Shared<C>>, io::Error> {
        self.shared
            .upgrade()
            .ok_or_else(|| io::Error::other("log store is closed"))
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogReader<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        self.shared()?.entries(range)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        self.shared()?.read_vote()
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = LogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        self.shared.log_state()
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            shared: Arc::downgrade(&self.shared),
        }
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        let bytes = codec::encode(vote)?;
        let (done, saved) = oneshot::channel();
        self.submit(|_, _| Ok(Op::SaveVote { bytes, done })).await?;
        // Durable before returning, as openraft requires of a vote.
        saved.await.map_err(|_| writer_gone())?
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let bytes = codec::encode(&committed)?;
        self.submit(|index, _| {
            index.committed = Some(bytes.clone());
            Ok(Op::SaveCommitted { bytes })
        })
        .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        let bytes = self.shared.index()?.committed.clone();
        Ok(bytes
            .map(|b| codec::decode::<Option<LogIdOf<C>>>(&b, &"committed log id"))
            .transpose()?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Encode before queueing, so the writer thread only does I/O and an encoding error
        // reaches the caller.
        let encoded = entries
            .into_iter()
            .map(|e| Ok((e.log_id(), Arc::<[u8]>::from(codec::encode(&e)?))))
            .collect::<Result<Vec<_>, io::Error>>()?;
        self.submit(|index, seq| {
            if let Some((first, _)) = encoded.first() {
                index
                    .check_append(first.index())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            }
            for pair in encoded.windows(2) {
                if pair[1].0.index() != pair[0].0.index() + 1 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "appended entries {} and {} are not consecutive",
                            pair[0].0.index(),
                            pair[1].0.index()
                        ),
                    ));
                }
            }
            let mut rows = Vec::with_capacity(encoded.len());
            for (log_id, bytes) in encoded {
                let i = log_id.index();
                index.append(seq, i, log_id, bytes.clone());
                rows.push((i, bytes));
            }
            Ok(Op::Append { rows, callback })
        })
        .await
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index() + 1);
        self.submit(|index, _| {
            index.truncate(from);
            Ok(Op::Truncate { from })
        })
        .await
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        let last_purged = codec::encode(&log_id)?;
        let upto = log_id.index();
        self.submit(|index, _| {
            index.purge(log_id, upto);
            Ok(Op::Purge { upto, last_purged })
        })
        .await
    }
}

#[cfg(test)]
mod tests;
