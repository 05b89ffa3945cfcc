//! The protected resource: one counter per lock behind a `latchkey_fence::MemoryGate`.
//!
//! A critical section is a read-modify-write in two steps, so that a holder can pause between
//! them: `begin` reads the counter, `commit` writes what was read plus one. Both steps go
//! through the gate with the holder's token, as a real fenced resource would do; every
//! decision is recorded for the checkers. The resource lives outside every simulated host: it
//! is the "external system" that survives all faults.
//!
//! What a holder may do depends on its mode (issue #32): a writer (or a mutex's holder)
//! reads and writes, as above; a reader only reads, at `begin` and again at `commit` (recorded
//! as a `Commit` of the value it found, so that a write during its read shows); a permit holder
//! of a semaphore of N only enters and leaves (its `Begin` and `Commit` read and write
//! nothing; the checkers count the sections open at once). A semaphore's gate cannot refuse every token below the highest (N
//! holders hold together, in any order): it admits a token while fewer than N higher tokens
//! were seen, which keeps at most N accepted sections open at once whatever the holders do.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use latchkey_core::Mode;
use latchkey_fence::{FenceGate, MemoryGate};

use crate::clock::true_now;
use crate::history::{Actor, History, ResourceOp, Step};

#[derive(Clone)]
pub struct Resource {
    gate: Arc<MemoryGate>,
    values: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Per semaphore: the N highest tokens seen (its gate).
    permits: Arc<Mutex<BTreeMap<String, std::collections::BTreeSet<u64>>>>,
    history: History,
}

impl Resource {
    pub fn new(history: History) -> Resource {
        Resource {
            gate: Arc::new(MemoryGate::new()),
            values: Arc::default(),
            permits: Arc::default(),
            history,
        }
    }

    /// Starts a section in `mode`: reads the counter of `lock` (a permit reads nothing) if
    /// `token` is not stale.
    pub fn begin(&self, actor: Actor, lock: &str, token: u64, mode: Mode) -> Option<u64> {
        if let Mode::Permits(n) = mode {
            let admitted = self.admit_permit(lock, token, n).then_some(0);
            self.record(
                actor,
                lock,
                token,
                Step::Begin { read: 0 },
                admitted.is_some(),
            );
            return admitted;
        }
        let read = self.read(lock, token);
        self.record(
            actor,
            lock,
            token,
            Step::Begin {
                read: read.unwrap_or(0),
            },
            read.is_some(),
        );
        read
    }

    /// Ends a section in `mode`: a writer writes `read + 1` to the counter of `lock`, a reader
    /// reads it again, a permit holder leaves its slot, if `token` is not stale.
    pub fn end(&self, actor: Actor, lock: &str, token: u64, read: u64, mode: Mode) -> bool {
        let (seen, accepted) = match mode {
            Mode::Exclusive => return self.commit(actor, lock, token, read),
            Mode::Shared => match self.read(lock, token) {
                Some(v) => (v, true),
                None => (read, false),
            },
            Mode::Permits(n) => (0, self.admit_permit(lock, token, n)),
        };
        self.record(actor, lock, token, Step::Commit { wrote: seen }, accepted);
        accepted
    }

    /// A semaphore of `n`'s gate: `token` is admitted while fewer than `n` higher tokens were
    /// seen for `lock`.
    fn admit_permit(&self, lock: &str, token: u64, n: u32) -> bool {
        let mut permits = self.permits.lock().expect("permits lock");
        let seen = permits.entry(lock.to_owned()).or_default();
        seen.insert(token);
        while seen.len() > n as usize {
            seen.pop_first();
        }
        seen.contains(&token)
    }

    fn read(&self, lock: &str, token: u64) -> Option<u64> {
        self.gate
            .admit_then(lock, token, || {
                *self
                    .values
                    .lock()
                    .expect("values lock")
                    .get(lock)
                    .unwrap_or(&0)
            })
            .ok()
    }

    /// Writes `read + 1` to the counter of `lock` if `token` is not stale.
    pub fn commit(&self, actor: Actor, lock: &str, token: u64, read: u64) -> bool {
        let wrote = read + 1;
        let accepted = self
            .gate
            .admit_then(lock, token, || {
                self.values
                    .lock()
                    .expect("values lock")
                    .insert(lock.to_owned(), wrote);
            })
            .is_ok();
        self.record(actor, lock, token, Step::Commit { wrote }, accepted);
        accepted
    }

    fn record(&self, actor: Actor, lock: &str, token: u64, step: Step, accepted: bool) {
        let at = true_now();
        self.history.with(|h| {
            h.resource.push(ResourceOp {
                actor,
                lock: lock.to_owned(),
                token,
                at,
                step,
                accepted,
            })
        });
    }
}
