//! The [`FenceGate`] trait and the per-lock admission logic both gates share.
//!
//! What a gate guarantees, for writes made through [`FenceGate::admit_then`] on one gate:
//! - A token lower than the highest already admitted for that lock is rejected, and its write
//!   does not run.
//! - The highest token is raised (and, for [`DurableGate`](crate::DurableGate), made durable)
//!   *before* the write runs, so a crash during the write cannot bring the lower limit back.
//! - The check and the write happen under one per-lock guard: while one write runs, no other
//!   admission for the same lock completes. So the writes of one lock run one at a time, in
//!   non-decreasing token order; a stale holder can never slip in between a newer holder's
//!   check and its write. Writes under different locks run in parallel.
//!
//! What it does not guarantee:
//! - Nothing about writes that bypass the gate, or go through another gate instance (two
//!   gates, or two processes, on the same data have two separate "highest" values).
//! - [`FenceGate::check`] alone only raises the highest token; a write done *after* `check`
//!   returns is unprotected against a newer holder that arrives in between. Use `admit_then`.
//! - That the token is genuine: the gate trusts the number it is given. A client that invents a
//!   huge token locks out real holders; this is a fence against pauses, not against malice.
//! - That the write succeeded: a failed write still leaves the token admitted (the holder is
//!   legitimate; its failure does not make older tokens valid again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::limits;

/// A token that a gate accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// The token that was admitted (now the highest for its lock).
    pub token: u64,
    /// The highest token before this one, `None` if the lock was never seen.
    pub previous: Option<u64>,
}

impl Admitted {
    /// True when this token raised the highest one: the first write of a new holder.
    pub fn raised(&self) -> bool {
        self.previous != Some(self.token)
    }
}

/// A token lower than one already admitted for the same lock: the writer lost the lock (its
/// lease expired while it was paused or cut off) and someone newer has written since.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "fencing token {token} for lock {lock:?} is stale: token {highest} has already been admitted, \
     so the writer no longer holds the lock"
)]
pub struct Rejected {
    pub lock: String,
    pub token: u64,
    pub highest: u64,
}

/// A lock name the gate refuses; the bounds match the lock service's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockNameError {
    #[error("lock name is empty")]
    Empty,
    #[error("lock name is {len} bytes, more than the {max} allowed")]
    TooLong { len: usize, max: usize },
}

/// Why a gate did not admit a write.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The token is stale. The caller must stop acting as the holder.
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("invalid lock name: {0}")]
    InvalidLockName(#[from] LockNameError),
    /// The gate tracks as many locks as it may. Names are never forgotten (forgetting one would
    /// readmit a stale holder of that lock), so this persists until the gate is rebuilt with a
    /// larger bound.
    #[error(
        "the gate already tracks its maximum of {max} lock names and cannot admit new lock {lock:?}"
    )]
    TooManyLocks { lock: String, max: usize },
    /// Fatal: the durable gate could not persist or read its state. Nothing more is admitted
    /// until the gate is reopened (and, if it is corrupt, repaired).
    #[error("fence storage failed: {0}")]
    Storage(#[from] crate::durable::StorageError),
}

impl FenceError {
    /// True for errors that will not go away by retrying with another token or lock name.
    pub fn is_fatal(&self) -> bool {
        matches!(self, FenceError::Storage(_))
    }
}

/// Keeps the highest fencing token seen per lock name and rejects lower ones.
///
/// See the [module docs](self) for exactly what it guarantees.
pub trait FenceGate: Send + Sync {
    /// Runs `f` only if `token` is at least the highest token admitted for `lock`, holding the
    /// lock's guard while `f` runs so that no other admission for `lock` interleaves. Returns
    /// what `f` returned.
    ///
    /// `f` should be the write itself and nothing slow besides: other writers of the same lock
    /// wait for it. A panic in `f` propagates; the token stays admitted.
    fn admit_then<T>(&self, lock: &str, token: u64, f: impl FnOnce() -> T)
        -> Result<T, FenceError>;

    /// Admits `token` for `lock` (raising the highest if it is higher) without a write. Useful
    /// to reject a stale holder early; it does not protect a write made after it returns.
    fn check(&self, lock: &str, token: u64) -> Result<Admitted, FenceError>;

    /// The highest token admitted for `lock`, if any.
    fn highest(&self, lock: &str) -> Option<u64>;
}

/// Checks a lock name against the same bounds as the lock service.
pub fn validate_lock_name(lock: &str) -> Result<(), LockNameError> {
    if lock.is_empty() {
        return Err(LockNameError::Empty);
    }
    if lock.len() > limits::LOCK_NAME_BYTES_MAX {
        return Err(LockNameError::TooLong {
            len: lock.len(),
            max: limits::LOCK_NAME_BYTES_MAX,
        });
    }
    Ok(())
}

/// The highest admitted token of one lock; its mutex is the per-lock guard.
type Slot = Arc<Mutex<Option<u64>>>;

/// Per-lock slots. The map lock is held only to find or create a slot, never while a slot is
/// locked, so locks never wait on each other except for that lookup.
pub(crate) struct Slots {
    map: Mutex<HashMap<String, Slot>>,
    locks_max: usize,
}

/// Locks a mutex whether or not an earlier holder panicked. Every value guarded here is
/// consistent at every point a panic can occur (the highest token is updated before the
/// caller's write runs), so poisoning carries no information we need.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Slots {
    pub(crate) fn new(locks_max: usize) -> Self {
        Slots {
            map: Mutex::new(HashMap::new()),
            locks_max,
        }
    }

    /// Loads a replayed value; not subject to `locks_max`, since dropping a durable name would
    /// be unsafe.
    pub(crate) fn load(&self, name: String, highest: u64) {
        lock(&self.map).insert(name, Arc::new(Mutex::new(Some(highest))));
    }

    pub(crate) fn highest(&self, name: &str) -> Option<u64> {
        let slot = lock(&self.map).get(name).cloned()?;
        let highest = *lock(&slot);
        highest
    }

    fn slot(&self, name: &str) -> Result<Slot, FenceError> {
        let mut map = lock(&self.map);
        if let Some(slot) = map.get(name) {
            return Ok(Arc::clone(slot));
        }
        if map.len() >= self.locks_max {
            return Err(FenceError::TooManyLocks {
                lock: name.to_owned(),
                max: self.locks_max,
            });
        }
        let slot: Slot = Arc::new(Mutex::new(None));
        map.insert(name.to_owned(), Arc::clone(&slot));
        Ok(slot)
    }

    /// The admission both gates use. `persist` is called with the slot guard held, only when
    /// the token raises the highest, and must make the new highest durable before returning;
    /// `f` runs after the new highest is recorded, still under the guard.
    pub(crate) fn admit<T>(
        &self,
        name: &str,
        token: u64,
        persist: impl FnOnce(u64) -> Result<(), FenceError>,
        f: impl FnOnce() -> T,
    ) -> Result<(Admitted, T), FenceError> {
        validate_lock_name(name)?;
        let slot = self.slot(name)?;
        let mut highest = lock(&slot);
        let previous = *highest;
        if let Some(h) = previous {
            if token < h {
                return Err(Rejected {
                    lock: name.to_owned(),
                    token,
                    highest: h,
                }
                .into());
            }
        }
        if previous != Some(token) {
            persist(token)?;
            *highest = Some(token);
        }
        // The invariant every caller relies on: the recorded highest never decreases.
        debug_assert!(highest.is_some_and(|h| previous.is_none_or(|p| p <= h)));
        let out = f();
        drop(highest);
        Ok((Admitted { token, previous }, out))
    }
}
