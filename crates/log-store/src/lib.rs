//! latchkey's Raft log store: openraft's `RaftLogStorage` on one redb file.
//!
//! Layout:
//! - [`LogStore`] (this file): the cheap, cloneable handle openraft and the server hold. Reads
//!   run on the caller; writes are queued to the writer. [`LogReader`] is openraft's weak
//!   reader handle.
//! - `writer`: the one thread that owns write transactions and commits each batch of queued
//!   requests with one fsync (group commit), then acknowledges them.
//! - `pending`: submitted writes the writer has not committed yet, merged into every read so an
//!   appended entry is readable as soon as `append` returns, as openraft requires.
//! - `codec`: the versioned value encoding (format byte + postcard).
//! - [`durable`]: replacing a small file atomically and durably (the server's `members` file,
//!   the snapshot file).
//!
//! Tables in the file: `raft_log` (index -> entry), `raft_state` (vote, committed log id, last
//! purged log id), `app_meta` (the server's own keys, e.g. the cluster identity).
//!
//! Durability rule: an append's `IOFlushed` callback fires, and `save_vote` returns, only after
//! the transaction that holds the write has committed with `Durability::Immediate`.

mod codec;
pub mod durable;
mod pending;
mod writer;

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds, RangeInclusive};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use openraft::{LogState, OptionalSend, RaftLogReader, RaftTypeConfig};
use redb::{Database, Durability, ReadableDatabase, TableDefinition};
use tokio::sync::{mpsc, oneshot};

// Every bound of the store (queue, batch, cache), with its reason, is in the core's limits.
use latchkey_core::limits;

pub use codec::VALUE_FORMAT_VERSION;
pub use durable::write_durably;
use pending::Pending;
use writer::{BeforeCommit, Op, Request};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("app_meta");

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";

/// Why the log store could not be opened or a metadata operation failed. Failures inside the
/// openraft traits are `io::Error`s (what the traits return), which openraft turns into a
/// `StorageError` naming the subject.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error("cannot open the log store {path}: {source}")]
    Open {
        path: PathBuf,
        source: redb::DatabaseError,
    },
    #[error("log store transaction failed: {0}")]
    Transaction(#[from] redb::TransactionError),
    #[error("log store table failed: {0}")]
    Table(#[from] redb::TableError),
    #[error("log store I/O failed: {0}")]
    Storage(#[from] redb::StorageError),
    #[error("log store commit failed: {0}")]
    Commit(#[from] redb::CommitError),
    #[error("log store durability setting failed: {0}")]
    Durability(#[from] redb::SetDurabilityError),
    /// Fatal: the file holds something this build cannot read.
    #[error("log store is corrupt: {0}")]
    Corrupt(String),
    #[error("cannot start the log store writer thread: {0}")]
    SpawnWriter(io::Error),
}

/// Counters of the writer, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStoreStats {
    /// Write transactions committed (each is one fsync).
    pub write_transactions: u64,
    /// Requests (appends, vote and committed saves, truncations, purges) those transactions held.
    pub requests_written: u64,
}

/// Told the duration of each group commit (write transaction and fsync) once it returned; the
/// server feeds its `latchkey_fsync_seconds` histogram from it.
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

/// Handle to the log store. Clones share the file, the writer and the pending writes.
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

struct Shared<C: RaftTypeConfig> {
    db: Arc<Database>,
    pending: Arc<Mutex<Pending<LogIdOf<C>>>>,
    counters: Arc<Counters>,
    /// `None` only while dropping: closing the channel is what stops the writer.
    tx: Option<mpsc::Sender<Request<C>>>,
    writer: Option<JoinHandle<()>>,
}

impl<C: RaftTypeConfig> Drop for Shared<C> {
    fn drop(&mut self) {
        // The writer finishes what is queued, sees the closed channel and returns; joining it
        // means the file is closed when the last handle is gone, so the store can be reopened.
        self.tx.take();
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!("log store writer thread panicked");
            }
        }
    }
}

type PendingGuard<'a, C> = MutexGuard<'a, Pending<LogIdOf<C>>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding this lock is a bug in this crate; the overlay may be half updated.
    m.lock().expect("log store pending-writes lock poisoned")
}

fn io_err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

