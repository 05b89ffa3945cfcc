//! Acquire calls that are long-polling for a queued request, and the apply observer that wakes
//! them.
//!
//! One registry slot per (session, seq). A grant reaches exactly the call waiting for that
//! request; no other waiter is woken (no herd inside the server either).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use latchkey_core::{limits, Applied, Command, LockTable, Outcome, RequestState, SessionId};
use latchkey_raft::ApplyObserver;
use tokio::sync::oneshot;

use crate::clock::SharedClock;
use crate::lease::leases::Leases;
use crate::probe::{ProbeEvent, SharedProbe};

/// How a queued request ended, as seen by the waiting call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitEnd {
    Granted {
        token: u64,
    },
    /// The session left (closed or expired) while the request waited.
    SessionGone,
    /// The wait ended without a grant: its wait timeout passed on the server (or an installed
    /// snapshot shows it ended).
    NotGranted,
}

#[derive(Default)]
pub struct Waiters {
    /// Each slot remembers which registration made it, so that a replaced call's cleanup does
    /// not remove its replacement's slot. Ordered: `recheck` wakes the calls a snapshot ended
    /// in key order, the same on every run (a `HashMap`'s order is drawn per process, and the
    /// order of the wakes is the order the woken calls answer, which a simulation replays).
    slots: Mutex<BTreeMap<(SessionId, u64), Registered>>,
    registrations: std::sync::atomic::AtomicU64,
}

/// The registration number of a slot and the sender that wakes its call.
type Registered = (u64, oneshot::Sender<WaitEnd>);

/// A registered slot: unregister with it when the call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub session: SessionId,
    pub seq: u64,
    registration: u64,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "too many acquire calls waiting on this node (limit {})",
    limits::WAITING_ACQUIRES_MAX
)]
pub struct TooManyWaiting;

impl Waiters {
    /// Reserve the slot for `(session, seq)`. A second call for the same request replaces the
    /// first, whose receiver then sees a closed channel and answers "pending" (the client re-sent
    /// the request, so only the newest call is listened to).
    pub fn register(
        &self,
        session: SessionId,
        seq: u64,
    ) -> Result<(Slot, oneshot::Receiver<WaitEnd>), TooManyWaiting> {
        let (tx, rx) = oneshot::channel();
        let registration = self
            .registrations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut slots = self.slots.lock().expect("waiters lock");
        if slots.len() >= limits::WAITING_ACQUIRES_MAX && !slots.contains_key(&(session, seq)) {
            return Err(TooManyWaiting);
        }
        slots.insert((session, seq), (registration, tx));
        let slot = Slot {
            session,
            seq,
            registration,
        };
        Ok((slot, rx))
    }

    /// Free `slot`, unless a newer call for the same request has replaced it.
    pub fn unregister(&self, slot: Slot) {
        let mut slots = self.slots.lock().expect("waiters lock");
        if let Some((registration, _)) = slots.get(&(slot.session, slot.seq)) {
            if *registration == slot.registration {
                slots.remove(&(slot.session, slot.seq));
            }
        }
    }

    /// A snapshot replaced the table without entries: wake every call whose request the new
    /// table shows as ended, with how it ended. A request still queued, or not in the table
    /// yet (its Acquire not applied), keeps waiting.
    fn recheck(&self, table: &LockTable) {
        let mut slots = self.slots.lock().expect("waiters lock");
        let ended: Vec<((SessionId, u64), WaitEnd)> = slots
            .keys()
            .filter_map(|&(session, seq)| {
                let end = match table.request_state(session, seq) {
                    _ if table.session(session).is_none() => WaitEnd::SessionGone,
                    Some(RequestState::Done(Outcome::Granted { token })) => {
                        WaitEnd::Granted { token }
                    }
                    Some(RequestState::Done(_)) => WaitEnd::NotGranted,
                    Some(RequestState::Waiting { .. }) | None => return None,
                };
                Some(((session, seq), end))
            })
            .collect();
        for (key, end) in ended {
            if let Some((_, tx)) = slots.remove(&key) {
                let _ = tx.send(end);
            }
        }
    }

    fn wake(&self, session: SessionId, seq: u64, end: WaitEnd) {
        let tx = self
            .slots
            .lock()
            .expect("waiters lock")
            .remove(&(session, seq));
        if let Some((_, tx)) = tx {
            // The call may have gone (client disconnected); its retry will read the outcome.
            let _ = tx.send(end);
        }
    }
}

/// Runs after every applied entry on every member: keeps the lease table in step with the
/// session table, and wakes long-polling acquires whose request was granted or dropped.
pub struct Observer {
    pub waiters: Arc<Waiters>,
    pub leases: Arc<Mutex<Leases>>,
    pub clock: SharedClock,
    pub metrics: Arc<crate::observe::metrics::Metrics>,
    pub probe: SharedProbe,
    /// This member's id and its Raft group, for the probe.
    pub node: u64,
    pub group: u32,
    /// Where watch streams get this member's lock changes.
    pub watch: Arc<crate::observe::watch::WatchHub>,
}

