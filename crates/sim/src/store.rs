//! An in-memory log store that fails like a disk: what was fsynced survives a crash, what was
//! not may be lost.
//!
//! [`Disk`] lives outside the simulated host (the harness owns it), so it outlives a crash of
//! the host. Every write goes into the disk's *view* (what reads see, as openraft requires an
//! appended entry to be readable at once) and into a queue of unsynced operations. A flusher
//! task on the host "fsyncs" after a seeded delay: it moves the queued operations into the
//! synced state and only then calls openraft's flush callbacks (and lets `save_vote` return).
//! [`Disk::crash`] keeps a seeded prefix of the unsynced operations (a disk may have written
//! some of them) and drops the rest.
//!
//! The store also records into the [`History`] what it appended and what it learned was
//! committed, which the checkers use as the cluster's ground truth.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::io;
use std::ops::{RangeBounds, RangeInclusive};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_raft::{Entry, LogId, TypeConfig, Vote};
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{EntryPayload, OptionalSend, RaftLogReader};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};

use crate::clock::true_now;
use crate::history::{entry_digest, Appended, History, LogEntry, TermStart};

#[derive(Debug, Clone, Default)]
struct DiskState {
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    log: BTreeMap<u64, Entry>,
}

#[derive(Debug, Clone)]
enum DiskOp {
    Vote(Vote),
    Committed(Option<LogId>),
    Append(Vec<Entry>),
    TruncateFrom(u64),
    Purge(LogId),
}

impl DiskState {
    fn apply(&mut self, op: &DiskOp) {
        match op {
            DiskOp::Vote(v) => self.vote = Some(*v),
            DiskOp::Committed(c) => self.committed = *c,
            DiskOp::Append(entries) => {
                for e in entries {
                    self.log.insert(e.log_id.index, e.clone());
                }
            }
            DiskOp::TruncateFrom(from) => {
                self.log.split_off(from);
            }
            DiskOp::Purge(upto) => {
                self.log = self.log.split_off(&(upto.index + 1));
                if self.last_purged.as_ref().is_none_or(|p| p < upto) {
                    self.last_purged = Some(*upto);
                }
            }
        }
    }
}

/// How the simulated disk behaves; from the seed.
#[derive(Debug, Clone, Copy)]
pub struct DiskConfig {
    /// Each fsync takes between these many milliseconds.
    pub fsync_ms: (u64, u64),
    /// PLANTED BUG switch, for validating the checkers: acknowledge appends before the fsync.
    pub ack_before_fsync: bool,
}

/// One node's disk.
#[derive(Debug)]
pub struct Disk {
    synced: DiskState,
    view: DiskState,
    unsynced: VecDeque<(u64, DiskOp)>,
    next_seq: u64,
    meta: BTreeMap<String, Vec<u8>>,
    /// Bumped by every crash; a flusher of an earlier life does nothing.
    generation: u64,
}

pub type SharedDisk = Arc<Mutex<Disk>>;

/// A node's crash, seen by its disks: one log per Raft group it is a member of, each keeping a
/// seeded prefix of its unsynced writes (see [`Disk::crash`]). How many unsynced writes were
/// lost, over all of them.
pub fn crash_node(disks: &[SharedDisk], rng: &mut StdRng) -> usize {
    disks
        .iter()
        .map(|d| d.lock().expect("disk lock").crash(rng))
        .sum()
}

impl Disk {
    pub fn new() -> SharedDisk {
        Arc::new(Mutex::new(Disk {
            synced: DiskState::default(),
            view: DiskState::default(),
            unsynced: VecDeque::new(),
            next_seq: 1,
            meta: BTreeMap::new(),
            generation: 0,
        }))
    }

    /// The host crashed: keep a random prefix of the unsynced writes, lose the rest. Returns
    /// how many were lost.
    pub fn crash(&mut self, rng: &mut StdRng) -> usize {
        let keep = rng.random_range(0..=self.unsynced.len());
        let lost = self.unsynced.len() - keep;
        for (_, op) in self.unsynced.drain(..).take(keep) {
            self.synced.apply(&op);
        }
        self.view = self.synced.clone();
        self.generation += 1;
        lost
    }

    fn push(&mut self, op: DiskOp) -> u64 {
        self.view.apply(&op);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unsynced.push_back((seq, op));
        seq
    }

    fn sync_upto(&mut self, seq: u64) {
        while self.unsynced.front().is_some_and(|(s, _)| *s <= seq) {
            let (_, op) = self.unsynced.pop_front().expect("front exists");
            self.synced.apply(&op);
        }
    }

    fn log_state(&self) -> LogState<TypeConfig> {
        let last = self.view.log.values().next_back().map(|e| e.log_id);
        LogState {
            last_purged_log_id: self.view.last_purged,
            last_log_id: last.or(self.view.last_purged),
        }
    }
}

enum Waiter {
    Flushed(IOFlushed<TypeConfig>),
    Saved(oneshot::Sender<()>),
}

/// The handle openraft and the server hold, for one life of a host.
#[derive(Clone)]
pub struct SimLogStore {
    node: u64,
    disk: SharedDisk,
    generation: u64,
    history: History,
    flusher: mpsc::UnboundedSender<(u64, Waiter)>,
    config: DiskConfig,
}