fn writer_gone() -> io::Error {
    io::Error::other("log store writer has stopped")
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
    /// Opens (creating if needed) the log store in the redb file at `path`, e.g.
    /// `<data-dir>/raft-log.redb`, and starts its writer thread.
    pub fn open(path: &Path) -> Result<LogStore<C>, LogStoreError> {
        Self::open_with_hook(path, None)
    }

    pub(crate) fn open_with_hook(
        path: &Path,
        before_commit: Option<BeforeCommit>,
    ) -> Result<LogStore<C>, LogStoreError> {
        let db = redb::Builder::new()
            .set_cache_size(limits::LOG_CACHE_BYTES)
            .create(path)
            .map_err(|source| LogStoreError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        // Create the tables up front so that readers never meet a missing table.
        let txn = db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(STATE)?;
        txn.open_table(META)?;
        txn.commit()?;

        let db = Arc::new(db);
        let pending = Arc::new(Mutex::new(Pending::new()));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel(limits::LOG_WRITE_QUEUE_CAPACITY);
        let writer = std::thread::Builder::new()
            .name("latchkey-log-writer".into())
            .spawn({
                let (db, pending, counters) = (db.clone(), pending.clone(), counters.clone());
                move || writer::run::<C>(db, pending, counters, rx, before_commit)
            })
            .map_err(LogStoreError::SpawnWriter)?;
        let store = LogStore {
            shared: Arc::new(Shared {
                db,
                pending,
                counters,
                tx: Some(tx),
                writer: Some(writer),
            }),
        };

        // Refuse a file we cannot read now, rather than when Raft first needs it.
        let shared = &store.shared;
        shared
            .read_state::<VoteOf<C>>(KEY_VOTE)
            .and_then(|_| shared.read_state::<Option<LogIdOf<C>>>(KEY_COMMITTED))
            .and_then(|_| shared.read_state::<LogIdOf<C>>(KEY_LAST_PURGED))
            .and_then(|_| shared.log_state())
            .map_err(|e| LogStoreError::Corrupt(e.to_string()))?;
        Ok(store)
    }

    /// Tells `observer` the duration of every group commit from now on (the first observer set
    /// stays; a second is refused with `false`).
    pub fn observe_commits(&self, observer: CommitObserver) -> bool {
        self.shared.counters.commit_observer.0.set(observer).is_ok()
    }

    /// What the writer has done since the store was opened.
    pub fn stats(&self) -> LogStoreStats {
        let c = &self.shared.counters;
        LogStoreStats {
            write_transactions: c.write_transactions.load(Ordering::Relaxed),
            requests_written: c.requests_written.load(Ordering::Relaxed),
        }
    }

    /// Reads an application key (the server's cluster identity, member list, ...).
    pub fn read_meta(&self, key: &str) -> Result<Option<Vec<u8>>, LogStoreError> {
        let txn = self.shared.db.begin_read()?;
        let table = txn.open_table(META)?;
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Writes an application key durably (fsync) before returning. Blocks the calling thread for
    /// one commit: call it at start-up or from a blocking task.
    ///
    /// It does not go through the writer: app keys are independent of the Raft log, so their
    /// order relative to log writes does not matter, and redb runs one write transaction at a
    /// time anyway. Going through the async queue would need an async API or risk blocking a
    /// runtime thread on the queue.
    pub fn write_meta(&self, key: &str, value: &[u8]) -> Result<(), LogStoreError> {
        let mut txn = self.shared.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(META)?.insert(key, value)?;
        txn.commit()?;
        Ok(())
    }

    fn sender(&self) -> &mpsc::Sender<Request<C>> {
        self.shared
            .tx
            .as_ref()
            .expect("the sender lives until the store is dropped")
    }

    /// Queues one write. `make` updates the overlay and builds the request under the overlay
    /// lock, and the request enters the queue under the same lock, so queue order equals
    /// sequence order: the writer's "committed up to `seq`" then covers exactly what it says.
    async fn submit(
        &self,
        make: impl FnOnce(&mut Pending<LogIdOf<C>>, u64) -> Op<C>,
    ) -> Result<(), io::Error> {
        let permit = self.sender().reserve().await.map_err(|_| writer_gone())?;
        let mut pending = lock(&self.shared.pending);
        if let Some(msg) = &pending.failed {
            return Err(io::Error::other(format!(
                "log store refuses writes after a failure: {msg}"
            )));
        }
        let seq = pending.take_seq();
        let op = make(&mut pending, seq);
        permit.send(Request { seq, op });
        Ok(())
    }
}

impl<C: RaftTypeConfig> Shared<C> {
    /// Takes the overlay's view and a read transaction together (see `pending`).
    fn begin_read(&self) -> Result<(PendingGuard<'_, C>, redb::ReadTransaction), io::Error> {
        let pending = lock(&self.pending);
        if let Some(msg) = &pending.failed {
            return Err(io::Error::other(format!("log store failed earlier: {msg}")));
        }
        let txn = self.db.begin_read().map_err(|e| io_err("begin read", e))?;
        Ok((pending, txn))
    }

    fn read_state<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, io::Error> {
        let txn = self.db.begin_read().map_err(|e| io_err("begin read", e))?;
        read_state_in(&txn, key)
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<C::Entry>, io::Error> {
        let (overlay, file_range, txn) = {
            let (pending, txn) = self.begin_read()?;
            let overlay: Vec<(u64, Vec<u8>)> = match intersect(&range, &(..)) {
                Some(r) => pending
                    .entries
                    .range(r)
                    .map(|(&i, e)| (i, e.value.1.clone()))
                    .collect(),
                None => Vec::new(),
            };
            (overlay, intersect(&range, &pending.file_bounds()), txn)
        };
        let mut rows: std::collections::BTreeMap<u64, Vec<u8>> = std::collections::BTreeMap::new();
        if let Some(file_range) = file_range {
            let table = txn
                .open_table(LOG)
                .map_err(|e| io_err("open log table", e))?;
            for row in table.range(file_range).map_err(|e| io_err("read log", e))? {
                let (k, v) = row.map_err(|e| io_err("read log", e))?;
                rows.insert(k.value(), v.value().to_vec());
            }
        }
        rows.extend(overlay);
        rows.into_iter()
            .map(|(index, bytes)| {
                let entry: C::Entry = codec::decode(&bytes, &format_args!("log entry {index}"))?;
                if entry.index() != index {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("log entry stored at {index} has index {}", entry.index()),
                    ));
                }
                Ok(entry)
            })
            .collect()
    }

    fn log_state(&self) -> Result<LogState<C>, io::Error> {
        let (overlay_last, pending_purged, file_range, txn) = {
            let (pending, txn) = self.begin_read()?;
            (
                pending
                    .entries
                    .last_key_value()
                    .map(|(_, e)| e.value.0.clone()),
                pending.purged.as_ref().map(|p| p.value.0.clone()),
                intersect(&(..), &pending.file_bounds()),
                txn,
            )
        };
        let last_purged_log_id = match pending_purged {
            Some(log_id) => Some(log_id),
            None => read_state_in::<LogIdOf<C>>(&txn, KEY_LAST_PURGED)?,
        };
        let mut file_last = None;
        if let Some(file_range) = file_range {
            let table = txn
                .open_table(LOG)
                .map_err(|e| io_err("open log table", e))?;
            let last = table
                .range(file_range)
                .map_err(|e| io_err("read log", e))?
                .next_back()
                .transpose()
                .map_err(|e| io_err("read log", e))?;
            if let Some((k, v)) = last {
                let index = k.value();
                let entry: C::Entry = codec::decode(v.value(), &format_args!("log entry {index}"))?;
                file_last = Some(entry.log_id());
            }
        }
        // The overlay holds the tail, but take the higher index in case it does not.
        let last_log_id = match (overlay_last, file_last) {
            (Some(a), Some(b)) => Some(if a.index >= b.index { a } else { b }),
            (a, b) => a.or(b),
        };
        Ok(LogState {
            last_log_id: last_log_id.or_else(|| last_purged_log_id.clone()),
            last_purged_log_id,
        })
    }
}

fn read_state_in<T: serde::de::DeserializeOwned>(
    txn: &redb::ReadTransaction,
    key: &str,
) -> Result<Option<T>, io::Error> {
    let table = txn
        .open_table(STATE)
        .map_err(|e| io_err("open state table", e))?;
    let value = table.get(key).map_err(|e| io_err(key, e))?;
    value.map(|v| codec::decode(v.value(), &key)).transpose()
}

// Reads run on the caller's task: they hit redb's page cache (replication reads recent entries),
// and a `spawn_blocking` per read would cost more than the read.
impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        self.shared.entries(range)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        // Vote saves wait for their commit, so the file alone is current.
        self.shared.read_state(KEY_VOTE)
    }
}

