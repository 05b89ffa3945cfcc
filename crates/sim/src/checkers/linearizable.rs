//! Each mutex's history is linearizable against a sequential lock model (names taken by a
//! reader or as a semaphore are not judged here).
//!
//! Threads are the clients' session generations (one operation at a time each; an
//! operation left without an answer ends its thread) plus one pseudo-thread per committed
//! session end (expiry or close) that involves a session that used the lock, spanning from the
//! entry's first append to the moment a member knew it committed. Tokens are log indexes, which
//! the model cannot predict: it accepts any grant token higher than every earlier one.
//!
//! The search is Wing and Gong's, with Lowe's memo of (operations linearized, model state), as
//! Porcupine and Knossos run it: the entries (calls and returns, in execution order) form a
//! linked list; the search linearizes a call that comes before the first remaining return, lifts
//! it and its return out of the list, and backtracks when it meets the return of an operation
//! it has not linearized.
//! An operation without an answer may be linearized (with the model's own result) or not at all.
//! stateright's `LinearizabilityTester` judges the same histories (the test
//! `agrees_with_stateright_on_random_histories` holds the two equal), but it copies the whole
//! remaining history at every step of its search, without a memo: on a seed's lock histories
//! of about a thousand operations that was a quarter of the seed's CPU.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

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

impl LockModel {
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

    /// Whether `op` answered `ret` is a step of the model from this state (taken if so).
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

/// A session end the search places where it can: after `from`, and before `by` if that is
/// known (without it, the end may fall anywhere after `from`, or not at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndWindow {
    /// Tells the ends apart (the simulation's: the entry's index).
    pub id: u64,
    pub sessions: Vec<u64>,
    pub from: Duration,
    pub by: Option<Duration>,
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let ends: Vec<EndWindow> = h
        .committed_session_ends()
        .into_iter()
        .map(|end| EndWindow {
            id: end.index,
            sessions: end.sessions,
            from: end.first_at,
            by: Some(end.known_at),
        })
        .collect();
    check_with_ends(h, |_, sessions| {
        ends.iter()
            .filter(|end| end.sessions.iter().any(|s| sessions.contains(s)))
            .cloned()
            .collect()
    })
}

/// [`check`] with the session ends of each lock from `ends_of(lock, sessions that used it)`:
/// a run on real processes has no record of the servers' entries and times its ends from
/// what its clients saw (the nemesis, issue #34).
pub fn check_with_ends(
    h: &HistoryData,
    ends_of: impl Fn(&str, &BTreeSet<u64>) -> Vec<EndWindow>,
) -> Vec<Violation> {
    // The model is a mutex's: a read-write lock with readers and a semaphore are judged by the
    // holders, fifo and fencing_order checkers instead.
    let with_modes = h.names_with_modes();
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
        .filter(|lock| !with_modes.contains(*lock))
        .filter_map(|lock| check_lock(h, lock, &ends_of))
        .collect()
}

fn check_lock(
    h: &HistoryData,
    lock: &str,
    ends_of: &impl Fn(&str, &BTreeSet<u64>) -> Vec<EndWindow>,
) -> Option<Violation> {
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
    for end in ends_of(lock, &sessions) {
        let thread = (u32::MAX, 0, end.id);
        let op = LockOp::End {
            sessions: end.sessions,
        };
        steps.push((end.from, 0, Step::Invoke(thread, op)));
        if let Some(by) = end.by {
            steps.push((by, 2, Step::Return(thread, LockRet::Done)));
        }
    }
    // Stable: client steps keep their execution order within an instant.
    steps.sort_by_key(|(at, rank, _)| (*at, *rank));

    let mut history = History::default();
    for (_, _, step) in steps {
        let r = match step {
            Step::Invoke(t, op) => history.invoke(t, op),
            Step::Return(t, ret) => history.answer(t, ret),
        };
        if let Err(e) = r {
            return Some(Violation {
                checker: "linearizable",
                message: format!("lock {lock:?}: malformed history: {e}"),
            });
        }
    }
    if history.is_linearizable(LockModel::default()) {
        None
    } else {
        Some(Violation {
            checker: "linearizable",
            message: format!(
                "lock {lock:?}: the history of {} operations is not linearizable against the \
                 lock model",
                history.ops.len()
            ),
        })
    }
}

/// One operation: what it asked and, if it was answered, the answer.
#[derive(Debug)]
struct Operation {
    op: LockOp,
    ret: Option<LockRet>,
    call: usize,
    answer: Option<usize>,
}

