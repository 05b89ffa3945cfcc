//! The invariants every run's history must satisfy, one per file.

mod deadline;
mod durability;
mod election;
mod fencing_order;
mod fifo;
mod holders;
mod lease;
pub mod linearizable;
mod liveness;
mod lock_delay;
mod no_overlap;
mod unique_token;

use std::fmt;
use std::time::Duration;

use crate::history::HistoryData;

pub use deadline::hold_checks_before_end;
pub use election::{
    reads_judged as election_reads_judged, terms as election_terms, Term as ElectionTerm,
};
pub use lock_delay::{lost_delays, LostDelay, NextGrant};

#[derive(Debug, Clone)]
pub struct Violation {
    pub checker: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.checker, self.message)
    }
}

/// What the checkers need to know about the run besides its history.
#[derive(Debug, Clone, Copy)]
pub struct CheckConfig {
    /// After the faults healed, acquires invoked from `healed_at + settle` on must be granted.
    pub settle: Duration,
    /// Acquires invoked after this are not judged for liveness (the run winds down).
    pub liveness_until: Duration,
}

/// Runs every checker; the cheap ones first. The linearizability search only runs on a
/// history that passed the others (a broken history makes it exponential, and the cheaper
/// checkers explain a bug better).
pub fn check_all(h: &HistoryData, config: &CheckConfig) -> Vec<Violation> {
    let mut out = check_safety(h);
    if out.is_empty() {
        out.extend(liveness::check(h, config));
    }
    out
}

/// The liveness checker alone: over every lock of the run at once (a client whose last
/// operations went to another group's locks was not left waiting).
pub fn check_liveness(h: &HistoryData, config: &CheckConfig) -> Vec<Violation> {
    liveness::check(h, config)
}

/// The checkers that need no record of the servers' logs, only what the clients and the
/// resource recorded: what a history taken outside the servers can be judged by (the nemesis
/// on real processes, `crates/nemesis`, runs these on its histories).
pub fn check_clients_and_resource(h: &HistoryData) -> Vec<Violation> {
    let mut out = Vec::new();
    out.extend(fencing_order::check(h));
    out.extend(no_overlap::check(h));
    out.extend(unique_token::check(h));
    out
}

