//! The resource never accepts a token lower than one it already accepted for that lock.

use std::collections::BTreeMap;

use super::{ms, Violation};
use crate::history::HistoryData;

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for op in h.resource.iter().filter(|op| op.accepted) {
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

#[cfg(test)]
mod tests {
    use super::check;
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