/// An entry of the history: an operation's call, or its return (the operation's `answer`
/// names the entry; backtracking finds the operation on its stack).
#[derive(Debug, Clone, Copy)]
enum Entry {
    Call(usize),
    Return,
}

/// A history in execution order, built from the calls and returns as they happened.
#[derive(Debug, Default)]
struct History {
    ops: Vec<Operation>,
    entries: Vec<Entry>,
    in_flight: BTreeMap<Thread, usize>,
}

/// The end of the linked list of entries.
const NIL: usize = usize::MAX;

impl History {
    /// `thread` calls `op`; an error if the thread already has an operation in flight.
    fn invoke(&mut self, thread: Thread, op: LockOp) -> Result<(), String> {
        if let Some(&id) = self.in_flight.get(&thread) {
            return Err(format!(
                "thread {thread:?} called {op:?} while {:?} was in flight",
                self.ops[id].op
            ));
        }
        let id = self.ops.len();
        self.in_flight.insert(thread, id);
        self.ops.push(Operation {
            op,
            ret: None,
            call: self.entries.len(),
            answer: None,
        });
        self.entries.push(Entry::Call(id));
        Ok(())
    }

    /// `thread`'s operation in flight returned `ret`; an error if it has none.
    fn answer(&mut self, thread: Thread, ret: LockRet) -> Result<(), String> {
        let Some(id) = self.in_flight.remove(&thread) else {
            return Err(format!(
                "thread {thread:?} returned {ret:?} with nothing in flight"
            ));
        };
        self.ops[id].ret = Some(ret);
        self.ops[id].answer = Some(self.entries.len());
        self.entries.push(Entry::Return);
        Ok(())
    }

