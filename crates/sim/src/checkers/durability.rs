//! Every acknowledged grant and release is reflected in the cluster after failovers and a
//! restart of every node:
//! - an acknowledged grant's token is the index of a committed entry that could make that
//!   grant (an Acquire by that session for that lock, a release of that lock, or a cancel,
//!   close or expiry that handed the lock over);
//! - no committed entry was ever replaced by another: for every log index, every member that
//!   saw it committed held the same entry (same log id and payload digest) as the first one
//!   that did. The log stores record it ([`HistoryData::record_commits`]) each time a member
//!   saves a new commit index, for every index that became committed for it, not only the
//!   newest;
//! - after the final restart of every node, a lock is not held under a token whose release was
//!   acknowledged, nor under a token older than the newest acknowledged grant; and a lock whose
//!   newest acknowledged grant was neither released nor ended by its session's end is still held.

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::Op;

use super::{ms, Violation};
use crate::history::{HistoryData, OpKind, Ret};

fn v(message: String) -> Violation {
    Violation {
        checker: "durability",
        message,
    }
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut out: Vec<Violation> = h.recorded_violations.iter().cloned().map(v).collect();
    let ops = h.operations();
    let ended: BTreeSet<u64> = h
        .committed_session_ends()
        .into_iter()
        .flat_map(|e| e.sessions)
        .collect();
    let mut newest: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut released: BTreeSet<(&str, u64)> = BTreeSet::new();
    let mut release_tried: BTreeSet<(&str, u64)> = BTreeSet::new();
    // A semaphore's tokens are not entry indexes, and a name with several holders has no one
    // final holder: these checks judge mutexes (and read-write locks never taken by a reader).
    let with_modes = h.names_with_modes();
    for op in ops.iter().filter(|op| !with_modes.contains(&op.lock)) {
        match (&op.op, &op.ret) {
            (OpKind::Acquire, Some((Ret::Granted { token }, at))) => {
                let e = newest.entry(op.lock.as_str()).or_insert((0, 0));
                if *token > e.0 {
                    *e = (*token, op.session);
                }
                // Any operation of the entry may have made the grant (a batch entry's, issue
                // #35, each as an entry of its own at that index).
                let mut entry = h.committed.get(token).into_iter().flat_map(|c| c.ops());
                let ok = entry.any(|o| match o {
                    Op::Acquire { session, name, .. }
                    | Op::AcquireDelayed { session, name, .. } => {
                        session.id.0 == op.session && *name == op.lock
                    }
                    // The end of a lock-delay hands over only the names it ends.
                    Op::EndDelays { ends } => ends.iter().any(|e| e.name == op.lock),
                    // A release hands over only the lock it names.
                    Op::Release { name, .. } => *name == op.lock,
                    Op::CancelWait { .. } | Op::CloseSession { .. } | Op::ExpireSessions { .. } => {
                        true
                    }
                    _ => false,
                });
                if !ok {
                    out.push(v(format!(
                        "grant of lock {:?} to session {} with token {token}, acknowledged at {}, \
                         is not backed by a committed entry at index {token} (found {:?})",
                        op.lock,
                        op.session,
                        ms(*at),
                        h.committed.get(token).map(|c| &c.op)
                    )));
                }
            }
            (OpKind::Release { token }, ret) => {
                release_tried.insert((op.lock.as_str(), *token));
                if let Some((Ret::Released, _)) = ret {
                    released.insert((op.lock.as_str(), *token));
                }
            }
            _ => {}
        }
    }
    for (lock, holder) in h
        .final_holders
        .iter()
        .filter(|(l, _)| !with_modes.contains(*l))
    {
        let newest = newest.get(lock.as_str()).copied();
        match (holder, newest) {
            (Some((_, token)), _) if released.contains(&(lock.as_str(), *token)) => out.push(v(
                format!("after the restart lock {lock:?} is held under token {token}, whose release was acknowledged"),
            )),
            (Some((_, token)), Some((g, _))) if *token < g => out.push(v(format!(
                "after the restart lock {lock:?} is held under token {token}, older than the \
                 acknowledged grant {g}"
            ))),
            (None, Some((g, session)))
                if !release_tried.contains(&(lock.as_str(), g)) && !ended.contains(&session) =>
            {
                out.push(v(format!(
                    "after the restart lock {lock:?} is free, but its newest acknowledged grant \
                     (token {g}, session {session}) was never released and its session never ended"
                )))
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::RangeInclusive;

    use super::check;
    use crate::checkers::testkit::{acquire, expire, messages, release, t, Entry, Hist};
    use crate::history::OpKind;

    /// Client 1 takes `a` (token 5), client 2 waits and gets it when 1 releases (token 8);
    /// client 3 takes `b` (token 9) and its session expires (entry 12).
    fn valid() -> Hist {
        let mut h = Hist::default();
        h.commit(5, acquire(1, "a"), 100, 105);
        h.granted(1, "a", 100, 5, 110);
        h.commit(6, acquire(2, "a"), 120, 125);
        h.commit(8, release(1, "a", 5), 200, 205);
        h.released(1, "a", 5, 200, 210);
        h.granted(2, "a", 120, 8, 210);
        h.commit(9, acquire(3, "b"), 300, 305);
        h.granted(3, "b", 300, 9, 310);
        h.commit(12, expire(&[3]), 900, 905);
        h.h.final_holders.insert("a".into(), Some((2, 8)));
        h.h.final_holders.insert("b".into(), None);
        h
    }

    #[test]
    fn accepts_grants_backed_by_committed_entries_and_kept_after_restart() {
        assert!(check(&valid().h).is_empty());
    }

    #[test]
    fn rejects_an_acknowledged_grant_with_no_committed_entry_at_its_index() {
        let mut h = valid();
        h.granted(4, "c", 1000, 20, 1010);
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("token 20") && m[0].contains("None"), "{m:?}");
    }

    /// Every operation of a batch entry (issue #35) may have made a grant at its index, as an
    /// entry of its own there would: two acquires of two sessions, both granted token 20; a
    /// session with no operation in the batch was granted nothing by it.
    #[test]
    fn accepts_grants_made_by_the_operations_of_a_batch_entry() {
        let mut h = valid();
        let batch = latchkey_core::Op::Batch(vec![acquire(4, "c"), acquire(6, "d")]);
        h.commit(20, batch, 1000, 1005);
        h.granted(4, "c", 1000, 20, 1010);
        h.granted(6, "d", 1000, 20, 1010);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
        h.granted(7, "e", 1000, 20, 1010);
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("session 7") && m[0].contains("Batch"),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_a_grant_whose_index_holds_another_sessions_acquire() {
        let mut h = valid();
        h.commit(20, acquire(5, "c"), 1000, 1005);
        h.granted(4, "c", 1000, 20, 1010);
        assert_eq!(messages(&check(&h.h), "durability").len(), 1);
    }

    #[test]
    fn rejects_a_grant_whose_index_holds_a_release_of_another_lock() {
        let mut h = valid();
        // Entry 8 released `a`; it cannot have handed over `b`.
        h.granted(4, "b", 150, 8, 210);
        let m = messages(&check(&h.h), "durability");
        assert!(m.iter().any(|m| m.contains("token 8")), "{m:?}");
    }

    #[test]
    fn rejects_a_committed_entry_that_changed() {
        let mut h = valid();
        let first = Entry::new((1, 1), acquire(4, "c"));
        h.h.record_commit(2, 13, 13, &first, t(1000));
        h.h.record_commit(3, 13, 13, &first, t(1001));
        assert!(
            check(&h.h).is_empty(),
            "the same entry seen again is no change"
        );
        h.h.record_commit(3, 14, 13, &Entry::new((2, 3), acquire(5, "c")), t(1100));
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("committed entry 13 changed"), "{m:?}");
    }

    /// Node `node` in life `life` saves commit index `upto` at `at`, holding `log`.
    fn commits(h: &mut Hist, node: u64, life: u64, upto: u64, log: &BTreeMap<u64, Entry>, at: u64) {
        let held = |range: RangeInclusive<u64>| log.range(range).map(|(&i, e)| (i, e.clone()));
        h.h.record_commits(node, life, upto, held, t(at));
    }

    /// Entries 20..=30 of leader (2, 1), each an acquire of `d` by the session named after
    /// its index.
    fn log() -> BTreeMap<u64, Entry> {
        (20..=30)
            .map(|i| (i, Entry::new((2, 1), acquire(i, "d"))))
            .collect()
    }

    #[test]
    fn rejects_a_diverging_entry_below_the_newest_committed_index() {
        let mut h = valid();
        commits(&mut h, 1, 0, 25, &log(), 1000);
        assert!(check(&h.h).is_empty());
        // Node 2 lags: one commit index tells it 20..=23 are committed, and it holds another
        // entry at 21. Comparing only the newest index (23) would miss it.
        let mut bad = log();
        bad.insert(21, Entry::new((2, 1), acquire(7, "d")));
        commits(&mut h, 2, 0, 23, &bad, 1100);
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("committed entry 21 changed"), "{m:?}");
        // Both entries are described, with who saw them.
        assert!(
            m[0].contains("node 1 saw it") && m[0].contains("SessionId(21)"),
            "{m:?}"
        );
        assert!(
            m[0].contains("node 2 now has") && m[0].contains("SessionId(7)"),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_a_committed_entry_that_differs_outside_its_op() {
        let mut h = valid();
        commits(&mut h, 1, 0, 25, &log(), 1000);
        // Same log id, same op, another leader timestamp: not the same entry.
        let mut bad = log();
        bad.get_mut(&22).expect("entry 22").now_ms = 5;
        commits(&mut h, 2, 0, 30, &bad, 1100);
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("committed entry 22 changed"), "{m:?}");
    }

    #[test]
    fn rejects_a_diverging_entry_a_restarted_member_holds_below_what_it_compared_before() {
        let mut h = valid();
        commits(&mut h, 1, 0, 25, &log(), 1000);
        commits(&mut h, 2, 0, 25, &log(), 1010);
        assert!(check(&h.h).is_empty());
        // Node 2 crashed (its disk's next life) and now holds another entry at 21, which its
        // previous life had already compared: the new life compares its whole log again.
        let mut bad = log();
        bad.insert(21, Entry::new((3, 2), acquire(7, "d")));
        commits(&mut h, 2, 1, 26, &bad, 2000);
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("committed entry 21 changed"), "{m:?}");
    }

    #[test]
    fn accepts_the_same_committed_entries_seen_by_lagging_purged_and_restarted_members() {
        let mut h = valid();
        let log = log();
        commits(&mut h, 1, 0, 24, &log, 1000);
        commits(&mut h, 1, 0, 30, &log, 1010);
        // Node 2 lags, then catches up; a commit index that does not advance changes nothing.
        commits(&mut h, 2, 0, 22, &log, 1020);
        commits(&mut h, 2, 0, 30, &log, 1030);
        commits(&mut h, 2, 0, 30, &log, 1031);
        // Node 3 installed a snapshot up to 25: its log holds only the entries after it.
        let tail: BTreeMap<u64, Entry> = log.range(26..).map(|(&i, e)| (i, e.clone())).collect();
        commits(&mut h, 3, 0, 30, &tail, 1040);
        // Node 2 restarted with a saved commit index behind the one it had reached.
        commits(&mut h, 2, 1, 27, &log, 1050);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
        assert_eq!(h.h.committed.range(20..).count(), 11);
        assert_eq!(h.h.committed[&25].seen_by, 1);
        assert_eq!(h.h.committed[&25].known_at, t(1010));
        assert_eq!(h.h.commit_checked[&2], (1, 27));
        assert_eq!(h.h.commit_checked[&3], (0, 30));
    }

    #[test]
    fn rejects_a_lock_held_after_restart_under_a_released_token() {
        let mut h = valid();
        h.h.final_holders.insert("a".into(), Some((1, 5)));
        let m = messages(&check(&h.h), "durability");
        assert!(
            m.iter()
                .any(|m| m.contains("whose release was acknowledged")),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_a_lock_free_after_restart_whose_holder_never_released_nor_expired() {
        let mut h = valid();
        h.h.final_holders.insert("a".into(), None);
        let m = messages(&check(&h.h), "durability");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("never released"), "{m:?}");
        // A release that was tried but not answered may have taken effect.
        h.op(2, "a", OpKind::Release { token: 8 }, 400, None);
        assert!(check(&h.h).is_empty());
    }
}