/// Every checker but liveness: what can be judged of a run that ended early.
pub fn check_safety(h: &HistoryData) -> Vec<Violation> {
    let mut out = check_clients_and_resource(h);
    out.extend(holders::check(h));
    out.extend(fencing_order::check_grants(h));
    out.extend(fifo::check(h));
    out.extend(lock_delay::check(h));
    out.extend(election::check(h));
    out.extend(durability::check(h));
    out.extend(deadline::check(h));
    out.extend(lease::check(h));
    if out.is_empty() {
        out.extend(linearizable::check(h));
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// Hand-made histories for the checkers' unit tests. Times are in milliseconds of true time.
#[cfg(test)]
mod testkit {
    use std::time::Duration;

    use latchkey_core::{Op, SessionId, SessionKey};

    use crate::history::{
        entry_digest, Actor, Appended, Committed, Event, HistoryData, LogEntry, OpKind, ResourceOp,
        Ret, Step,
    };

    pub fn t(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Client `c`'s first session generation.
    pub fn actor(c: u32) -> Actor {
        Actor {
            client: c,
            generation: 1,
        }
    }

    pub fn key(session: u64) -> SessionKey {
        SessionKey {
            id: SessionId(session),
            secret: 0,
        }
    }

    pub fn acquire(session: u64, lock: &str) -> Op {
        Op::Acquire {
            session: key(session),
            seq: 1,
            name: lock.to_owned(),
            wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
        }
    }

    /// An acquire of `lock` in `mode` by session `session` with sequence number `seq`.
    pub fn acquire_with(session: u64, seq: u64, lock: &str, mode: latchkey_core::Mode) -> Op {
        Op::AcquireWith {
            session: key(session),
            seq,
            name: lock.to_owned(),
            wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
            mode,
        }
    }

    pub fn release(session: u64, lock: &str, token: u64) -> Op {
        Op::Release {
            session: key(session),
            seq: 2,
            name: lock.to_owned(),
            token,
        }
    }

    pub fn expire(sessions: &[u64]) -> Op {
        Op::ExpireSessions {
            ids: sessions.iter().copied().map(SessionId).collect(),
        }
    }

    #[derive(Default)]
    pub struct Hist {
        pub h: HistoryData,
        next_id: u64,
    }

    impl Hist {
        /// Client `c` (session `session`, named after the client: session `c`) invokes `op` at
        /// `invoked`, answered with `ret` at its time, or never.
        pub fn op(
            &mut self,
            c: u32,
            lock: &str,
            op: OpKind,
            invoked: u64,
            ret: Option<(Ret, u64)>,
        ) {
            self.op_in(actor(c), u64::from(c), lock, op, invoked, ret);
        }

        pub fn op_in(
            &mut self,
            actor: Actor,
            session: u64,
            lock: &str,
            op: OpKind,
            invoked: u64,
            ret: Option<(Ret, u64)>,
        ) {
            self.next_id += 1;
            let id = self.next_id;
            self.h.events.push(Event::Invoke {
                id,
                actor,
                session,
                lock: lock.to_owned(),
                op,
                at: t(invoked),
            });
            if let Some((ret, at)) = ret {
                self.h.events.push(Event::Return { id, ret, at: t(at) });
            }
        }

        pub fn granted(&mut self, c: u32, lock: &str, invoked: u64, token: u64, at: u64) {
            self.op(
                c,
                lock,
                OpKind::Acquire,
                invoked,
                Some((Ret::Granted { token }, at)),
            );
        }

        /// Client `c` (session `c`) asked for `lock` in `mode` at `invoked` and was granted
        /// `token` at `at`.
        pub fn granted_in(
            &mut self,
            c: u32,
            lock: &str,
            mode: latchkey_core::Mode,
            invoked: u64,
            token: u64,
            at: u64,
        ) {
            self.granted(c, lock, invoked, token, at);
            if mode != latchkey_core::Mode::Exclusive {
                self.h.modes.insert(self.next_id, mode);
            }
        }

        pub fn released(&mut self, c: u32, lock: &str, token: u64, invoked: u64, at: u64) {
            self.op(
                c,
                lock,
                OpKind::Release { token },
                invoked,
                Some((Ret::Released, at)),
            );
        }

        /// Client `c` (holding `token`) wrote to the resource.
        pub fn resource(
            &mut self,
            c: u32,
            lock: &str,
            token: u64,
            at: u64,
            step: Step,
            accepted: bool,
        ) {
            self.h.resource.push(ResourceOp {
                actor: actor(c),
                lock: lock.to_owned(),
                token,
                at: t(at),
                step,
                accepted,
            });
        }

        /// A critical section of client `c` the resource accepted: read `read` at `begin`,
        /// wrote `read + 1` at `end`.
        pub fn section(&mut self, c: u32, lock: &str, token: u64, begin: u64, end: u64, read: u64) {
            self.resource(c, lock, token, begin, Step::Begin { read }, true);
            self.resource(c, lock, token, end, Step::Commit { wrote: read + 1 }, true);
        }

        /// Entry `index` of leader (term 1, node 1), first appended at `appended` and known
        /// committed at `known`.
        pub fn commit(&mut self, index: u64, op: Op, appended: u64, known: u64) {
            let leader = (1, 1);
            self.h.appended.insert(
                (index, leader.0, leader.1),
                Appended {
                    index,
                    leader,
                    op: Some(op.clone()),
                    first_at: t(appended),
                },
            );
            let digest = Entry::new(leader, op.clone()).digest();
            self.h.committed.insert(
                index,
                Committed {
                    leader,
                    op: Some(op),
                    known_at: t(known),
                    digest,
                    seen_by: leader.1,
                },
            );
        }

        pub fn hold_check(&mut self, c: u32, lock: &str, token: u64, at: u64) {
            self.h.events.push(Event::HoldCheck {
                actor: actor(c),
                session: u64::from(c),
                lock: lock.to_owned(),
                token,
                at: t(at),
            });
        }
    }

    /// A log entry as a member holds it, for [`HistoryData::record_commits`].
    #[derive(Debug, Clone)]
    pub struct Entry {
        pub leader: (u64, u64),
        /// The leader's timestamp: part of the entry, not of its op.
        pub now_ms: u64,
        pub op: Option<Op>,
    }

    impl Entry {
        pub fn new(leader: (u64, u64), op: Op) -> Entry {
            Entry {
                leader,
                now_ms: 0,
                op: Some(op),
            }
        }
    }

    impl LogEntry for Entry {
        fn leader(&self) -> (u64, u64) {
            self.leader
        }

        fn digest(&self) -> u64 {
            entry_digest(self.leader, &(self.now_ms, &self.op))
        }

        fn op(&self) -> Option<Op> {
            self.op.clone()
        }
    }

    /// The messages of `violations`, all from `checker`.
    pub fn messages(violations: &[super::Violation], checker: &str) -> Vec<String> {
        for v in violations {
            assert_eq!(v.checker, checker, "{v}");
        }
        violations.iter().map(|v| v.message.clone()).collect()
    }
}
