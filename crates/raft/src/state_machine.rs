//! [`LockStateMachine`]: openraft's state machine around the pure lock table.
//!
//! The table lives in memory behind an `RwLock`; it is made durable by the Raft log plus the
//! latest snapshot file. On start-up the table is loaded from the snapshot and openraft replays
//! the log entries after it, so a restart (also after `kill -9`) recovers every session, lock,
//! queue and the token counter (tokens are log indexes).

use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::{Stream, TryStreamExt};
use latchkey_core::{Applied, Command, LockTable, Outcome};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};

use crate::snapshot::{self, SnapshotDecodeError};
use crate::{
    LogId, RemovedMembers, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};

/// Told about every applied command, after the table changed and outside its lock (so it may
/// read through a [`StateHandle`]). The server uses it to wake long-polling acquires named in
/// `applied.handoffs`. It runs on openraft's apply path: it must be quick and must not block.
pub trait ApplyObserver: Send + Sync + 'static {
    fn applied(&self, index: u64, cmd: &Command, applied: &Applied);
    /// The table was replaced by an installed snapshot covering the log up to `last_index`: no
    /// entries were applied, so whatever the observer derived from entries must be derived
    /// from `table` again (a copy, passed outside the table's lock).
    fn installed(&self, last_index: u64, table: &LockTable);
}

/// An observer that ignores everything (tests, tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl ApplyObserver for NoopObserver {
    fn applied(&self, _index: u64, _cmd: &Command, _applied: &Applied) {}
    fn installed(&self, _last_index: u64, _table: &LockTable) {}
}

#[derive(Debug, Default)]
struct State {
    table: LockTable,
    /// Last entry applied, of any kind; openraft resumes after it.
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    /// Ids the applied membership entries removed (see [`RemovedMembers`]).
    removed: RemovedMembers,
}

/// Cheap, cloneable read access to the table for the server.
#[derive(Clone)]
pub struct StateHandle {
    state: Arc<RwLock<State>>,
    ops_since_snapshot: Arc<std::sync::atomic::AtomicU64>,
}

impl StateHandle {
    /// Client operations applied since the last snapshot built or installed here, each
    /// operation of a batch entry counted (issue #35): openraft's snapshot policy counts
    /// entries, and with the leader's coalescing one entry carries up to `BATCH_OPS_MAX`
    /// operations, so the server asks for a snapshot by this count too
    /// (`Node::lease_duties`), lest the log and a restart's replay grow that many times over.
    pub fn ops_since_snapshot(&self) -> u64 {
        self.ops_since_snapshot
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on the table under the read lock. Keep `f` short: applying waits for it.
    pub fn read<T>(&self, f: impl FnOnce(&LockTable) -> T) -> T {
        f(&read(&self.state).table)
    }

    /// Runs `f` on the table and the index of the last applied log entry (0 before any), both
    /// read under one lock so they belong together (a backup records the index with the
    /// table).
    pub fn read_applied<T>(&self, f: impl FnOnce(&LockTable, u64) -> T) -> T {
        let state = read(&self.state);
        f(
            &state.table,
            state.last_applied.as_ref().map_or(0, |l| l.index),
        )
    }

    /// The index of the membership entry that removed member `id` from this group, if an
    /// applied entry did and none added it again since (see [`RemovedMembers`]). An entry takes
    /// effect when it is appended and is recorded here when it is applied: in between, `id` is
    /// outside the membership but not yet found removed.
    pub fn removed_at(&self, id: u64) -> Option<u64> {
        read(&self.state).removed.removed_at(id)
    }

    /// Index of the last applied log entry (0 before any). Every fencing token issued so far is
    /// at most this.
    pub fn applied_index(&self) -> u64 {
        read(&self.state)
            .last_applied
            .as_ref()
            .map_or(0, |l| l.index)
    }
}

impl Debug for StateHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateHandle")
            .field("applied_index", &self.applied_index())
            .finish()
    }
}

