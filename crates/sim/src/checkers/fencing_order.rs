//! Tokens order the holders: the resource never accepts a token lower than one it already
//! accepted for that lock ([`check`]), and a grant asked for after another grant of the lock
//! was answered has the higher token ([`check_grants`]): each new writer's token is above
//! every earlier grant's (readers', permits', writers'), and so is each later reader's and
//! permit's, so a resource can fence writers against late readers and the reverse.

use std::collections::BTreeMap;

use super::{ms, Violation};
use crate::history::{HistoryData, OpKind, Operation, Ret};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let modes = super::no_overlap::grant_modes(h);
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    // Per semaphore, the tokens accepted so far: N permit holders hold together in any order,
    // so a permit's token is stale only once N higher ones were accepted (the gate in
    // `resource.rs`).
    let mut permits: BTreeMap<&str, std::collections::BTreeSet<u64>> = BTreeMap::new();
    let mut out = Vec::new();
    for op in h.resource.iter().filter(|op| op.accepted) {
        let mode = modes.get(&(op.actor, op.lock.as_str(), op.token));
        if let Some(&latchkey_core::Mode::Permits(n)) = mode {
            let seen = permits.entry(op.lock.as_str()).or_default();
            let above = seen.range(op.token + 1..).count();
            if above >= n as usize {
                out.push(Violation {
                    checker: "fencing_order",
                    message: format!(
                        "at {} the resource accepted permit token {} of {n} for lock {:?} from \
                         {:?} after {above} higher tokens",
                        ms(op.at),
                        op.token,
                        op.lock,
                        op.actor,
                    ),
                });
            }
            seen.insert(op.token);
            continue;
        }
        let top = highest.entry(op.lock.as_str()).or_insert(0);
        if op.token < *top {
            out.push(Violation {
                checker: "fencing_order",
                message: format!(
                    "at {} the resource accepted token {} for lock {:?} from {:?} after token {}",
                    ms(op.at),
                    op.token,
                    op.lock,
                    op.actor,
                    top
                ),
            });
        }
        *top = (*top).max(op.token);
    }
    out
}

/// Per lock, every acknowledged grant whose acquire was invoked after another grant of the
/// lock was answered has a token above that one's. (Readers granted together share a token,
/// but neither was asked for after the other was answered.)
pub fn check_grants(h: &HistoryData) -> Vec<Violation> {
    let ops = h.operations();
    let mut by_lock: BTreeMap<&str, Vec<(&Operation, u64, std::time::Duration)>> = BTreeMap::new();
    for op in &ops {
        if let (OpKind::Acquire, Some((Ret::Granted { token }, at))) = (&op.op, &op.ret) {
            by_lock
                .entry(op.lock.as_str())
                .or_default()
                .push((op, *token, *at));
        }
    }
    let mut out = Vec::new();
    for (lock, grants) in by_lock {
        let mut answered: Vec<usize> = (0..grants.len()).collect();
        answered.sort_by_key(|&i| grants[i].2);
        let mut asked: Vec<usize> = (0..grants.len()).collect();
        asked.sort_by_key(|&i| grants[i].0.invoked);
        // The highest token answered so far, as `asked` moves on in time.
        let (mut next, mut top): (usize, Option<usize>) = (0, None);
        for &b in &asked {
            let (op, token, at) = grants[b];
            while next < answered.len() && grants[answered[next]].2 < op.invoked {
                let a = answered[next];
                if top.is_none_or(|t| grants[a].1 > grants[t].1) {
                    top = Some(a);
                }
                next += 1;
            }
            let Some(a) = top.filter(|&a| grants[a].1 >= token) else {
                continue;
            };
            let (earlier, earlier_token, earlier_at) = grants[a];
            out.push(Violation {
                checker: "fencing_order",
                message: format!(
                    "lock {lock:?}: {:?} (session {}, {:?}) asked at {} and was granted token \
                     {token} at {}, not above token {earlier_token} of {:?} (session {}, {:?}), \
                     answered before it asked, at {}",
                    op.actor,
                    op.session,
                    op.mode,
                    ms(op.invoked),
                    ms(at),
                    earlier.actor,
                    earlier.session,
                    earlier.mode,
                    ms(earlier_at),
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use latchkey_core::Mode;

    use super::{check, check_grants};
    use crate::checkers::testkit::{messages, Hist};
    use crate::history::Step;

    #[test]
    fn accepts_tokens_that_never_decrease_per_lock() {
        let mut h = Hist::default();
        h.section(1, "a", 5, 100, 110, 0);
        h.section(2, "a", 7, 200, 210, 1);
        // A stale holder's write that the resource rejected is no violation.
        h.resource(1, "a", 5, 220, Step::Commit { wrote: 9 }, false);
        // Another lock has its own order.
        h.section(1, "b", 3, 230, 240, 0);
        assert!(check(&h.h).is_empty());
    }

    #[test]
    fn accepts_grants_asked_after_others_with_higher_tokens_and_readers_sharing_one() {
        let mut h = Hist::default();
        h.granted_in(1, "rw", Mode::Shared, 100, 10, 110);
        // Granted together with reader 1, asked before its answer.
        h.granted_in(2, "rw", Mode::Shared, 105, 10, 110);
        h.granted_in(3, "rw", Mode::Exclusive, 120, 12, 200);
        h.granted_in(1, "rw", Mode::Shared, 210, 13, 220);
        assert!(check_grants(&h.h).is_empty(), "{:?}", check_grants(&h.h));
    }

    #[test]
    fn rejects_a_writer_whose_token_is_not_above_an_earlier_readers() {
        let mut h = Hist::default();
        h.granted_in(1, "rw", Mode::Shared, 100, 10, 110);
        h.granted_in(3, "rw", Mode::Exclusive, 120, 10, 200);
        let m = messages(&check_grants(&h.h), "fencing_order");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("Exclusive") && m[0].contains("not above token 10"),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_token_5_accepted_after_7() {
        let mut h = Hist::default();
        h.section(2, "a", 7, 100, 110, 0);
        h.resource(1, "a", 5, 120, Step::Commit { wrote: 2 }, true);
        let m = messages(&check(&h.h), "fencing_order");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("token 5") && m[0].contains("after token 7"),
            "{m:?}"
        );
    }
}
