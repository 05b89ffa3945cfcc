//! First come, first served, for every mode (issue #32): nobody is granted a lock past an
//! earlier waiter that was still waiting. An acquire's place is the index of the first
//! committed entry that carries it, and within a batch entry (issue #35) its position there
//! (a retry carries the same sequence number and keeps the place); the order of grants is their tokens' (a lock's grants take the granting entry's
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

/// A request's place in the log: its entry's index, and its position in that entry (a batch
/// entry's operations, issue #35, come in order; any other entry holds one).
type Place = (u64, usize);

pub fn check(h: &HistoryData) -> Vec<Violation> {
    // Per (session, lock): its requests in the order they first reached the log, each with
    // its place there: (entry index, position in the entry). A batch entry's acquires (issue
    // #35) reached the log at its index, in the batch's order.
    let mut requests: BTreeMap<(u64, &str), Vec<(u64, Place)>> = BTreeMap::new();
    for (place, op) in h
        .committed
        .iter()
        .flat_map(|(&index, c)| c.ops().enumerate().map(move |(pos, o)| ((index, pos), o)))
    {
        let (session, seq, name) = match op {
            Op::Acquire {
                session, seq, name, ..
            }
            | Op::AcquireWith {
                session, seq, name, ..
            }
            | Op::AcquireDelayed {
                session, seq, name, ..
            } => (session.id.0, *seq, name.as_str()),
            _ => continue,
        };
        let list = requests.entry((session, name)).or_default();
        if !list.iter().any(|&(s, _)| s == seq) {
            list.push((seq, place));
        }
    }
    // Per lock: (place in the log, token, who) of every acknowledged grant.
    let mut grants: BTreeMap<&str, Vec<(Place, u64, String)>> = BTreeMap::new();
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
            "{:?} (session {}, request {seq}, {:?}, in entry {}, granted token {token} \
             answered at {})",
            op.actor,
            op.session,
            op.mode,
            place.0,
            ms(*at)
        );
        grants.entry(lock).or_default().push((place, *token, who));
    }
    let mut out = Vec::new();
    for (lock, mut list) in grants {
        list.sort_by_key(|g| g.0);
        // The earlier request with the highest token so far.
        let mut top: Option<&(Place, u64, String)> = None;
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

    /// Requests in a batch entry (issue #35) reached the log at its index, in the batch's
    /// order: writer 3's and reader 4's requests share entry 12, and reader 4 granted before
    /// the writer that asked before it in that entry is caught.
    #[test]
    fn rejects_a_reader_granted_past_a_writer_that_asked_in_the_same_batch_entry() {
        let mut h = Hist::default();
        h.commit(10, acquire_with(1, 1, "rw", Mode::Exclusive), 0, 1);
        h.commit(11, acquire_with(2, 1, "rw", Mode::Shared), 2, 3);
        let batch = latchkey_core::Op::Batch(vec![
            acquire_with(3, 1, "rw", Mode::Exclusive),
            acquire_with(4, 1, "rw", Mode::Shared),
        ]);
        h.commit(12, batch, 4, 5);
        h.granted_in(1, "rw", Mode::Exclusive, 0, 10, 1);
        h.granted_in(2, "rw", Mode::Shared, 2, 14, 20);
        h.granted_in(4, "rw", Mode::Shared, 4, 15, 25);
        h.granted_in(3, "rw", Mode::Exclusive, 4, 16, 30);
        let m = messages(&check(&h.h), "fifo");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("session 4") && m[0].contains("in entry 12"),
            "{m:?}"
        );
    }

    /// A second acquire of permits of one name in a batch entry is refused by the table
    /// (`BatchConflict`) and proposed again alone: its place is that later entry, not the
    /// batch's (seed 58 with `--coalesce`: session 71's permit asked in batch entry 76, queued
    /// by entry 92, after session 80's of entry 87, which was rightly granted first).
    #[test]
    fn places_a_permit_acquire_a_batch_refused_where_it_was_sent_again() {
        let permits = Mode::Permits(2);
        let mut h = Hist::default();
        let batch = latchkey_core::Op::Batch(vec![
            acquire_with(70, 1, "sem", permits),
            acquire_with(71, 1, "sem", permits),
        ]);
        h.commit(76, batch, 0, 1);
        h.commit(87, acquire_with(80, 5, "sem", permits), 2, 3);
        h.commit(92, acquire_with(71, 1, "sem", permits), 4, 5);
        h.granted_in(70, "sem", permits, 0, 76, 1);
        h.granted_in(80, "sem", permits, 2, 77, 10);
        h.granted_in(71, "sem", permits, 0, 78, 20);
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
