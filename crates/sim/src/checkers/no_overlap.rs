//! No two critical sections the resource accepted overlap, and none lost an update: per lock,
//! the accepted sections (an accepted read, then an accepted write with the same token) are
//! disjoint in time, and their writes count up by one.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{ms, Violation};
use crate::history::{Actor, HistoryData, Step};

#[derive(Debug)]
struct Section {
    actor: Actor,
    token: u64,
    begin: Duration,
    end: Duration,
    read: u64,
    wrote: u64,
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut open: BTreeMap<(Actor, &str, u64), (Duration, u64)> = BTreeMap::new();
    let mut sections: BTreeMap<&str, Vec<Section>> = BTreeMap::new();
    for op in h.resource.iter().filter(|op| op.accepted) {
        let key = (op.actor, op.lock.as_str(), op.token);
        match op.step {
            Step::Begin { read } => {
                open.insert(key, (op.at, read));
            }
            Step::Commit { wrote } => {
                if let Some((begin, read)) = open.remove(&key) {
                    sections.entry(op.lock.as_str()).or_default().push(Section {
                        actor: op.actor,
                        token: op.token,
                        begin,
                        end: op.at,
                        read,
                        wrote,
                    });
                }
            }
        }
    }
    let mut out = Vec::new();
    for (lock, list) in &sections {
        // In commit order (the resource log is in execution order).
        for pair in list.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.begin < a.end {
                out.push(Violation {
                    checker: "no_overlap",
                    message: format!(
                        "lock {lock:?}: section of {:?} (token {}, {}..{}) overlaps the section of \
                         {:?} (token {}, {}..{})",
                        a.actor,
                        a.token,
                        ms(a.begin),
                        ms(a.end),
                        b.actor,
                        b.token,
                        ms(b.begin),
                        ms(b.end)
                    ),
                });
            }
            if b.read != a.wrote {
                out.push(Violation {
                    checker: "no_overlap",
                    message: format!(
                        "lock {lock:?}: lost update: {:?} (token {}) read {} but the previous \
                         accepted write (token {}) was {}",
                        b.actor, b.token, b.read, a.token, a.wrote
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::checkers::testkit::{messages, Hist};
    use crate::history::Step;

    #[test]
    fn accepts_disjoint_sections_that_count_up() {
        let mut h = Hist::default();
        h.section(1, "a", 5, 100, 150, 0);
        h.section(2, "a", 7, 150, 180, 1);
        // A rejected write does not make a section.
        h.resource(1, "a", 5, 170, Step::Commit { wrote: 1 }, false);
        h.section(3, "a", 9, 200, 260, 2);
        // Another lock, at the same time, is independent.
        h.section(1, "b", 6, 100, 300, 0);
        assert!(check(&h.h).is_empty());
    }

    #[test]
    fn rejects_two_accepted_sections_that_overlap() {
        let mut h = Hist::default();
        // B reads 1 while A's section is open, then both commit.
        h.section(0, "a", 3, 10, 20, 0);
        h.resource(1, "a", 5, 100, Step::Begin { read: 1 }, true);
        h.resource(2, "a", 7, 120, Step::Begin { read: 1 }, true);
        h.resource(1, "a", 5, 130, Step::Commit { wrote: 2 }, true);
        h.resource(2, "a", 7, 140, Step::Commit { wrote: 2 }, true);
        let m = messages(&check(&h.h), "no_overlap");
        assert!(m.iter().any(|m| m.contains("overlaps")), "{m:?}");
    }

    #[test]
    fn rejects_overlap_with_a_section_that_is_not_the_previous_one() {
        let mut h = Hist::default();
        // A long section of client 1 with two short ones inside it: in commit order it comes
        // last, next to the second short one only.
        h.resource(1, "a", 5, 100, Step::Begin { read: 0 }, true);
        h.section(2, "a", 7, 110, 120, 0);
        h.section(3, "a", 9, 130, 140, 1);
        h.resource(1, "a", 5, 150, Step::Commit { wrote: 1 }, true);
        let m = messages(&check(&h.h), "no_overlap");
        assert!(m.iter().any(|m| m.contains("overlaps")), "{m:?}");
    }

    #[test]
    fn rejects_a_lost_update_between_disjoint_sections() {
        let mut h = Hist::default();
        h.section(1, "a", 5, 100, 110, 0);
        // Reads 0 again: A's accepted write was lost.
        h.section(2, "a", 7, 200, 210, 0);
        let m = messages(&check(&h.h), "no_overlap");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("lost update"), "{m:?}");
    }
}
