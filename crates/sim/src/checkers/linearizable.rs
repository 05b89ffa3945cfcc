//! Each lock's history is linearizable against a sequential lock model, checked with
//! stateright's `LinearizabilityTester`.
//!
//! Threads are the clients' session generations (one operation at a time each; an
//! operation left without an answer ends its thread) plus one pseudo-thread per committed
//! session end (expiry or close) that involves a session that used the lock, spanning from the
//! entry's first append to the moment a member knew it committed. Tokens are log indexes, which
//! the model cannot predict: it accepts any grant token higher than every earlier one.

use std::collections::BTreeSet;
use std::time::Duration;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use super::Violation;
use crate::history::{Event, HistoryData, OpKind, Ret};

/// Token of a grant whose answer was never seen.
const UNKNOWN: u64 = u64::MAX;

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LockModel {
    holder: Option<(u64, u64)>,
    last_token: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockOp {
    Acquire { session: u64 },
    Release { session: u64, token: u64 },
    End { sessions: Vec<u64> },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockRet {
    Granted(u64),
    NotGranted,
    Released,
    NotHolder,
    Done,
}

impl SequentialSpec for LockModel {
    type Op = LockOp;
    type Ret = LockRet;

    /// Used for operations without an answer: they may have taken effect.
    fn invoke(&mut self, op: &LockOp) -> LockRet {
        match op {
            LockOp::Acquire { session } => match self.holder {
                None => {
                    self.holder = Some((*session, UNKNOWN));
                    LockRet::Granted(UNKNOWN)
                }
                Some(_) => LockRet::NotGranted,
            },
            LockOp::Release { session, token } => {
                if self.holder == Some((*session, *token)) {
                    self.holder = None;
                    LockRet::Released
                } else {
                    LockRet::NotHolder
                }
            }
            LockOp::End { sessions } => {
                if self.holder.is_some_and(|(s, _)| sessions.contains(&s)) {
                    self.holder = None;
                }
                LockRet::Done
            }
        }
    }

    fn is_valid_step(&mut self, op: &LockOp, ret: &LockRet) -> bool {
        match (op, ret) {
            (LockOp::Acquire { session }, LockRet::Granted(token)) => {
                let ok = self.holder.is_none() && *token > self.last_token;
                if ok {
                    self.holder = Some((*session, *token));
                    self.last_token = *token;
                }
                ok
            }
            (LockOp::Acquire { session }, LockRet::NotGranted) => {
                self.holder.is_some_and(|(s, _)| s != *session)
            }
            (LockOp::Release { .. }, LockRet::Released | LockRet::NotHolder)
            | (LockOp::End { .. }, LockRet::Done) => self.invoke(op) == *ret,
            _ => false,
        }
    }
}

type Thread = (u32, u32, u64);

enum Step {
    Invoke(Thread, LockOp),
    Return(Thread, LockRet),
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let locks: BTreeSet<&str> = h
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Invoke { lock, .. } => Some(lock.as_str()),
            _ => None,
        })
        .collect();
    locks
        .into_iter()
        .filter_map(|lock| check_lock(h, lock))
        .collect()
}