/// The reader openraft hands to its replication and state-machine tasks. It holds the store
/// weakly: those tasks may outlive `Raft::shutdown` by a moment, and a strong handle would keep
/// the file open, so an in-process restart could not reopen it (redb allows one opener).
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
        self.shared()?.read_state(KEY_VOTE)
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
        self.submit(|_, _| Op::SaveVote { bytes, done }).await?;
        // Durable before returning, as openraft requires of a vote.
        saved.await.map_err(|_| writer_gone())?
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let bytes = codec::encode(&committed)?;
        self.submit(|p, seq| {
            p.save_committed(seq, bytes.clone());
            Op::SaveCommitted { bytes }
        })
        .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        let (pending_bytes, txn) = {
            let (pending, txn) = self.shared.begin_read()?;
            (pending.committed.as_ref().map(|c| c.value.clone()), txn)
        };
        match pending_bytes {
            Some(bytes) => codec::decode::<Option<LogIdOf<C>>>(&bytes, &KEY_COMMITTED),
            None => Ok(read_state_in::<Option<LogIdOf<C>>>(&txn, KEY_COMMITTED)?.flatten()),
        }
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
            .map(|e| Ok((e.log_id(), codec::encode(&e)?)))
            .collect::<Result<Vec<_>, io::Error>>()?;
        self.submit(|p, seq| {
            let mut rows = Vec::with_capacity(encoded.len());
            for (log_id, bytes) in encoded {
                let index = log_id.index();
                p.append(seq, index, log_id, bytes.clone());
                rows.push((index, bytes));
            }
            Op::Append { rows, callback }
        })
        .await
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index() + 1);
        self.submit(|p, seq| {
            p.truncate(seq, from);
            Op::Truncate { from }
        })
        .await
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        let last_purged = codec::encode(&log_id)?;
        let upto = log_id.index();
        self.submit(|p, seq| {
            p.purge(seq, log_id, upto);
            Op::Purge { upto, last_purged }
        })
        .await
    }
}

#[cfg(test)]
mod tests;
