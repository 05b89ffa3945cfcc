//! The one thread that writes the Raft log: group commit.
//!
//! It sleeps until a request arrives, then takes every request already waiting (up to
//! `limits::LOG_WRITE_BATCH_REQUESTS_MAX`) and encodes them, in submission order, into ONE frame
//! appended to the active segment with one `write` and one `fdatasync`. Only after that returns
//! does it tell the submitters: an append's `IOFlushed` callback fires, a vote save returns.
//! Many entries therefore share one fsync, and nothing is acknowledged before it is on disk.
//! Then it rotates the segment if it is full and deletes segments that hold only purged entries.
//! A save of the committed log id alone is not worth an `fdatasync`: it waits for the next batch.
//!
//! One writer serves every Raft group of a member whose log is shared (issue #16): a batch
//! holds whatever all the groups queued, each request's records after a `Group` record naming
//! its group when it differs from the one before, so one `fdatasync` covers all of them.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use openraft::storage::IOFlushed;
use openraft::type_config::alias::LogIdOf;
use openraft::RaftTypeConfig;
use tokio::sync::{mpsc, oneshot};

use crate::disk::{Disk, Group, Indexes};
use crate::format::Record;
use crate::index::Synced;
use crate::{lock, Counters};
use latchkey_core::limits;

pub(crate) struct Request<C: RaftTypeConfig> {
    /// The Raft group whose index made it; `seq` is of that index.
    pub(crate) group: Group,
    pub(crate) seq: u64,
    pub(crate) op: Op<C>,
}

pub(crate) enum Op<C: RaftTypeConfig> {
    Append {
        /// (index, encoded entry), in index order.
        rows: Vec<(u64, Arc<[u8]>)>,
        callback: IOFlushed<C>,
    },
    SaveVote {
        bytes: Vec<u8>,
        done: oneshot::Sender<Result<(), io::Error>>,
    },
    SaveCommitted {
        bytes: Vec<u8>,
    },
    /// Remove entries at and after `from`.
    Truncate {
        from: u64,
    },
    /// Remove entries up to and including `upto`; `last_purged` is the encoded log id.
    Purge {
        upto: u64,
        last_purged: Vec<u8>,
    },
    /// No record: answered once its batch is durable, and so everything queued before it.
    Sync {
        done: oneshot::Sender<Result<(), io::Error>>,
    },
}

/// Called with the batch size after a batch is taken and before it is written. Tests use it to
/// hold the writer while they queue requests or check that nothing was acknowledged early.
pub(crate) type BeforeCommit = Box<dyn FnMut(usize) + Send>;

/// The records of a batch, in submission order (one allocation per batch, not per request),
/// with a `Group` record before each request of a group other than the one before it.
fn records<C: RaftTypeConfig>(batch: &[Request<C>]) -> Vec<Record<'_>> {
    let mut records = Vec::with_capacity(batch.len());
    // A frame starts in group 0.
    let mut group: Group = 0;
    for request in batch {
        if request.group != group {
            group = request.group;
            records.push(Record::Group(group));
        }
        match &request.op {
            Op::Append { rows, .. } => {
                records.extend(rows.iter().map(|(index, bytes)| Record::Entry {
                    index: *index,
                    bytes,
                }))
            }
            Op::SaveVote { bytes, .. } => records.push(Record::Vote(bytes)),
            Op::SaveCommitted { bytes } => records.push(Record::Committed(bytes)),
            Op::Truncate { from } => records.push(Record::Truncate { from: *from }),
            Op::Purge { upto, last_purged } => records.push(Record::Purge {
                upto: *upto,
                last_purged,
            }),
            Op::Sync { .. } => {}
        }
    }
    records
}

/// Writes the batch and returns where each entry went, tagged with its request, per group.
fn write<C: RaftTypeConfig>(
    disk: &mut Disk,
    batch: &[Request<C>],
) -> Result<Vec<(Group, Synced)>, String> {
    let locs = disk.write_batch(records(batch))?;
    // `locs` are in record order; pair them with their requests' sequence numbers.
    let mut locs = locs.into_iter();
    let mut synced = Vec::new();
    for request in batch {
        if let Op::Append { rows, .. } = &request.op {
            for _ in rows {
                let (group, index, loc) = locs.next().expect("one location per entry record");
                debug_assert_eq!(group, request.group);
                synced.push((
                    group,
                    Synced {
                        index,
                        seq: request.seq,
                        loc,
                    },
                ));
            }
        }
    }
    debug_assert!(locs.next().is_none());
    Ok(synced)
}

