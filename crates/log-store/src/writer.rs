//! The one thread that writes the log file: group commit.
//!
//! It sleeps until a request arrives, then takes every request already waiting (up to
//! `limits::LOG_WRITE_BATCH_REQUESTS_MAX`) and writes them, in submission order, in ONE redb transaction
//! committed with `Durability::Immediate` (fsync). Only after that commit returns does it tell the
//! submitters: an append's `IOFlushed` callback fires, a vote save returns. Many entries therefore
//! share one fsync, and nothing is acknowledged before it is on disk.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use openraft::storage::IOFlushed;
use openraft::type_config::alias::LogIdOf;
use openraft::RaftTypeConfig;
use redb::{Database, Durability};
use tokio::sync::{mpsc, oneshot};

use crate::pending::Pending;
use latchkey_core::limits;

use crate::{lock, Counters, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, STATE};

pub(crate) struct Request<C: RaftTypeConfig> {
    pub(crate) seq: u64,
    pub(crate) op: Op<C>,
}

pub(crate) enum Op<C: RaftTypeConfig> {
    Append {
        /// (index, encoded entry), in index order.
        rows: Vec<(u64, Vec<u8>)>,
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
}

/// Called with the batch size after a batch is taken and before it is written. Tests use it to
/// hold the writer while they queue requests or check that nothing was acknowledged early.
pub(crate) type BeforeCommit = Box<dyn FnMut(usize) + Send>;

pub(crate) fn run<C: RaftTypeConfig>(
    db: Arc<Database>,
    pending: Arc<Mutex<Pending<LogIdOf<C>>>>,
    counters: Arc<Counters>,
    mut rx: mpsc::Receiver<Request<C>>,
    mut before_commit: Option<BeforeCommit>,
) {
    let mut batch: Vec<Request<C>> = Vec::with_capacity(limits::LOG_WRITE_BATCH_REQUESTS_MAX);
    // Ends when every handle is gone (the channel closes) and the queue is drained.
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < limits::LOG_WRITE_BATCH_REQUESTS_MAX {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        if let Some(hook) = before_commit.as_mut() {
            hook(batch.len());
        }

        let last_seq = batch.last().expect("batch holds the first request").seq;
        let failed = lock(&pending).failed.clone();
        let result = match failed {
            // The file may miss an earlier batch: writing this one could leave a hole.
            Some(msg) => Err(msg),
            None => {
                let started = std::time::Instant::now();
                let result = commit_batch(&db, &batch);
                if let (Ok(()), Some(observe)) = (&result, counters.commit_observer.0.get()) {
                    observe(started.elapsed());
                }
                result.map_err(|e| format!("log store write failed: {e}"))
            }
        };
        match &result {
            Ok(()) => {
                counters.write_transactions.fetch_add(1, Ordering::Relaxed);
                counters
                    .requests_written
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                lock(&pending).committed(last_seq);
            }
            Err(msg) => {
                tracing::error!(error = %msg, "log store write failed; the store refuses further writes");
                lock(&pending).failed.get_or_insert_with(|| msg.clone());
            }
        }

        // Only now, after the commit (and its fsync) returned, acknowledge.
        for request in batch.drain(..) {
            let outcome = result.clone().map_err(io::Error::other);
            match request.op {
                Op::Append { callback, .. } => callback.io_completed(outcome),
                Op::SaveVote { done, .. } => {
                    // The saver may have given up waiting; nothing to do then.
                    let _ = done.send(outcome);
                }
                Op::SaveCommitted { .. } | Op::Truncate { .. } | Op::Purge { .. } => {}
            }
        }
    }
}

fn commit_batch<C: RaftTypeConfig>(db: &Database, batch: &[Request<C>]) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut log = txn.open_table(LOG)?;
        let mut state = txn.open_table(STATE)?;
        for request in batch {
            match &request.op {
                Op::Append { rows, .. } => {
                    for (index, bytes) in rows {
                        log.insert(*index, bytes.as_slice())?;
                    }
                }
                Op::SaveVote { bytes, .. } => {
                    state.insert(KEY_VOTE, bytes.as_slice())?;
                }
                Op::SaveCommitted { bytes } => {
                    state.insert(KEY_COMMITTED, bytes.as_slice())?;
                }
                Op::Truncate { from } => {
                    log.retain_in(*from.., |_, _| false)?;
                }
                Op::Purge { upto, last_purged } => {
                    // The purge point goes in the same transaction as the deletion, so after a
                    // crash `get_log_state` never reports entries that are gone as present.
                    state.insert(KEY_LAST_PURGED, last_purged.as_slice())?;
                    log.retain_in(..=*upto, |_, _| false)?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}
