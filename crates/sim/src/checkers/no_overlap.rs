//! No two critical sections the resource accepted conflict, and none lost an update: per lock,
//! the accepted sections (an accepted read, then an accepted write with the same token) fit
//! the lock's mode at every true time (a writer's or a mutex holder's alone, readers' only
//! beside readers, at most N permit holders' of a semaphore of N), and the writes count up by
//! one: a writer read what the previous accepted write wrote, and a reader read the same value
//! at its end as at its start.
//!
//! The same rule judges the clients' own beliefs (`holders.rs`): [`conflicts`] is the one
//! sweep over spans of time, each with its holder's mode.

use std::collections::BTreeMap;
use std::time::Duration;

use latchkey_core::Mode;

use super::{ms, Violation};
use crate::history::{Actor, HistoryData, Step};

#[derive(Debug)]
struct Section {
    actor: Actor,
    token: u64,
    mode: Mode,
    begin: Duration,
    end: Duration,
    read: u64,
    wrote: u64,
}

/// A span of true time during which a holder in `mode` acted on a lock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub mode: Mode,
    pub begin: Duration,
    pub end: Duration,
}

/// Each span that began while spans it cannot hold beside were open, with the one it conflicts
/// with (the first such, in `spans`' order): `(later, earlier)`, as indexes into `spans`.
/// Spans that only touch (one ends as the other begins) do not conflict. A writer conflicts
/// with any other holder, a reader with a writer, a permit of N with N others open, and modes
/// of two kinds (a lock's and a semaphore's) with each other.
pub(super) fn conflicts(spans: &[Span]) -> Vec<(usize, usize)> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].begin, i));
    let mut open: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    for i in order {
        let s = spans[i];
        open.retain(|&j| spans[j].end > s.begin);
        let clash = |j: &usize| {
            !matches!(
                (s.mode, spans[*j].mode),
                (Mode::Shared, Mode::Shared) | (Mode::Permits(_), Mode::Permits(_))
            )
        };
        let with = match s.mode {
            Mode::Permits(n) if open.len() >= n as usize => open.first().copied(),
            _ => open.iter().find(|j| clash(j)).copied(),
        };
        if let Some(j) = with.or_else(|| open.iter().find(|j| clash(j)).copied()) {
            out.push((i, j));
        }
        open.push(i);
    }
    out
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let modes = grant_modes(h);
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
                    let mode = (modes.get(&(op.actor, op.lock.as_str(), op.token)).copied())
                        .unwrap_or(Mode::Exclusive);
                    sections.entry(op.lock.as_str()).or_default().push(Section {
                        actor: op.actor,
                        token: op.token,
                        mode,
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
        let spans: Vec<Span> = list
            .iter()
            .map(|s| Span {
                mode: s.mode,
                begin: s.begin,
                end: s.end,
            })
            .collect();
        for (i, j) in conflicts(&spans) {
            let (a, b) = (&list[j], &list[i]);
            out.push(Violation {
                checker: "no_overlap",
                message: format!(
                    "lock {lock:?}: section of {:?} ({:?}, token {}, {}..{}) overlaps the section \
                     of {:?} ({:?}, token {}, {}..{})",
                    a.actor,
                    a.mode,
                    a.token,
                    ms(a.begin),
                    ms(a.end),
                    b.actor,
                    b.mode,
                    b.token,
                    ms(b.begin),
                    ms(b.end)
                ),
            });
        }
        // The values: writers in commit order count up by one; a reader saw no write.
        let mut last_write: Option<&Section> = None;
        for s in list {
            match s.mode {
                Mode::Exclusive => {
                    if let Some(a) = last_write.filter(|a| s.read != a.wrote) {
                        out.push(Violation {
                            checker: "no_overlap",
                            message: format!(
                                "lock {lock:?}: lost update: {:?} (token {}) read {} but the \
                                 previous accepted write (token {}) was {}",
                                s.actor, s.token, s.read, a.token, a.wrote
                            ),
                        });
                    }
                    last_write = Some(s);
                }
                Mode::Shared if s.read != s.wrote => out.push(Violation {
                    checker: "no_overlap",
                    message: format!(
                        "lock {lock:?}: reader {:?} (token {}) read {} at {} and {} at {}: a \
                         write landed during its read",
                        s.actor,
                        s.token,
                        s.read,
                        ms(s.begin),
                        s.wrote,
                        ms(s.end)
                    ),
                }),
                Mode::Shared | Mode::Permits(_) => {}
            }
        }
    }
    out
}

/// The mode of every acknowledged grant, by `(actor, lock, token)`: what a resource operation
/// under that token was allowed to do. Grants not here (a history without modes) are
/// exclusive.
pub(super) fn grant_modes(h: &HistoryData) -> BTreeMap<(Actor, &str, u64), Mode> {
    let mut out = BTreeMap::new();
    let names: BTreeMap<u64, (&str, Actor)> = h
        .events
        .iter()
        .filter_map(|e| match e {
            crate::history::Event::Invoke {
                id, lock, actor, ..
            } if h.modes.contains_key(id) => Some((*id, (lock.as_str(), *actor))),
            _ => None,
        })
        .collect();
    for e in &h.events {
        if let crate::history::Event::Return {
            id,
            ret: crate::history::Ret::Granted { token },
            ..
        } = e
        {
            if let Some(&(lock, actor)) = names.get(id) {
                out.insert((actor, lock, *token), h.modes[id]);
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