pub(crate) fn run<C: RaftTypeConfig>(
    disk: Arc<Mutex<Disk>>,
    indexes: Indexes<LogIdOf<C>>,
    counters: Arc<Counters>,
    mut rx: mpsc::Receiver<Request<C>>,
    mut before_commit: Option<BeforeCommit>,
) {
    let mut batch: Vec<Request<C>> = Vec::with_capacity(limits::LOG_WRITE_BATCH_REQUESTS_MAX);
    // Per group, the newest committed-id save of a batch that held nothing else, not yet
    // written.
    let mut deferred: BTreeMap<Group, Request<C>> = BTreeMap::new();
    // Ends when every handle is gone (the channel closes) and the queue is drained.
    while let Some(first) = rx.blocking_recv() {
        // Submitted before everything now queued, so they go first: each group's file order
        // stays its submission order.
        batch.extend(std::mem::take(&mut deferred).into_values());
        batch.push(first);
        while batch.len() < limits::LOG_WRITE_BATCH_REQUESTS_MAX {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        // A batch of nothing but committed-id saves is not written on its own. openraft's
        // committed id may lag on disk (it must never lead the entries, and it cannot: it is
        // written after them), no one waits for it, and a frame of its own would cost every
        // member one more `fdatasync` per commit, on the path of the next append. It rides in
        // the next batch that has to be written anyway, or in the last one at shutdown.
        if batch
            .iter()
            .all(|r| matches!(r.op, Op::SaveCommitted { .. }))
        {
            // In submission order, so each group keeps its newest.
            for request in batch.drain(..) {
                deferred.insert(request.group, request);
            }
            continue;
        }
        if let Some(hook) = before_commit.as_mut() {
            hook(batch.len());
        }

        let started = std::time::Instant::now();
        // `write` refuses (with the first failure's message) once anything failed: the file
        // may miss an earlier batch, and writing this one could leave a hole.
        let result = write(&mut lock(&disk), &batch);
        match &result {
            Ok(synced) => {
                if let Some(observe) = counters.commit_observer.0.get() {
                    observe(started.elapsed());
                }
                counters.write_transactions.fetch_add(1, Ordering::Relaxed);
                counters
                    .requests_written
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                // What each group of the batch gets, in one pass: its entries' places, and the
                // vote it saved last, which becomes readable once durable (its saver waits for
                // exactly that).
                let mut by_group: BTreeMap<Group, (Vec<Synced>, Option<&Vec<u8>>)> =
                    BTreeMap::new();
                for (group, s) in synced {
                    by_group.entry(*group).or_default().0.push(*s);
                }
                for r in &batch {
                    if let Op::SaveVote { bytes, .. } = &r.op {
                        by_group.entry(r.group).or_default().1 = Some(bytes);
                    }
                }
                for (group, (mine, vote)) in by_group {
                    let mut idx = lock(&indexes[&group]);
                    idx.synced(&mine);
                    if let Some(vote) = vote {
                        idx.vote = Some(vote.clone());
                    }
                    idx.debug_check();
                }
            }
            Err(msg) => {
                tracing::error!(error = %msg, "log store write failed; the store refuses further writes");
                fail_all(&indexes, msg);
            }
        }

        // Rotation and the deletion of purged segments come before the acknowledgements, so
        // that whoever saw a batch acknowledged sees the segments as that batch left them (the
        // tests rely on it; a rotation is rare, every `LOG_SEGMENT_BYTES`). A failure here
        // stops later writes; this batch is already durable and is acknowledged as such.
        if result.is_ok() {
            let mut disk = lock(&disk);
            if let Err(msg) = disk.maintain(&indexes) {
                tracing::error!(error = %msg, "log store rotation failed; the store refuses further writes");
                fail_all(&indexes, &msg);
            }
        }

        // Only now, after the write and its fdatasync returned, acknowledge.
        for request in batch.drain(..) {
            let outcome = result
                .as_ref()
                .map(|_| ())
                .map_err(|m| io::Error::other(m.clone()));
            match request.op {
                Op::Append { callback, .. } => callback.io_completed(outcome),
                Op::SaveVote { done, .. } | Op::Sync { done } => {
                    // The saver may have given up waiting; nothing to do then.
                    let _ = done.send(outcome);
                }
                Op::SaveCommitted { .. } | Op::Truncate { .. } | Op::Purge { .. } => {}
            }
        }
    }
    // Shutdown: the committed id saved last is on disk when the last handle is gone.
    if !deferred.is_empty() {
        let last: Vec<_> = deferred.into_values().collect();
        let mut disk = lock(&disk);
        if let Err(msg) = write(&mut disk, &last) {
            tracing::error!(error = %msg, "log store could not save the committed log id at shutdown");
        }
    }
}

/// After a failed write or rotation, every group refuses everything: they share the files.
pub(crate) fn fail_all<L>(indexes: &Indexes<L>, msg: &str) {
    for index in indexes.values() {
        lock(index).failed.get_or_insert_with(|| msg.to_owned());
    }
}