impl SimLogStore {
    /// Opens `disk` for a new life of node `node` and starts its flusher on the current runtime
    /// (the host's: the flusher dies with the host).
    pub fn open(
        node: u64,
        disk: SharedDisk,
        history: History,
        config: DiskConfig,
        seed: u64,
    ) -> SimLogStore {
        let generation = disk.lock().expect("disk lock").generation;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(flusher(disk.clone(), generation, rx, config, seed));
        SimLogStore {
            node,
            disk,
            generation,
            history,
            flusher: tx,
            config,
        }
    }

    fn disk(&self) -> std::sync::MutexGuard<'_, Disk> {
        self.disk.lock().expect("disk lock")
    }

    fn submit(&self, seq: u64, waiter: Waiter) -> io::Result<()> {
        self.flusher
            .send((seq, waiter))
            .map_err(|_| io::Error::other("flusher stopped"))
    }

    fn record_appended(&self, entries: &[Entry]) {
        let at = true_now();
        let node = self.node;
        self.history.with(|h| {
            for e in entries {
                let leader = (e.log_id.leader_id.term, e.log_id.leader_id.node_id);
                if leader.1 == node && h.leader.is_none_or(|l| l < leader) {
                    h.leader = Some(leader);
                }
                if leader.1 == node
                    && !h
                        .term_starts
                        .iter()
                        .any(|t| t.term == leader.0 && t.node == node)
                {
                    let commit_index = h.commit_checked.get(&node).map(|&(_, c)| c);
                    h.term_starts.push(TermStart {
                        term: leader.0,
                        node,
                        first_index: e.log_id.index,
                        commit_index,
                        at,
                    });
                }
                h.last_appended.insert(node, (e.log_id.index, leader));
                h.appended
                    .entry((e.log_id.index, leader.0, leader.1))
                    .or_insert_with(|| Appended {
                        index: e.log_id.index,
                        leader,
                        op: op_of(e),
                        first_at: at,
                    });
            }
        });
    }

    /// Compares every entry that became committed for this node with what any node saw
    /// committed at its index before (see [`crate::history::HistoryData::record_commits`]).
    fn record_committed(&self, upto: &LogId) {
        let at = true_now();
        let disk = self.disk();
        self.history.with(|h| {
            let held =
                |range: RangeInclusive<u64>| disk.view.log.range(range).map(|(&i, e)| (i, Held(e)));
            h.record_commits(self.node, self.generation, upto.index, held, at)
        });
    }
}

/// An entry of a node's log, as the history compares it.
struct Held<'a>(&'a Entry);

impl LogEntry for Held<'_> {
    fn leader(&self) -> (u64, u64) {
        let id = &self.0.log_id.leader_id;
        (id.term, id.node_id)
    }

    fn digest(&self) -> u64 {
        entry_digest(self.leader(), &self.0.payload)
    }

    fn op(&self) -> Option<latchkey_core::Op> {
        op_of(self.0)
    }
}

fn op_of(e: &Entry) -> Option<latchkey_core::Op> {
    match &e.payload {
        EntryPayload::Normal(cmd) => Some(cmd.0.op.clone()),
        _ => None,
    }
}

/// Group commit: waits for writes, "fsyncs" them all after a delay, then acknowledges.
async fn flusher(
    disk: SharedDisk,
    generation: u64,
    mut rx: mpsc::UnboundedReceiver<(u64, Waiter)>,
    config: DiskConfig,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let (lo, hi) = config.fsync_ms;
        tokio::time::sleep(Duration::from_millis(rng.random_range(lo..=hi))).await;
        while let Ok(next) = rx.try_recv() {
            batch.push(next);
        }
        let upto = batch.iter().map(|(s, _)| *s).max().unwrap_or(0);
        {
            let mut d = disk.lock().expect("disk lock");
            if d.generation != generation {
                return;
            }
            d.sync_upto(upto);
        }
        for (_, w) in batch {
            match w {
                Waiter::Flushed(cb) => cb.io_completed(Ok(())),
                Waiter::Saved(tx) => {
                    let _ = tx.send(());
                }
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for SimLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .disk()
            .view
            .log
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.disk().view.vote)
    }
}

impl RaftLogStorage<TypeConfig> for SimLogStore {
    type LogReader = SimLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        Ok(self.disk().log_state())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let seq = self.disk().push(DiskOp::Vote(*vote));
        let (tx, rx) = oneshot::channel();
        self.submit(seq, Waiter::Saved(tx))?;
        rx.await
            .map_err(|_| io::Error::other("crashed before the vote was synced"))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        if let Some(c) = &committed {
            self.record_committed(c);
        }
        self.disk().push(DiskOp::Committed(committed));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.disk().view.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.record_appended(&entries);
        let seq = self.disk().push(DiskOp::Append(entries));
        if self.config.ack_before_fsync {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        self.submit(seq, Waiter::Flushed(callback))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.disk().push(DiskOp::TruncateFrom(from));
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.disk().push(DiskOp::Purge(log_id));
        Ok(())
    }
}

impl latchkey_server::NodeLogStore for SimLogStore {
    fn read_node_meta(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(self.disk().meta.get(key).cloned())
    }

    fn write_node_meta(&self, key: &str, value: &[u8]) -> Result<(), String> {
        // Synchronous and durable at once, like the log store's metadata writes.
        self.disk().meta.insert(key.to_owned(), value.to_vec());
        Ok(())
    }
}

impl SimLogStore {
    /// This life's generation (a crash starts the next).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}
