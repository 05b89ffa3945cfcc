//! First come, first served, for every mode (issue #32): nobody is granted a lock past an
//! earlier waiter that was still waiting. An acquire's place is the index of the first
//! committed entry that carries it (a retry carries the same sequence number and keeps the
//! place); the order of grants is their tokens' (a lock's grants take the granting entry's
//! index, readers granted together share one; a semaphore's permits take consecutive tokens in
//! the order granted). So of two acknowledged grants of one lock, the one whose acquire came
//! first in the log must not have the lower token: if it did, the later acquire was granted
//! while the earlier one waited (it was granted later, so its wait had not ended).
//!
//! Each acknowledged grant is matched to its acquire entry by session and lock: a session
//! asks for a lock once at a time, and every acquire of a session but its last was granted
//! (the client drops a session after an acquire that was not), so its k-th granted acquire of
//! a lock is the k-th request (sequence number) of that session for that lock in the log.

use std::collections::BTreeMap;

use latchkey_core::Op;

use super::{ms, Violation};
use crate::history::{HistoryData, OpKind, Ret};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    // Per (session, lock): its requests in the order they first reached the log.
    let mut requests: BTreeMap<(u64, &str), Vec<(u64, u64)>> = BTreeMap::new();
    for (&index, c) in &h.committed {
        let (session, seq, name) = match &c.op {
            Some(Op::Acquire {
                session, seq, name, ..
            })
            | Some(Op::AcquireWith {
                session, seq, name, ..
            })
            | Some(Op::AcquireDelayed {
                session, seq, name, ..
            }) => (session.id.0, *seq, name.as_str()),
            _ => continue,
        };
        let list = requests.entry((session, name)).or_default();
        if !list.iter().any(|&(s, _)| s == seq) {
            list.push((seq, index));
        }
    }
    // Per lock: (place in the log, token, who) of every acknowledged grant.
    let mut grants: BTreeMap<&str, Vec<(u64, u64, String)>> = BTreeMap::new();
    let ops = h.operations();
    let mut nth: BTreeMap<(u64, &str), usize> = BTreeMap::new();
    for op in &ops {
        let (OpKind::Acquire, Some((Ret::Granted { token }, at))) = (&op.op, &op.ret) else {
            continue;
        };
        let lock = op.lock.as_str();
        let k = nth.entry((op.session, lock)).or_default();
        let Some(&(seq, place)) = requests.get(&(op.session, lock)).and_then(|l| l.get(*k)) else {
            continue;
        };
        *k += 1;
        let who = format!(
            "{:?} (session {}, request {seq}, {:?}, in entry {place}, granted token {token} \
             answered at {})",
            op.actor,
            op.session,
            op.mode,
            ms(*at)
        );
        grants.entry(lock).or_default().push((place, *token, who));
    }
    let mut out = Vec::new();
    for (lock, mut list) in grants {
        list.sort_by_key(|g| g.0);
        // The earlier request with the highest token so far.
        let mut top: Option<&(u64, u64, String)> = None;
        for g in &list {
            if let Some(t) = top.filter(|t| g.1 < t.1) {
                out.push(Violation {
                    checker: "fifo",
                    message: format!(
                        "lock {lock:?}: {} was granted before {}, whose request came first and \
                         was still waiting",
                        g.2, t.2
                    ),
                });
            }
            if top.is_none_or(|t| g.1 > t.1) {
                top = Some(g);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use latchkey_core::Mode;

    use super::check;
    use crate::checkers::testkit::{acquire_with, messages, Hist};

    /// Writer 1 holds from entry 10; reader 2 asks at 11 and waits (entry 11); writer 3 asks at
    /// 12 and waits; reader 4 asks at 13.
    fn queue(h: &mut Hist) {
        h.commit(10, acquire_with(1, 1, "rw", Mode::Exclusive), 0, 1);
        h.commit(11, acquire_with(2, 1, "rw", Mode::Shared), 2, 3);
        h.commit(12, acquire_with(3, 1, "rw", Mode::Exclusive), 4, 5);
        h.commit(13, acquire_with(4, 1, "rw", Mode::Shared), 6, 7);
    }

    #[test]
    fn accepts_grants_in_the_order_of_the_requests() {
        let mut h = Hist::default();
        queue(&mut h);
        h.granted_in(1, "rw", Mode::Exclusive, 0, 10, 1);
        // Writer 1 released at 14: reader 2 (token 14); it released at 15: writer 3; then 4.
        h.granted_in(2, "rw", Mode::Shared, 2, 14, 20);
        h.granted_in(3, "rw", Mode::Exclusive, 4, 15, 30);
        h.granted_in(4, "rw", Mode::Shared, 6, 16, 40);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
    }

    #[test]
    fn rejects_a_reader_granted_past_a_waiting_writer() {
        let mut h = Hist::default();
        queue(&mut h);
        h.granted_in(1, "rw", Mode::Exclusive, 0, 10, 1);
        h.granted_in(2, "rw", Mode::Shared, 2, 14, 20);
        // Reader 4 joined reader 2 at its own entry... (here: token 15, before writer 3's 16).
        h.granted_in(4, "rw", Mode::Shared, 6, 15, 25);
        h.granted_in(3, "rw", Mode::Exclusive, 4, 16, 30);
        let m = messages(&check(&h.h), "fifo");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("session 4") && m[0].contains("before"),
            "{m:?}"
        );
        assert!(m[0].contains("session 3"), "{m:?}");
    }
}
