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