fn read(state: &RwLock<State>) -> RwLockReadGuard<'_, State> {
    // Apply panics only on a bug (a broken table invariant); serving from that table is worse
    // than stopping.
    state
        .read()
        .expect("lock table poisoned by a panic while applying")
}

fn write(state: &RwLock<State>) -> RwLockWriteGuard<'_, State> {
    state
        .write()
        .expect("lock table poisoned by a panic while applying")
}

struct Inner {
    state: Arc<RwLock<State>>,
    /// Client operations applied since the table in the snapshot file (a batch entry counts
    /// each of its operations): set to 0 when a snapshot is built or installed. Added to under
    /// the state's write lock when applying, so a build (under its read lock) counts exactly.
    /// Read through [`StateHandle::ops_since_snapshot`].
    ops_since_snapshot: Arc<std::sync::atomic::AtomicU64>,
    snapshot_dir: PathBuf,
    /// Meta of the snapshot in the file. Held while the file is replaced, so a build and an
    /// install never interleave their writes.
    current: Mutex<Option<SnapshotMeta>>,
}

/// openraft's state machine for latchkey. Owned by openraft once handed to `Raft::new`; keep a
/// [`StateHandle`] (from [`LockStateMachine::handle`]) to read the table.
pub struct LockStateMachine {
    inner: Arc<Inner>,
    observer: Arc<dyn ApplyObserver>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateMachineError {
    #[error("snapshot directory {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// Fatal: the snapshot on disk cannot be trusted; the node must not start from it.
    #[error("snapshot {path} is unusable: {source}")]
    Corrupt {
        path: PathBuf,
        source: SnapshotDecodeError,
    },
}

/// The response for entries that carry no command (blank and membership entries). Core has no
/// "nothing happened" outcome; `NotGranted` with no effects is the most neutral one, and nobody
/// reads it: clients never propose these entries.
fn no_command_response() -> Applied {
    Applied {
        outcome: Outcome::NotGranted,
        handoffs: Vec::new(),
        dropped_waits: Vec::new(),
        ended_waits: Vec::new(),
        busy: None,
        changes: Vec::new(),
        ops: Vec::new(),
    }
}

impl LockStateMachine {
    /// Opens the state machine whose snapshots live in `snapshot_dir` (created if missing), and
    /// loads the latest snapshot, if any.
    pub fn open(
        snapshot_dir: &Path,
        observer: Arc<dyn ApplyObserver>,
    ) -> Result<Self, StateMachineError> {
        let io_err = |source| StateMachineError::Io {
            path: snapshot_dir.to_path_buf(),
            source,
        };
        // Durably: the snapshot file's own fsyncs do not keep this directory's entry.
        latchkey_log_store::create_dir_durably(snapshot_dir).map_err(io_err)?;
        let (state, current) = match snapshot::read(snapshot_dir).map_err(io_err)? {
            None => (State::default(), None),
            Some(bytes) => {
                let contents =
                    snapshot::decode(&bytes).map_err(|source| StateMachineError::Corrupt {
                        path: snapshot::snapshot_path(snapshot_dir),
                        source,
                    })?;
                let meta = SnapshotMeta {
                    last_log_id: contents.last_applied,
                    last_membership: contents.last_membership.clone(),
                };
                tracing::info!(last_log_id = ?meta.last_log_id, "loaded snapshot");
                let state = State {
                    table: contents.table,
                    last_applied: contents.last_applied,
                    last_membership: contents.last_membership,
                    removed: contents.removed,
                };
                (state, Some(meta))
            }
        };
        Ok(LockStateMachine {
            inner: Arc::new(Inner {
                state: Arc::new(RwLock::new(state)),
                snapshot_dir: snapshot_dir.to_path_buf(),
                current: Mutex::new(current),
                ops_since_snapshot: Default::default(),
            }),
            observer,
        })
    }

    /// Sets the table's byte budget (`--table-bytes-max`); an installed snapshot's table gets
    /// the same one.
    pub fn set_table_bytes_max(&self, bytes_max: usize) {
        write(&self.inner.state).table.set_bytes_max(bytes_max);
    }

