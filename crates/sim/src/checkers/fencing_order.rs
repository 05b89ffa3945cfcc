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