impl ApplyObserver for Observer {
    fn installed(&self, last_index: u64, table: &LockTable) {
        let now = self.clock.now();
        self.leases
            .lock()
            .expect("leases lock")
            .installed(table.sessions(), now);
        self.waiters.recheck(table);
        self.watch.installed(last_index);
        self.metrics.snapshots_installed.inc();
        self.probe.event(
            self.node,
            self.group,
            ProbeEvent::SnapshotInstalled { last_index },
        );
    }

    /// A batch's operations are followed one by one, as entries of their own would be.
    fn applied(&self, index: u64, cmd: &Command, applied: &Applied) {
        self.metrics.entry_applied(&cmd.op);
        self.watch
            .publish(index, latchkey_core::watch_events(index, cmd, applied));
        let now = self.clock.now();
        let mut leases = self.leases.lock().expect("leases lock");
        for (op, applied) in applied.per_op(&cmd.op) {
            self.metrics.applied(op, applied);
            leases.applied(op, &applied.outcome, now);
            for h in &applied.handoffs {
                self.waiters
                    .wake(h.session, h.seq, WaitEnd::Granted { token: h.token });
            }
            for (session, seq) in &applied.dropped_waits {
                self.waiters.wake(*session, *seq, WaitEnd::SessionGone);
            }
            for (session, seq) in &applied.ended_waits {
                self.waiters.wake(*session, *seq, WaitEnd::NotGranted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemNodeClock;
    use crate::probe::{NoProbe, Plant};
    use latchkey_core::{Actor, Op, SessionKey};
    use tokio::time::{Duration, Instant};

    /// An observer of one member's group 0, and the lease table it keeps.
    fn observer() -> (Observer, Arc<Mutex<Leases>>) {
        let leases = Arc::new(Mutex::new(Leases::new(Plant::default())));
        let observer = Observer {
            waiters: Arc::new(Waiters::default()),
            leases: leases.clone(),
            clock: Arc::new(SystemNodeClock),
            metrics: Arc::new(crate::observe::metrics::Metrics::new()),
            probe: Arc::new(NoProbe),
            node: 1,
            group: 0,
            watch: Arc::new(crate::observe::watch::WatchHub::default()),
        };
        (observer, leases)
    }

    /// Regression (issue #31): a revoked session stayed in the leader's lease table, which
    /// proposed its expiry at its old deadline (and, the session gone, kept it as expiring).
    /// Every op that ends a session takes its lease with it.
    #[test]
    fn every_op_that_ends_a_session_removes_its_lease() {
        const TTL_MS: u64 = 5_000;
        let ending = |key: SessionKey| {
            [
                ("CloseSession", Op::CloseSession { session: key }),
                ("ExpireSessions", Op::ExpireSessions { ids: vec![key.id] }),
                (
                    "RevokeSession",
                    Op::RevokeSession {
                        session: key.id,
                        by: Actor {
                            identity: None,
                            claimed: "operator".into(),
                        },
                        reason: "test".into(),
                    },
                ),
            ]
        };
        for at in 0..ending(SessionKey {
            id: SessionId(0),
            secret: 0,
        })
        .len()
        {
            let (observer, leases) = observer();
            let mut table = LockTable::new();
            let mut apply = |index: u64, op: Op| {
                let cmd = Command { now_ms: 0, op };
                let applied = table.apply(index, &cmd);
                observer.applied(index, &cmd, &applied);
                applied.outcome
            };
            let open = Op::CreateSession {
                ttl_ms: TTL_MS,
                secret: 7,
            };
            let Outcome::SessionCreated { id, .. } = apply(1, open) else {
                panic!("the session is created");
            };
            let (what, op) = ending(SessionKey { id, secret: 7 })[at].clone();
            let outcome = apply(2, op);
            assert!(
                !matches!(outcome, Outcome::Rejected(_)),
                "{what}: {outcome:?}"
            );
            assert_eq!(table.session_count(), 0, "{what} ends the session");
            let mut leases = leases.lock().unwrap();
            assert_eq!(leases.next_deadline(), None, "{what} left a lease");
            let later = Instant::now() + Duration::from_millis(2 * TTL_MS);
            assert_eq!(
                leases.take_expired(later),
                Vec::<SessionId>::new(),
                "{what}: an expiry would be proposed for a session that is gone"
            );
        }
    }

    /// Regression: a client that re-sent a waiting Acquire replaced the first call's slot, and
    /// the first call's cleanup then removed the replacement's slot, so the grant woke nobody.
    #[test]
    fn a_replaced_call_does_not_unregister_its_replacement() {
        let w = Waiters::default();
        let (first, mut first_rx) = w.register(SessionId(1), 7).unwrap();
        let (_second, mut second_rx) = w.register(SessionId(1), 7).unwrap();
        // The first call sees its channel closed (it answers "pending") and cleans up.
        assert!(first_rx.try_recv().is_err());
        w.unregister(first);
        w.wake(SessionId(1), 7, WaitEnd::Granted { token: 42 });
        assert_eq!(
            second_rx.try_recv().unwrap(),
            WaitEnd::Granted { token: 42 }
        );
    }
}