    /// Puts planted bugs back in the table (the simulation's checkers' tests only); an
    /// installed snapshot's table gets the same.
    #[doc(hidden)]
    pub fn set_table_plant(&self, plant: latchkey_core::TablePlant) {
        write(&self.inner.state).table.set_plant(plant);
    }

    /// Sets which Raft group the table is (issue #16); an installed snapshot's table gets the
    /// same one. Call it before the first entry is applied: session ids are made from it.
    pub fn set_group_shape(&self, shape: latchkey_core::GroupShape) {
        write(&self.inner.state).table.set_shape(shape);
    }

    pub fn handle(&self) -> StateHandle {
        StateHandle {
            state: self.inner.state.clone(),
            ops_since_snapshot: self.inner.ops_since_snapshot.clone(),
        }
    }

    fn apply_one(&self, entry: crate::Entry) -> Result<Applied, io::Error> {
        let log_id = entry.log_id;
        let index = log_id.index;
        let applied = {
            let mut state = write(&self.inner.state);
            let applied = match &entry.payload {
                EntryPayload::Normal(cmd) => {
                    if index <= state.table.last_index() {
                        // openraft resumes after `last_applied`, so this means the log and the
                        // table disagree; applying twice would break exactly-once.
                        return Err(io::Error::other(format!(
                            "entry {index} replayed but the table is already at {}",
                            state.table.last_index()
                        )));
                    }
                    let ops = match &cmd.op {
                        latchkey_core::Op::Batch(ops) => ops.len() as u64,
                        _ => 1,
                    };
                    self.inner
                        .ops_since_snapshot
                        .fetch_add(ops, std::sync::atomic::Ordering::Relaxed);
                    Some(state.table.apply(index, cmd))
                }
                EntryPayload::Membership(membership) => {
                    let state = &mut *state;
                    let forgotten =
                        state
                            .removed
                            .record(state.last_membership.membership(), membership, index);
                    if !forgotten.is_empty() {
                        tracing::warn!(
                            ?forgotten,
                            limit = latchkey_core::limits::REMOVED_MEMBERS_MAX,
                            "forgot the oldest removed members: past the limit of removed \
                             members a group remembers, their messages are no longer refused \
                             for their removal"
                        );
                    }
                    state.last_membership = StoredMembership::new(Some(log_id), membership.clone());
                    None
                }
                EntryPayload::Blank => None,
            };
            state.last_applied = Some(log_id);
            applied
        };
        match (applied, &entry.payload) {
            (Some(applied), EntryPayload::Normal(cmd)) => {
                self.observer.applied(index, cmd, &applied);
                Ok(applied)
            }
            _ => Ok(no_command_response()),
        }
    }

    fn snapshot_builder(&self) -> LockSnapshotBuilder {
        LockSnapshotBuilder {
            inner: self.inner.clone(),
        }
    }
}

/// Runs snapshot file I/O off the async workers: on tokio's blocking pool under a multi-thread
/// runtime (`latchkey serve`), and inline under a current-thread runtime (tests and the
/// simulation), where it completes in order with the rest of the runtime's work: a pool thread
/// finishes at a wall-clock moment the simulation cannot replay.
async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => Ok(f()),
        _ => tokio::task::spawn_blocking(f).await,
    }
}

impl Inner {
    /// Writes `bytes` as the current snapshot and records `meta`, off the async workers
    /// ([`run_blocking`]).
    /// `replace_newer` is false for built snapshots: a build that finished after an install of a
    /// later snapshot must not put the older state back.
    async fn store(
        self: &Arc<Self>,
        meta: SnapshotMeta,
        bytes: Arc<Vec<u8>>,
        replace_newer: bool,
    ) -> io::Result<()> {
        let inner = self.clone();
        run_blocking(move || {
            let mut current = inner.current.lock().expect("snapshot lock poisoned");
            let newer_on_disk = current
                .as_ref()
                .is_some_and(|c| c.last_log_id > meta.last_log_id);
            if newer_on_disk && !replace_newer {
                return Ok(());
            }
            snapshot::write_atomically(&inner.snapshot_dir, &bytes)?;
            *current = Some(meta);
            Ok(())
        })
        .await
        .map_err(io::Error::other)?
    }