    /// Whether some order of the operations, each placed between its call and its return,
    /// takes `init` through every answered operation with its answer (unanswered operations
    /// placed anywhere after their call, or left out).
    fn is_linearizable(&self, init: LockModel) -> bool {
        let n = self.entries.len();
        // A doubly linked list of the entries not yet lifted, behind a head at index `n`.
        let head = n;
        let mut next: Vec<usize> = (1..=n).collect();
        if let Some(last) = next.last_mut() {
            *last = NIL;
        }
        next.push(if n == 0 { NIL } else { 0 });
        let mut prev: Vec<usize> = (0..=n).map(|i| i.wrapping_sub(1)).collect();
        prev[0] = head;
        let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
            next[prev[e]] = next[e];
            if next[e] != NIL {
                prev[next[e]] = prev[e];
            }
        };
        let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
            next[prev[e]] = e;
            if next[e] != NIL {
                prev[next[e]] = e;
            }
        };

        let mut answered_left = self.ops.iter().filter(|o| o.ret.is_some()).count();
        let mut state = init;
        let mut linearized = vec![0u64; self.ops.len().div_ceil(64)];
        let mut seen: HashSet<(Vec<u64>, LockModel)> = HashSet::new();
        // The operations linearized so far, each with the state before it.
        let mut stack: Vec<(usize, LockModel)> = Vec::new();
        let mut cursor = next[head];
        while answered_left > 0 {
            match (cursor != NIL).then(|| self.entries[cursor]) {
                Some(Entry::Call(id)) => {
                    let o = &self.ops[id];
                    let mut after = state.clone();
                    let step_ok = match &o.ret {
                        Some(ret) => after.is_valid_step(&o.op, ret),
                        None => {
                            after.invoke(&o.op);
                            true
                        }
                    };
                    if step_ok {
                        linearized[id / 64] |= 1 << (id % 64);
                        if seen.insert((linearized.clone(), after.clone())) {
                            stack.push((id, std::mem::replace(&mut state, after)));
                            if o.ret.is_some() {
                                answered_left -= 1;
                            }
                            unlink(&mut next, &mut prev, o.call);
                            if let Some(r) = o.answer {
                                unlink(&mut next, &mut prev, r);
                            }
                            cursor = next[head];
                            continue;
                        }
                        linearized[id / 64] &= !(1 << (id % 64));
                    }
                    cursor = next[cursor];
                }
                // A return whose call could not be linearized yet (or, defensively, the end of
                // the list): undo the last choice and try the next call after it.
                Some(Entry::Return) | None => {
                    let Some((id, before)) = stack.pop() else {
                        return false;
                    };
                    let o = &self.ops[id];
                    state = before;
                    linearized[id / 64] &= !(1 << (id % 64));
                    if o.ret.is_some() {
                        answered_left += 1;
                    }
                    if let Some(r) = o.answer {
                        relink(&mut next, &mut prev, r);
                    }
                    relink(&mut next, &mut prev, o.call);
                    cursor = next[o.call];
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

    use super::{check, History, LockModel, LockOp, LockRet, Thread};
    use crate::checkers::testkit::{expire, messages, Hist};
    use crate::history::{OpKind, Ret};

    impl SequentialSpec for LockModel {
        type Op = LockOp;
        type Ret = LockRet;
        fn invoke(&mut self, op: &LockOp) -> LockRet {
            LockModel::invoke(self, op)
        }
        fn is_valid_step(&mut self, op: &LockOp, ret: &LockRet) -> bool {
            LockModel::is_valid_step(self, op, ret)
        }
    }

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

    /// A step of a test history: a call (`Ok`) or a return (`Err`) on a thread.
    type TestStep = (Thread, Result<LockOp, LockRet>);

    /// `n` sequential answered operations on a thread of their own (ends of a session that
    /// never holds), so that the operations after them have ids past 64 and the search's set of
    /// linearized operations spans several words.
    fn sequential_prefix(n: usize) -> Vec<TestStep> {
        let thread = (99, 0, 0);
        let end = LockOp::End { sessions: vec![99] };
        (0..n)
            .flat_map(|_| [(thread, Ok(end.clone())), (thread, Err(LockRet::Done))])
            .collect()
    }

    /// One random history over up to four threads: calls and returns interleaved at random;
    /// the answers either those of a real lock taking effect at a random moment inside each
    /// call (mostly linearizable: the model refuses some answers a real lock gives, such as a
    /// holder's own second acquire) or drawn at random. The last operation of a thread is
    /// sometimes left without an answer, having taken effect or not.
    fn random_history(rng: &mut StdRng) -> Vec<TestStep> {
        let threads = rng.random_range(1..=4usize);
        let honest = rng.random_bool(0.5);
        let mut left: Vec<u32> = (0..threads).map(|_| rng.random_range(1..=3)).collect();
        // Per thread: 0 idle, 1 called, 2 took effect (honest only); and the answer to give.
        let mut phase = vec![(0u8, None::<LockOp>, None::<LockRet>); threads];
        let (mut real, mut token) = (LockModel::default(), 0u64);
        let mut out = Vec::new();
        loop {
            let busy: Vec<usize> = (0..threads)
                .filter(|&t| left[t] > 0 || phase[t].0 > 0)
                .collect();
            if busy.is_empty() {
                return out;
            }
            let t = busy[rng.random_range(0..busy.len())];
            let thread = (t as u32, 0, 0);
            match phase[t].0 {
                0 => {
                    let session = t as u64 + rng.random_range(0..=1) * 10;
                    let op = match rng.random_range(0..5) {
                        0 | 1 => LockOp::Acquire { session },
                        2 | 3 => LockOp::Release {
                            session,
                            token: rng.random_range(1..=4),
                        },
                        _ => LockOp::End {
                            sessions: vec![rng.random_range(0..3)],
                        },
                    };
                    left[t] -= 1;
                    out.push((thread, Ok(op.clone())));
                    phase[t] = (1, Some(op), None);
                }
                // The last call of a thread may end it unanswered before it took effect.
                1 if honest && left[t] == 0 && rng.random_bool(0.15) => phase[t] = (0, None, None),
                1 if honest => {
                    let op = phase[t].1.clone().expect("called");
                    let ret = match &op {
                        LockOp::Acquire { session } if real.holder.is_none() => {
                            token += rng.random_range(1..=2);
                            real.holder = Some((*session, token));
                            LockRet::Granted(token)
                        }
                        op => real.invoke(op),
                    };
                    phase[t] = (2, Some(op), Some(ret));
                }
                _ => {
                    let ret = phase[t].2.take().unwrap_or_else(|| {
                        match phase[t].1.as_ref().expect("called") {
                            LockOp::Acquire { .. } if rng.random_bool(0.5) => {
                                LockRet::Granted(rng.random_range(1..=4))
                            }
                            LockOp::Acquire { .. } => LockRet::NotGranted,
                            LockOp::Release { .. } if rng.random_bool(0.5) => LockRet::Released,
                            LockOp::Release { .. } => LockRet::NotHolder,
                            LockOp::End { .. } => LockRet::Done,
                        }
                    });
                    // The last operation of a thread may stay unanswered after it took effect.
                    if left[t] > 0 || rng.random_bool(0.7) {
                        out.push((thread, Err(ret)));
                    }
                    phase[t] = (0, None, None);
                }
            }
        }
    }

    /// Feeds `steps` to both; the index of the first step either refused as malformed.
    fn feed(
        steps: &[TestStep],
        ours: &mut History,
        reference: &mut LinearizabilityTester<Thread, LockModel>,
    ) -> (Option<usize>, Option<usize>) {
        let (mut ours_bad, mut reference_bad) = (None, None);
        for (i, (thread, step)) in steps.iter().enumerate() {
            let (a, b) = match step {
                Ok(op) => (
                    ours.invoke(*thread, op.clone()).is_err(),
                    reference.on_invoke(*thread, op.clone()).is_err(),
                ),
                Err(ret) => (
                    ours.answer(*thread, ret.clone()).is_err(),
                    reference.on_return(*thread, ret.clone()).is_err(),
                ),
            };
            if a && ours_bad.is_none() {
                ours_bad = Some(i);
            }
            if b && reference_bad.is_none() {
                reference_bad = Some(i);
            }
            if ours_bad.is_some() || reference_bad.is_some() {
                break;
            }
        }
        (ours_bad, reference_bad)
    }

    /// Holds the search above to stateright's tester, the reference: the same verdict on every
    /// history, over enough histories of both kinds that a wrong answer of either kind shows;
    /// a tenth of them behind a sequential prefix of 70 operations (ids past one word), one in
    /// fifty made malformed (a thread calling twice, or a return from a thread that called
    /// nothing), which both must refuse at the same step.
    #[test]
    fn agrees_with_stateright_on_random_histories() {
        let mut rng = StdRng::seed_from_u64(0x1a_e4);
        let (mut linearizable, mut not, mut malformed) = (0, 0, 0);
        for i in 0..20_000 {
            let mut steps = if rng.random_bool(0.1) {
                sequential_prefix(70)
            } else {
                Vec::new()
            };
            steps.extend(random_history(&mut rng));
            if rng.random_bool(0.02) {
                let at = rng.random_range(0..=steps.len());
                let bad = match steps.get(at) {
                    Some((thread, Ok(op))) => (*thread, Ok(op.clone())),
                    _ => ((200, 0, 0), Err(LockRet::Done)),
                };
                steps.insert(at.min(steps.len()), bad);
            }
            let mut ours = History::default();
            let mut reference = LinearizabilityTester::new(LockModel::default());
            let (ours_bad, reference_bad) = feed(&steps, &mut ours, &mut reference);
            assert_eq!(
                ours_bad, reference_bad,
                "history {i}: refused as malformed at different steps: {steps:?}"
            );
            if ours_bad.is_some() {
                malformed += 1;
                continue;
            }
            let verdict = ours.is_linearizable(LockModel::default());
            assert_eq!(
                verdict,
                reference.is_consistent(),
                "history {i} judged differently: {steps:?}"
            );
            if verdict {
                linearizable += 1;
            } else {
                not += 1;
            }
        }
        assert!(
            linearizable > 2_000 && not > 2_000 && malformed > 100,
            "too few of one kind: {linearizable} linearizable, {not} not, {malformed} malformed"
        );
    }

    /// Fourteen overlapping session ends, then a release no one could have answered: the
    /// search must rule out every order of the fourteen, 14! of them, which only the memo (2^14
    /// sets of ends, one model state) makes finish.
    #[test]
    fn the_memo_bounds_a_wide_hopeless_history() {
        let mut h = History::default();
        for t in 0..14 {
            h.invoke((t, 0, 0), LockOp::End { sessions: vec![7] })
                .expect("call");
        }
        for t in 0..14 {
            h.answer((t, 0, 0), LockRet::Done).expect("answer");
        }
        h.invoke(
            (50, 0, 0),
            LockOp::Release {
                session: 1,
                token: 1,
            },
        )
        .expect("call");
        h.answer((50, 0, 0), LockRet::Released).expect("answer");
        assert!(!h.is_linearizable(LockModel::default()));
    }

    #[test]
    fn a_thread_calling_twice_without_an_answer_is_a_malformed_history() {
        let mut h = History::default();
        h.invoke((1, 0, 0), LockOp::Acquire { session: 1 })
            .expect("first call");
        assert!(h.invoke((1, 0, 0), LockOp::Acquire { session: 1 }).is_err());
        assert!(h.answer((2, 0, 0), LockRet::NotGranted).is_err());
    }

    #[test]
    fn rejects_a_release_acknowledged_to_a_non_holder() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.released(2, "a", 5, 200, 210);
        assert_eq!(messages(&check(&h.h), "linearizable").len(), 1);
    }
}
