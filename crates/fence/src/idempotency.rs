//! [`IdempotencyStore`]: the fallback for a resource that cannot check fencing tokens.
//!
//! The caller gives each unit of work a unique key (say `payment/<invoice id>`) and the store
//! remembers the result of the first successful run; a retry with the same key gets that result
//! back without running the work again.
//!
//! What it protects and what it does not:
//! - It makes *retries of the same unit of work* safe: a holder that paused, lost its lock, and
//!   a new holder that redoes the same job with the same key, run it once between them.
//! - It does **not** stop a paused old holder from doing a *different* unit of work (a different
//!   key) after it lost the lock. Only a fencing token checked by the resource does that; use a
//!   gate or a conditional update when the resource allows it.
//! - It remembers the last `capacity` completed keys (first in, first out). A retry of an older
//!   key runs again, so size it for the callers' retry window.
//! - It is in memory: keys are forgotten on restart. For a resource that outlives its process,
//!   store the key in the same transaction as the effect, under a unique constraint (see
//!   `docs/fencing.md`); this type shows the semantics and serves in-process resources.
//! - Only successes are remembered: if the work returns `Err`, the key is free again so a retry
//!   can do it. Work that must not be repeated after a partial failure should return the failure
//!   as its value (`V = Result<..>`) instead.
//! - While one call runs a key, another call with the same key gets
//!   [`IdempotencyError::InProgress`] instead of waiting, so a stuck unit of work cannot pile up
//!   threads behind it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::gate::lock;
use crate::limits;

/// The result of [`IdempotencyStore::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<V> {
    /// The work ran now and this is its result.
    Fresh(V),
    /// The key had already completed; this is the remembered result and the work did not run.
    Replayed(V),
}

impl<V> Outcome<V> {
    pub fn value(&self) -> &V {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) => v,
        }
    }

    pub fn into_value(self) -> V {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) => v,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError<E> {
    #[error("idempotency key must be 1 to {max} bytes, got {len}")]
    InvalidKey { len: usize, max: usize },
    /// Another call is running this key right now; retry later.
    #[error("idempotency key {key:?} is being processed by another call")]
    InProgress { key: String },
    /// Every remembered key is still in progress, so none can be evicted.
    #[error("idempotency store is full: {capacity} keys are all in progress")]
    Full { capacity: usize },
    /// The work failed; the key is not remembered, so a retry runs it again.
    #[error("the unit of work failed")]
    Work(#[source] E),
}

enum Entry<V> {
    InProgress,
    Done(V),
}

struct State<V> {
    entries: HashMap<String, Entry<V>>,
    /// Completed keys, oldest first: the eviction order.
    done_order: VecDeque<String>,
}

/// Remembers the result of each unit of work by its unique key. Thread-safe.
pub struct IdempotencyStore<V> {
    state: Mutex<State<V>>,
    capacity: usize,
}

impl<V: Clone> IdempotencyStore<V> {
    /// A store remembering up to [`limits::IDEMPOTENCY_KEYS_DEFAULT`] keys.
    pub fn new() -> Self {
        Self::with_capacity(limits::IDEMPOTENCY_KEYS_DEFAULT)
    }

    /// A store remembering up to `capacity` keys (clamped to
    /// `1..=`[`limits::IDEMPOTENCY_KEYS_MAX`]).
    pub fn with_capacity(capacity: usize) -> Self {
        IdempotencyStore {
            state: Mutex::new(State {
                entries: HashMap::new(),
                done_order: VecDeque::new(),
            }),
            capacity: capacity.clamp(1, limits::IDEMPOTENCY_KEYS_MAX),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The remembered result of `key`, if it completed and has not been evicted.
    pub fn get(&self, key: &str) -> Option<V> {
        match lock(&self.state).entries.get(key) {
            Some(Entry::Done(v)) => Some(v.clone()),
            _ => None,
        }
    }

    /// Runs `work` unless `key` already completed, in which case its remembered result is
    /// returned. `work` runs without the store's lock held, so other keys proceed meanwhile.
    pub fn run<E>(
        &self,
        key: &str,
        work: impl FnOnce() -> Result<V, E>,
    ) -> Result<Outcome<V>, IdempotencyError<E>> {
        if key.is_empty() || key.len() > limits::IDEMPOTENCY_KEY_BYTES_MAX {
            return Err(IdempotencyError::InvalidKey {
                len: key.len(),
                max: limits::IDEMPOTENCY_KEY_BYTES_MAX,
            });
        }
        {
            let mut state = lock(&self.state);
            match state.entries.get(key) {
                Some(Entry::Done(v)) => return Ok(Outcome::Replayed(v.clone())),
                Some(Entry::InProgress) => {
                    return Err(IdempotencyError::InProgress {
                        key: key.to_owned(),
                    })
                }
                None => {}
            }
            if state.entries.len() >= self.capacity {
                let Some(oldest) = state.done_order.pop_front() else {
                    return Err(IdempotencyError::Full {
                        capacity: self.capacity,
                    });
                };
                state.entries.remove(&oldest);
            }
            state.entries.insert(key.to_owned(), Entry::InProgress);
        }
        // Frees the key if `work` fails or panics, so it is not stuck "in progress" forever.
        let mut claim = Claim {
            store: self,
            key,
            done: false,
        };
        let value = work().map_err(IdempotencyError::Work)?;
        let mut state = lock(&self.state);
        state
            .entries
            .insert(key.to_owned(), Entry::Done(value.clone()));
        state.done_order.push_back(key.to_owned());
        claim.done = true;
        Ok(Outcome::Fresh(value))
    }
}

impl<V: Clone> Default for IdempotencyStore<V> {
    fn default() -> Self {
        Self::new()
    }
}

struct Claim<'a, V> {
    store: &'a IdempotencyStore<V>,
    key: &'a str,
    done: bool,
}

impl<V> Drop for Claim<'_, V> {
    fn drop(&mut self) {
        if !self.done {
            lock(&self.store.state).entries.remove(self.key);
        }
    }
}