    async fn current_snapshot(self: &Arc<Self>) -> io::Result<Option<Snapshot>> {
        let inner = self.clone();
        run_blocking(move || {
            // Under the lock, so the file and the meta belong to the same snapshot.
            let current = inner.current.lock().expect("snapshot lock poisoned");
            let Some(meta) = current.clone() else {
                return Ok(None);
            };
            let bytes = snapshot::read(&inner.snapshot_dir)?.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "snapshot file disappeared")
            })?;
            Ok(Some(Snapshot {
                meta,
                snapshot: SnapshotData::new(bytes),
            }))
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// Builds a snapshot of the table as it is when `build_snapshot` starts.
pub struct LockSnapshotBuilder {
    inner: Arc<Inner>,
}

impl RaftSnapshotBuilder<TypeConfig> for LockSnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        // Encoded under the read lock: table, applied log id and membership must agree. Applying
        // waits meanwhile; reads do not.
        let (meta, bytes) = {
            let state = read(&self.inner.state);
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.last_membership.clone(),
            };
            let bytes = snapshot::encode(
                &state.last_applied,
                &state.last_membership,
                &state.removed,
                &state.table,
            );
            // Exact: applying an entry needs the write lock this read lock keeps out.
            self.inner
                .ops_since_snapshot
                .store(0, std::sync::atomic::Ordering::Relaxed);
            (meta, Arc::new(bytes))
        };
        self.inner.store(meta.clone(), bytes.clone(), false).await?;
        tracing::info!(last_log_id = ?meta.last_log_id, bytes = bytes.len(), "built snapshot");
        let bytes = Arc::try_unwrap(bytes).unwrap_or_else(|shared| (*shared).clone());
        Ok(Snapshot {
            meta,
            snapshot: SnapshotData::new(bytes),
        })
    }
}

impl RaftStateMachine<TypeConfig> for LockStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = LockSnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let state = read(&self.inner.state);
        Ok((state.last_applied, state.last_membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let applied = self.apply_one(entry)?;
            if let Some(responder) = responder {
                responder.send(applied);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_builder()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let bytes = snapshot.into_inner();
        let contents =
            snapshot::decode(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if contents.last_applied != meta.last_log_id
            || contents.last_membership != meta.last_membership
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "snapshot data is at {:?} but its meta says {:?}",
                    contents.last_applied, meta.last_log_id
                ),
            ));
        }
        // File first: once openraft learns the snapshot is installed it may purge the log it
        // covers, and a restart must then find this snapshot, not an older one.
        self.inner
            .store(meta.clone(), Arc::new(bytes), true)
            .await?;
        {
            let mut state = write(&self.inner.state);
            self.inner
                .ops_since_snapshot
                .store(0, std::sync::atomic::Ordering::Relaxed);
            let mut table = contents.table;
            table.set_bytes_max(state.table.bytes_max());
            table.set_shape(state.table.shape());
            table.set_plant(state.table.plant());
            *state = State {
                table,
                last_applied: contents.last_applied,
                last_membership: contents.last_membership,
                removed: contents.removed,
            };
        }
        tracing::info!(last_log_id = ?meta.last_log_id, "installed snapshot");
        // No entry is applied between the write above and this read: openraft drives apply and
        // install from one task. The observer gets a copy, outside the table's lock: it takes
        // its own locks (the server's lease table), which others hold while they read the
        // table, so calling it under the read lock would order the two locks both ways. A
        // snapshot install is rare; the copy is the size of one snapshot.
        let (last_index, table) = {
            let state = read(&self.inner.state);
            (
                state.last_applied.as_ref().map_or(0, |l| l.index),
                state.table.clone(),
            )
        };
        self.observer.installed(last_index, &table);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        self.inner.current_snapshot().await
    }
}
