//! What the clients believed they held fits each lock's mode at every true time: one writer
//! (or mutex holder) alone, readers only beside readers, at most N permit holders of a
//! semaphore of N. A client believed it held a grant from the moment its grant was answered to
//! its last hold check that found it held ([`HistoryData::holds`]); it acted as the holder only
//! in between. Judged by the one sweep the resource's sections are judged by
//! ([`super::no_overlap`]), on these spans instead: the resource's fence refuses a stale
//! holder's write, so a grant the cluster gave beside another shows here, not there.

use std::collections::BTreeMap;

use super::no_overlap::{conflicts, Span};
use super::{ms, Violation};
use crate::history::{HistoryData, Hold};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let holds = h.holds();
    let mut by_lock: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in &holds {
        by_lock.entry(hold.lock.as_str()).or_default().push(hold);
    }
    let mut out = Vec::new();
    for (lock, list) in by_lock {
        let spans: Vec<Span> = list
            .iter()
            .map(|h| Span {
                mode: h.mode,
                begin: h.from,
                end: h.until,
            })
            .collect();
        for (i, j) in conflicts(&spans) {
            let (a, b) = (list[j], list[i]);
            let open = list
                .iter()
                .filter(|o| o.from <= b.from && o.until > b.from)
                .count();
            out.push(Violation {
                checker: "holders",
                message: format!(
                    "lock {lock:?}: {:?} (session {}, {:?}, token {}) held it from {} to {}, and \
                     {:?} (session {}, {:?}, token {}) was granted it at {} (held to {}): {open} \
                     holders at once",
                    a.actor,
                    a.session,
                    a.mode,
                    a.token,
                    ms(a.from),
                    ms(a.until),
                    b.actor,
                    b.session,
                    b.mode,
                    b.token,
                    ms(b.from),
                    ms(b.until),
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use latchkey_core::Mode;

    use super::check;
    use crate::checkers::testkit::{messages, Hist};

    #[test]
    fn accepts_readers_together_and_permits_up_to_n() {
        let mut h = Hist::default();
        h.granted_in(1, "rw", Mode::Shared, 100, 10, 110);
        h.granted_in(2, "rw", Mode::Shared, 100, 10, 120);
        h.hold_check(1, "rw", 10, 300);
        h.hold_check(2, "rw", 10, 310);
        // The writer after both readers' last checks.
        h.granted_in(3, "rw", Mode::Exclusive, 100, 12, 320);
        h.hold_check(3, "rw", 12, 400);
        for c in 1..=2 {
            h.granted_in(c, "sem", Mode::Permits(2), 500, 20 + u64::from(c), 510);
            h.hold_check(c, "sem", 20 + u64::from(c), 600);
        }
        // The third permit only once one of the two is done.
        h.granted_in(3, "sem", Mode::Permits(2), 500, 23, 600);
        h.hold_check(3, "sem", 23, 700);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
    }

    #[test]
    fn rejects_a_reader_beside_a_writer() {
        let mut h = Hist::default();
        h.granted_in(1, "rw", Mode::Exclusive, 100, 10, 110);
        h.hold_check(1, "rw", 10, 300);
        h.granted_in(2, "rw", Mode::Shared, 100, 11, 200);
        h.hold_check(2, "rw", 11, 250);
        let m = messages(&check(&h.h), "holders");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("Exclusive") && m[0].contains("Shared"),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_three_permit_holders_of_two() {
        let mut h = Hist::default();
        for c in 1..=3 {
            let token = 20 + u64::from(c);
            h.granted_in(c, "sem", Mode::Permits(2), 100, token, 100 + u64::from(c));
            h.hold_check(c, "sem", token, 500);
        }
        let m = messages(&check(&h.h), "holders");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("3 holders at once"), "{m:?}");
    }

    #[test]
    fn rejects_two_mutex_holders_at_once_but_not_one_after_the_other() {
        let mut h = Hist::default();
        h.granted_in(1, "a", Mode::Exclusive, 100, 5, 110);
        h.hold_check(1, "a", 5, 200);
        h.granted_in(2, "a", Mode::Exclusive, 100, 7, 200);
        h.hold_check(2, "a", 7, 300);
        assert!(check(&h.h).is_empty());
        h.granted_in(3, "a", Mode::Exclusive, 100, 9, 250);
        h.hold_check(3, "a", 9, 260);
        assert_eq!(messages(&check(&h.h), "holders").len(), 1);
    }
}