fn check_lock(h: &HistoryData, lock: &str) -> Option<Violation> {
    // Client steps in execution order, with their times.
    let mut steps: Vec<(Duration, u8, Step)> = Vec::new();
    let mut thread_of = std::collections::BTreeMap::new();
    let mut sessions = BTreeSet::new();
    for e in &h.events {
        match e {
            Event::Invoke {
                id,
                actor,
                session,
                lock: l,
                op,
                at,
            } if l == lock => {
                let thread = (actor.client, actor.generation, 0);
                thread_of.insert(*id, thread);
                sessions.insert(*session);
                let op = match op {
                    OpKind::Acquire => LockOp::Acquire { session: *session },
                    OpKind::Release { token } => LockOp::Release {
                        session: *session,
                        token: *token,
                    },
                };
                steps.push((*at, 1, Step::Invoke(thread, op)));
            }
            Event::Return { id, ret, at } => {
                if let Some(&thread) = thread_of.get(id) {
                    let ret = match ret {
                        Ret::Granted { token } => LockRet::Granted(*token),
                        Ret::NotGranted => LockRet::NotGranted,
                        Ret::Released => LockRet::Released,
                        Ret::NotHolder => LockRet::NotHolder,
                    };
                    steps.push((*at, 1, Step::Return(thread, ret)));
                }
            }
            _ => {}
        }
    }
    // Session ends: invoked before anything else at the same instant, answered after.
    for end in h.committed_session_ends() {
        if !end.sessions.iter().any(|s| sessions.contains(s)) {
            continue;
        }
        let thread = (u32::MAX, 0, end.index);
        let op = LockOp::End {
            sessions: end.sessions.clone(),
        };
        steps.push((end.first_at, 0, Step::Invoke(thread, op)));
        steps.push((end.known_at, 2, Step::Return(thread, LockRet::Done)));
    }
    // Stable: client steps keep their execution order within an instant.
    steps.sort_by_key(|(at, rank, _)| (*at, *rank));

    let mut tester: LinearizabilityTester<Thread, LockModel> =
        LinearizabilityTester::new(LockModel::default());
    for (_, _, step) in steps {
        let r = match step {
            Step::Invoke(t, op) => tester.on_invoke(t, op).map(|_| ()),
            Step::Return(t, ret) => tester.on_return(t, ret).map(|_| ()),
        };
        if let Err(e) = r {
            return Some(Violation {
                checker: "linearizable",
                message: format!("lock {lock:?}: malformed history: {e}"),
            });
        }
    }
    if tester.is_consistent() {
        None
    } else {
        Some(Violation {
            checker: "linearizable",
            message: format!(
                "lock {lock:?}: the history of {} operations is not linearizable against the \
                 lock model",
                tester.len()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::checkers::testkit::{expire, messages, Hist};
    use crate::history::{OpKind, Ret};

    /// Client 1 takes `a` (5) and releases it; client 2, waiting meanwhile, gets it (8) and
    /// keeps it until its session expires (entry 12); then client 3 gets it (14).
    fn valid() -> Hist {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.op(
            2,
            "a",
            OpKind::Acquire,
            150,
            Some((Ret::Granted { token: 8 }, 260)),
        );
        h.released(1, "a", 5, 200, 250);
        h.op(3, "a", OpKind::Acquire, 300, Some((Ret::NotGranted, 800)));
        h.commit(12, expire(&[2]), 1_000, 1_050);
        h.granted(3, "a", 1_100, 14, 1_110);
        // A release by a non-holder is refused.
        h.op(
            1,
            "a",
            OpKind::Release { token: 5 },
            1_200,
            Some((Ret::NotHolder, 1_210)),
        );
        h
    }

    #[test]
    fn accepts_a_lock_history_with_release_expiry_and_handover() {
        assert!(check(&valid().h).is_empty());
    }

    #[test]
    fn rejects_a_second_grant_while_the_holder_neither_released_nor_expired() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.granted(2, "a", 200, 8, 210);
        let m = messages(&check(&h.h), "linearizable");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("not linearizable"), "{m:?}");
    }

    #[test]
    fn rejects_a_grant_before_the_holders_expiry_was_proposed() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.granted(2, "a", 200, 8, 210);
        h.commit(9, expire(&[1]), 300, 350);
        assert_eq!(messages(&check(&h.h), "linearizable").len(), 1);
    }

    #[test]
    fn rejects_a_grant_token_lower_than_a_previous_one() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 7, 110);
        h.released(1, "a", 7, 200, 210);
        h.granted(2, "a", 300, 5, 310);
        assert_eq!(messages(&check(&h.h), "linearizable").len(), 1);
    }

    #[test]
    fn rejects_a_release_acknowledged_to_a_non_holder() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.released(2, "a", 5, 200, 210);
        assert_eq!(messages(&check(&h.h), "linearizable").len(), 1);
    }
}
