//! The protected resource: one counter per lock behind a `latchkey_fence::MemoryGate`.
//!
//! A critical section is a read-modify-write in two steps, so that a holder can pause between
//! them: `begin` reads the counter, `commit` writes what was read plus one. Both steps go
//! through the gate with the holder's token, as a real fenced resource would do; every
//! decision is recorded for the checkers. The resource lives outside every simulated host: it
//! is the "external system" that survives all faults.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use latchkey_fence::{FenceGate, MemoryGate};

use crate::clock::true_now;
use crate::history::{Actor, History, ResourceOp, Step};

#[derive(Clone)]
pub struct Resource {
    gate: Arc<MemoryGate>,
    values: Arc<Mutex<BTreeMap<String, u64>>>,
    history: History,
}

impl Resource {
    pub fn new(history: History) -> Resource {
        Resource {
            gate: Arc::new(MemoryGate::new()),
            values: Arc::default(),
            history,
        }
    }

    /// Reads the counter of `lock` if `token` is not stale.
    pub fn begin(&self, actor: Actor, lock: &str, token: u64) -> Option<u64> {
        let read = self
            .gate
            .admit_then(lock, token, || {
                *self
                    .values
                    .lock()
                    .expect("values lock")
                    .get(lock)
                    .unwrap_or(&0)
            })
            .ok();
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
